"""The API-server side: send control requests to engine ranks and get every answer back.

::

    async with ControlClient(transport, ranks=4) as client:
        info = await client.call("get_server_info", rank=0, timeout=2.0)
        res = await client.fan_out("pause", {"mode": "drain"})   # all 4 ranks

Guarantees:

* **Register before send.** Every request is in the request map before its
  first frame is handed to the transport; a reply that arrives before the
  caller reaches its wait completes the call at once.
* **Exactly one outcome per call, by its deadline.** A value, or one of
  :class:`~ctlwire.kernel.errors.RemoteError` (the engine's exception: class
  name, message, code; a builtin's class too), :class:`~ctlwire.kernel.errors.EngineDead`
  (the rank was lost: raised as soon as liveness says so, not at the timeout),
  :class:`~ctlwire.kernel.errors.RequestTimedOut`, :class:`~ctlwire.kernel.errors.FanOutFailed`,
  :class:`~ctlwire.kernel.errors.ClientClosed`.
* **Nothing left behind.** Whatever ends a call — outcome, timeout, exception
  or cancellation at any await — its entry is cleaned before the call returns;
  late and duplicate replies are dropped and counted.
* **Deadline travels.** The envelope carries the wall-clock deadline so an
  engine can skip work whose caller has given up. A timeout does not cancel
  remote work: delivery is at most once.
* **Busy is not dead.** A rank that is busy (or stalled past its method's stall limit) stays alive
  and its calls wait for their own deadlines; only a rank that stops heartbeating or disconnects is
  Lost. A stall of this client's own loop is not counted against engines.
* **Failures say whether the work ran.** :class:`~ctlwire.kernel.errors.NotDelivered` (never handed
  to the transport: a retry is safe) or :class:`~ctlwire.kernel.errors.OutcomeUnknown` (handed
  over, then the rank was lost: it may have run). ``retry=`` retries the first kind always, the
  second only with an idempotency key or for a method declared idempotent.
* **Ranks come and go** (:meth:`add_rank`, :meth:`remove_rank`, :meth:`apply_membership`). A
  fan-out without ``ranks`` goes to the *admissible* ranks (present, admitted, not in
  :attr:`quarantine`, meeting ``admission_condition``); its result's ``left_out`` says which
  present ranks were not and why, counted against its ``ok``. Removing a rank fails its pending
  calls (NotDelivered or OutcomeUnknown); a fan-out already started or queued keeps its ranks (a
  removed one fails NotDelivered, unsent), the mailboxes' FIFO order too.
* **Fan-out admission** (:class:`~ctlwire.kernel.client.fan_out_mailbox.FanOutMailbox`):
  ``queueing``: first come, first served, one in flight (``pipeline``: k); ``watching``: shared.

One client runs in one event loop thread, its tasks in its ``async with`` block. Its parts: the
ranks (:class:`~ctlwire.kernel.client.rank_roster.RankRoster`), the calls' IO
(:class:`~ctlwire.kernel.client.call_issuer.CallIssuer`), the receive loop and the liveness
monitor.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal

import anyio
from anyio.abc import TaskGroup

from ctlwire.kernel.client.call_arguments import check_method, checked_timeout
from ctlwire.kernel.client.call_issuer import CallIssuer
from ctlwire.kernel.client.fan_out_mailbox import FanOutMailbox, FanOutMailboxes, FanOutMode
from ctlwire.kernel.client.liveness_monitor import LivenessMonitor
from ctlwire.kernel.client.progress_callbacks import ProgressCallback
from ctlwire.kernel.client.rank_roster import RankRoster, leave_out
from ctlwire.kernel.client.retry_policy import RetryPolicy, merge_retried
from ctlwire.kernel.core.fan_out_policy import MethodKinds, Policy
from ctlwire.kernel.core.fan_out_result import FanOutResult
from ctlwire.kernel.core.fencing import new_fence
from ctlwire.kernel.core.membership import MembershipChange, MembershipEvent
from ctlwire.kernel.core.request_registry import RequestRegistry, TransitionObserver
from ctlwire.kernel.engine.builtin_methods import BUILTIN_METHODS, ENGINE_METRICS_METHOD
from ctlwire.kernel.errors import (
    EngineDead,
    FanOutFailed,
    RemoteError,
    RequestTimedOut,
    ResultTypeError,
    allowed_exceptions,
)
from ctlwire.kernel.observability.tracing import TraceProvider
from ctlwire.kernel.primitives.coalescer import Joins
from ctlwire.transports.transport import ClientTransport

__all__ = ["ControlClient", "ResultTypeError"]

_POLICIES = {p.value: p for p in Policy}
_COUNTERS = ("dropped_malformed", "dropped_oversized", "dropped_framing", "dropped_wrong_type",
             "stale_incarnation", "heartbeats_sent", "heartbeats_received", "engine_lost",
             "engine_restarted", "engine_stalled", "client_stalls", "retries")


class ControlClient:
    """Sends control requests over a :class:`ClientTransport`, with the guarantees above.

    ``ranks`` is the number of engine ranks (``0..n-1``) or their ids (none, for
    a client whose ranks come from a membership backend such as
    :class:`~ctlwire.kernel.membership.etcd_membership.EtcdMembership`).
    ``default_timeout`` applies to methods without an entry in
    ``method_timeouts``; a call's ``timeout=`` overrides both.
    ``heartbeat_interval=None`` disables time-based liveness (transport-reported
    disconnections still fail pending requests). ``observer`` is called on every
    request transition (more can be appended to ``registry.observers``);
    ``trace_provider`` supplies each envelope's trace carrier
    (:mod:`ctlwire.kernel.observability.tracing`).
    ``incarnation_window``: an engine incarnation claiming to be minted more than
    this many seconds ahead of this host's clock is refused (counted in
    ``implausible_incarnation``); it bounds how long a forged incarnation can
    fence a rank, and how far ahead an engine host's clock may run.
    ``admission_condition(rank) -> bool``: a fleet condition an admitted rank must
    also meet to be routed to by default (for example that its last reported
    weight version is the current one); ``admit_on_join=True`` admits ranks that
    join (:meth:`add_rank`) at once instead of waiting for :meth:`admit`.
    ``remote_exceptions``: an engine's error of these classes (None: the builtins')
    is raised as that class and RemoteError in one.
    ``pipeline``: method -> its queueing fan-outs in flight at once, in admission order
    (default 1; :mod:`~ctlwire.kernel.client.fan_out_mailbox`); ValueError unless an int >= 1.
    """

    def __init__(
        self,
        transport: ClientTransport,
        *,
        ranks: int | Sequence[int],
        default_timeout: float = 30.0,
        method_timeouts: Mapping[str, float] | None = None,
        heartbeat_interval: float | None = 0.25,
        heartbeat_misses: int = 4,
        max_tombstones: int = 10_000,
        observer: TransitionObserver | None = None,
        trace_provider: TraceProvider | None = None,
        stall_limit: float = 300.0,
        stall_limits: Mapping[str, float] | None = None,
        idempotent_methods: Collection[str] = (),
        fence: int | bool = False,
        incarnation_window: float = 60.0,
        admission_condition: Callable[[int], bool] | None = None,
        admit_on_join: bool = False,
        remote_exceptions: Collection[type[Exception]] | None = None,
        pipeline: Mapping[str, int] | None = None,
    ) -> None:
        if not isinstance(transport, ClientTransport):
            raise TypeError(f"{type(transport).__name__} is not a ClientTransport (send_nowait(), "
                            "send() and receive())")
        self.transport = transport
        self.codec = transport.codec
        initial = tuple(range(ranks)) if isinstance(ranks, int) else tuple(ranks)
        self.default_timeout = checked_timeout(default_timeout, "default_timeout")
        self.method_timeouts = {m: checked_timeout(t, f"method_timeouts[{m!r}]")
                                for m, t in (method_timeouts or {}).items()}
        self.registry = RequestRegistry(max_tombstones=max_tombstones, observer=observer)
        self.heartbeat_interval = heartbeat_interval
        self.idempotent_methods = frozenset(idempotent_methods)
        self._key_seq = itertools.count(1)
        #: read-only methods: a fan-out's default mode follows the kind (fan_out_policy)
        self.method_kinds = MethodKinds(BUILTIN_METHODS)
        self._tg: TaskGroup | None = None
        self._closed = False
        #: rank -> the engine metrics last read with :meth:`engine_metrics`
        self.last_engine_metrics: dict[int, dict[str, Any]] = {}
        self.counters: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        #: heartbeats, the peer table (:attr:`peers`) and the loss of ranks
        self.liveness = LivenessMonitor(transport, initial, interval=heartbeat_interval,
                                        misses_allowed=heartbeat_misses,
                                        fail_rank=self._fail_rank, counters=self.counters,
                                        stall_limit=stall_limit, stall_limits=stall_limits,
                                        incarnation_window=incarnation_window)
        self.peers = self.liveness.peers
        #: which failures a ``retry=`` may send again, and the wait before it
        self.retry_policy = RetryPolicy(self.liveness, self.counters,
                                        idempotent_methods=self.idempotent_methods,
                                        heartbeat_interval=heartbeat_interval,
                                        closed=lambda: self._closed)
        #: the IO of every call: register, send, wait, decode (the mailboxes' FanOutSender)
        self.issuer = CallIssuer(
            transport, self.registry, self.liveness, self.counters, self.aclose,
            trace_provider=trace_provider,
            # a fencing token for every request: engines refuse tokens older than the
            # highest they accepted, so a replaced controller cannot act after its successor
            fence=new_fence() if fence is True else int(fence) if fence else 0,
            first_contact_retry=heartbeat_interval or 0.25,
            exceptions=allowed_exceptions(remote_exceptions))
        self.progress_callbacks = self.issuer.progress_callbacks  # of the calls in flight
        self.mailboxes = FanOutMailboxes(self.issuer, pipeline)
        #: the ranks: present, alive, admissible, and their changes at run time
        self.roster = RankRoster(initial, transport, self.liveness, self._fail_rank,
                                    admission_condition=admission_condition,
                                    admit_on_join=admit_on_join)
        #: the present ranks (static: ``ranks``), their registrations and admission
        self.membership = self.roster.membership
        #: ranks out of routing (shared by every OperationRunner over this client):
        #: a fan-out without explicit ``ranks`` leaves them out
        self.quarantine = self.roster.quarantine
        #: the receive loop: each frame to the request map or the peer table
        self.receiver = self.issuer.receiver

    @property
    def ranks(self) -> tuple[int, ...]:
        """The present ranks."""
        return self.roster.ranks

    @property
    def admission_condition(self) -> Callable[[int], bool] | None:
        """A fleet condition an admitted rank must meet to be routed to by default."""
        return self.roster.admission_condition

    @admission_condition.setter
    def admission_condition(self, value: Callable[[int], bool] | None) -> None:
        self.roster.admission_condition = value

    @property
    def fence(self) -> int:
        """This client's fencing token (0: none), sent with every request that sets none."""
        return self.issuer.fence

    @fence.setter
    def fence(self, value: int) -> None:
        self.issuer.fence = value

    @property
    def trace_provider(self) -> TraceProvider | None:
        """Supplies each request's trace carrier (:mod:`ctlwire.kernel.observability.tracing`)."""
        return self.issuer.trace_provider

    @trace_provider.setter
    def trace_provider(self, value: TraceProvider | None) -> None:
        self.issuer.trace_provider = value

    # -- lifetime ------------------------------------------------------------
    async def __aenter__(self) -> ControlClient:
        if self._tg is not None or self._closed:
            raise RuntimeError("a ControlClient can be entered once")
        await self.transport.__aenter__()
        self.liveness.now = self.issuer.bind_loop()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self.receiver.run, name="ctlwire.client.receive")
        tg.start_soon(self.issuer.reaper.run, self.issuer.now, name="ctlwire.client.deadlines")
        if self.heartbeat_interval:
            tg.start_soon(self.liveness.run, self.registry.incarnation,
                          name="ctlwire.client.liveness")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        await self.aclose()
        tg, self._tg = self._tg, None
        try:
            if tg is not None:
                tg.cancel_scope.cancel()
                # the body's exception propagates as itself, not wrapped in a group
                await tg.__aexit__(None, None, None)
        finally:
            # the transport's own task group was entered before ours: exit it last,
            # in this same scope (no shield around it, or the scopes would not nest)
            await self.transport.__aexit__(exc_type, exc, tb)
        return None

    async def aclose(self) -> None:
        """End every call with ClientClosed, now; further calls raise it.

        That covers calls in flight (their request fails, a send blocked at the
        high-water mark is abandoned), fan-out callers still queued for
        admission (whatever their timeout, ``inf`` included), watchers of a
        shared request and calls waiting for a rank's first contact.
        """
        if self._closed:
            return
        self._closed = True
        self.issuer.close()
        self.mailboxes.close()
        self.liveness.close()  # first-contact waits and wait_ready() re-check

    @property
    def closed(self) -> bool:
        return self._closed

    def rank_status(self, rank: int) -> dict[str, Any]:
        """What this client knows of ``rank``
        (:meth:`~ctlwire.kernel.client.rank_roster.RankRoster.status`)."""
        return self.roster.status(rank)

    # -- membership --------------------------------------------------------------
    def apply_membership(self, event: MembershipEvent) -> MembershipChange | None:
        """Apply one membership event (from a backend or the caller) and carry its
        change out (:meth:`~ctlwire.kernel.client.rank_roster.RankRoster.apply`)."""
        return self.roster.apply(event)

    def add_rank(self, rank: int, address: str = "", *, incarnation: int = 0,
                 revision: int = 0) -> MembershipChange | None:
        """Add (or update) ``rank`` at run time; see :meth:`apply_membership`."""
        return self.apply_membership(
            MembershipEvent("add", rank, address, incarnation, revision))

    def remove_rank(self, rank: int, *, revision: int = 0) -> MembershipChange | None:
        """Remove ``rank`` at run time; see :meth:`apply_membership`."""
        return self.apply_membership(MembershipEvent("remove", rank, revision=revision))

    def admit(self, rank: int) -> bool:
        """Route to present ``rank`` by default from now on (say, once an operation
        brought it to the fleet's weight version). It still must not be
        quarantined and must meet ``admission_condition``. True when it was not
        admitted; ValueError when it is not present."""
        return self.roster.admit(rank)

    def routable_ranks(self) -> tuple[tuple[int, ...], dict[int, str]]:
        """The ranks a fan-out without ``ranks`` goes to, and the present ranks it
        leaves out with why (a :data:`~ctlwire.kernel.core.fan_out_result.LeftOutReason`)."""
        return self.roster.routable()

    def knows_rank(self, rank: int) -> bool:
        """``rank`` is present, or was and was removed (calls naming it fail typed)."""
        return self.roster.knows(rank)

    # -- public calls ----------------------------------------------------------
    def timeout_for(self, method: str, timeout: float | None = None) -> float:
        """The budget of a call: ``timeout``, else the method's, else the default.

        A timeout is a positive number of seconds (``math.inf`` for none).
        Raises TypeError for a non-number and ValueError for zero, a negative
        number or NaN, before anything is registered or sent.
        """
        if timeout is not None:
            return checked_timeout(timeout)
        return self.method_timeouts.get(method, self.default_timeout)

    def new_idempotency_key(self) -> str:
        """A key no other call of any client uses (this client's incarnation and a counter)."""
        return f"{self.registry.incarnation:x}-{next(self._key_seq)}"

    async def call(self, method: str, payload: Any = None, *, rank: int | None = None,
                   timeout: float | None = None, result_type: Any = Any,
                   idempotency_key: str | None = None, fence: int | None = None,
                   retry: int = 0, on_progress: ProgressCallback | None = None) -> Any:
        """Send ``method(payload)`` to one rank and return its decoded result.

        ``idempotency_key``: the engine runs a request with a key it has already
        run only once and answers a repeat with the first outcome (``""``: a
        fresh key). ``fence``: this request's fencing token (default: the
        client's). ``retry``: how many more attempts after a failure that is
        safe to retry (NotDelivered; OutcomeUnknown with a key or for an
        ``idempotent_methods`` method), all within the one ``timeout``.
        ``on_progress(rank, progress)`` is called with what the rank's
        heartbeats say about this request while it runs.

        Raises RemoteError, NotDelivered or OutcomeUnknown (both EngineDead),
        RequestTimedOut, ClientClosed, or ResultTypeError when the result does
        not match ``result_type``.

        Raises before anything is sent: TypeError/ValueError for a bad
        ``timeout`` or ``method``, RequestTooLarge when the envelope would
        exceed the codec's size limit, and the caller's own cancellation when
        its scope is already cancelled (nothing is ever sent on behalf of a
        cancelled caller).

        A rank that has never been heard from (an engine still starting) is
        waited for within the call's deadline; a rank that was connected and
        is lost, or was removed from the membership, fails at once with
        NotDelivered (ValueError: a rank this client never had).
        """
        if type(method) is not str or not method:
            check_method(method)  # raises
        if rank is None:
            if not self.ranks:
                raise ValueError("this client has no ranks (yet): name one")
            rank = self.ranks[0]
        elif rank not in self.roster.rank_set:
            self.roster.check(rank)  # a removed rank passes; an unknown one raises
        budget = self.timeout_for(method, timeout)
        raw = self.issuer.encode_payload(payload, method)
        key = self.new_idempotency_key() if idempotency_key == "" else (idempotency_key or "")
        deadline, wall_deadline = self.issuer.now() + budget, self.issuer.wall_clock() + budget
        while True:
            try:
                return await self.issuer.issue(
                    method, raw, (rank,), Policy.ALL, budget, deadline, result_type, key, fence,
                    on_progress=on_progress, wall_deadline=wall_deadline, one_rank=True)
            except (EngineDead, RemoteError) as exc:
                if retry <= 0 or not self.retry_policy.retryable(exc, method, key):
                    raise
                retry -= 1
                if not await self.retry_policy.before_retry((rank,), deadline):
                    raise

    async def fan_out(
        self, method: str, payload: Any = None, *,
        ranks: Sequence[int] | Literal["admissible"] | None = None,
        timeout: float | None = None, mode: FanOutMode | None = None,
        policy: Literal["all", "quorum", "first"] | Policy = "all", result_type: Any = Any,
        idempotency_key: str | None = None, fence: int | None = None, retry: int = 0,
        on_progress: ProgressCallback | None = None, joins: Joins = "identical",
    ) -> FanOutResult:
        """Send ``method(payload)`` to every rank in ``ranks`` (default: the
        admissible ranks; a quarantined rank is reached only by naming it).

        Returns a :class:`FanOutResult` with each rank's result or typed error
        once ``policy`` is met, the present ranks it left out counted against ``ok``
        (unless ``ranks="admissible"``). Raises FanOutFailed when it cannot be
        met, RequestTimedOut (with ``partial``) at the deadline, ClientClosed.
        ``mode``: ``queueing`` (FIFO, ``pipeline`` depth in flight per method), ``watching``
        (join a request in flight: ``joins="identical"``, the same payload, ranks
        and policy; ``"any"``, whichever this method has in flight; the result's
        ``joined`` says whether it joined) or ``concurrent`` (no admission);
        by default ``watching`` for a read-only method, else ``queueing``
        (:attr:`method_kinds`). ``idempotency_key``, ``fence``, ``on_progress`` as for :meth:`call`;
        ``retry`` re-sends to the ranks whose failure is safe to retry (and
        only to them), within the one ``timeout``, and merges their outcomes.
        Argument errors, size errors, cancellation and first contact as for
        :meth:`call`. Policy ``"all"`` returns normally even when every rank
        answered with an error (judge it by ``ok``); FanOutFailed means ranks
        could not answer at all (lost, unreachable)."""
        check_method(method)
        pol = _POLICIES.get(policy) if type(policy) is str else None
        if pol is None:
            pol = policy if isinstance(policy, Policy) else Policy(policy)
        targets, left_out = self.roster.targets(method, ranks)
        counted = None if ranks == "admissible" else left_out or None
        budget = self.timeout_for(method, timeout)
        issuer = self.issuer
        raw = issuer.encode_payload(payload, method)
        key = self.new_idempotency_key() if idempotency_key == "" else (idempotency_key or "")
        if mode is None:
            mode = self.method_kinds.default_mode(method)
        box = self.mailboxes.for_mode(mode, method)  # None: concurrent
        watch = box.watching if box is not None and mode == "watching" else None
        gate = box.gate if box is not None else None
        if (by_method := on_progress if watch is not None else None) is not None:
            self.progress_callbacks.add_method(method, by_method)
        deadline = issuer.now() + budget
        result: FanOutResult | None = None
        try:
            while True:
                try:
                    more = await (watch(raw, targets, pol, budget, deadline, result_type, key,
                                        fence, joins, counted) if watch is not None
                                   else issuer.issue(
                        method, raw, targets, pol, budget, deadline, result_type, key, fence,
                        gate=gate, on_progress=on_progress, left_out=counted))
                    error = None
                except FanOutFailed as exc:
                    more, error = exc.result, exc
                counted = None  # a retry's request addresses only ranks that failed
                if result is None:
                    result, failed = more, error
                else:  # a retry: its ranks' outcomes replace their failures
                    failed = merge_retried(result, targets, more, method, pol)
                if retry <= 0 or pol is not Policy.ALL:
                    break
                targets = tuple(r for r, e in sorted(result.errors.items())
                                if self.retry_policy.retryable(e, method, key))
                if not targets or not await self.retry_policy.before_retry(targets, deadline):
                    break
                retry -= 1
                budget = deadline - issuer.now()
            if left_out:
                leave_out(result, left_out, ranks == "admissible")
            if failed is not None:
                raise failed
            return result
        except RequestTimedOut as exc:
            if left_out and exc.partial is not None:
                leave_out(exc.partial, left_out, ranks == "admissible")
            raise
        finally:
            if by_method is not None:
                self.progress_callbacks.remove_method(method, by_method)

    def mailbox(self, method: str) -> FanOutMailbox:
        """The fan-out mailbox of ``method`` (created on first use)."""
        return self.mailboxes.get(method)

    async def wait_ready(self, ranks: Sequence[int] | None = None, timeout: float = 10.0) -> None:
        """Wait until every rank in ``ranks`` (default: all) has been heard from.

        Raises RequestTimedOut naming the ranks still missing, ClientClosed
        when the client closes meanwhile.
        """
        await self.liveness.wait_ready(tuple(ranks) if ranks is not None else self.ranks,
                                       timeout)

    def _fail_rank(self, rank: int, detail: str) -> None:  # the liveness monitor lost it
        self.issuer.fail_rank(rank, detail)

    # -- observability ---------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        """This client's metrics (the client side of the one metrics shape, see
        :func:`ctlwire.kernel.observability.metrics.client_metrics` and the README's table)."""
        from ctlwire.kernel.observability.metrics import client_metrics

        return client_metrics(self)

    async def engine_metrics(self, rank: int, *, timeout: float | None = None
                             ) -> dict[str, Any]:
        """Engine ``rank``'s metrics, read through the built-in, read-only
        ``ctlwire.metrics`` method every :class:`EngineEndpoint` serves. The
        answer is also kept in :attr:`last_engine_metrics` (what
        :func:`ctlwire.kernel.observability.metrics.snapshot` and the Prometheus exporter show)."""
        result: dict[str, Any] = await self.call(ENGINE_METRICS_METHOD, rank=rank,
                                                 timeout=timeout)
        self.last_engine_metrics[rank] = result
        return result

