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
  :class:`~ctlwire.kernel.errors.RemoteError` (the engine's exception class
  name, message and code), :class:`~ctlwire.kernel.errors.EngineDead` (the rank
  was lost: raised as soon as liveness says so, not at the timeout),
  :class:`~ctlwire.kernel.errors.RequestTimedOut`,
  :class:`~ctlwire.kernel.errors.FanOutFailed`,
  :class:`~ctlwire.kernel.errors.ClientClosed`.
* **Nothing left behind.** Whatever ends a call — outcome, timeout, exception
  or cancellation at any await — its entry is cleaned before the call returns;
  late and duplicate replies are dropped and counted.
* **Deadline travels.** The envelope carries the wall-clock deadline so an
  engine can skip work whose caller has given up. A timeout does not cancel
  remote work: delivery is at most once.
* **Busy is not dead.** Engines heartbeat from a thread of their own and say
  what they are running; a rank that is busy (or stalled past its method's
  stall limit) stays alive and its calls wait for their own deadlines. Only a
  rank that stops heartbeating or disconnects is Lost. A stall of this
  client's own loop is not counted against engines.
* **Failures say whether the work ran.** :class:`~ctlwire.kernel.errors.NotDelivered`
  (never handed to the transport: a retry is safe) or
  :class:`~ctlwire.kernel.errors.OutcomeUnknown` (handed over, then the rank was
  lost: it may have run). ``retry=`` retries the first kind always, the second
  only with an idempotency key or for a method declared idempotent.
* **Ranks come and go.** :meth:`add_rank`, :meth:`remove_rank` and
  :meth:`apply_membership` change the ranks at run time. A rank is *present*
  (in :attr:`membership`), *alive* (heard from: :attr:`peers`) and
  *admissible* (admitted, not in :attr:`quarantine`, meeting
  ``admission_condition``); a fan-out without ``ranks`` goes to the admissible
  ranks and its result's ``left_out`` says which present ranks were not, and
  why. A rank that joins is not admitted until :meth:`admit`. Removing a rank
  fails its pending calls (NotDelivered when nothing was handed over,
  OutcomeUnknown when it was); a fan-out already started or queued keeps the
  ranks it started with (a removed one fails NotDelivered, unsent), and the
  mailboxes' FIFO order is unchanged.
* **Fan-out admission.** ``mode="queueing"`` admits concurrent callers of one
  method strictly first come, first served, one in flight
  (:class:`~ctlwire.kernel.fan_out_mailbox.FanOutMailbox`); ``mode="watching"``
  lets concurrent callers with the same request share one in-flight request,
  each receiving its own copy of the result.

One client runs inside one event loop thread; its tasks live in the client's
``async with`` block.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Literal

import anyio
import msgspec
import sniffio
from anyio.abc import TaskGroup

from ctlwire.kernel.builtin_methods import BUILTIN_METHODS
from ctlwire.kernel.call_arguments import check_method, checked_timeout
from ctlwire.kernel.call_issuer import CallIssuer
from ctlwire.kernel.core.fan_out_policy import FanOutMode, MethodKinds, Policy
from ctlwire.kernel.core.fan_out_result import FanOutResult
from ctlwire.kernel.core.fencing import new_fence
from ctlwire.kernel.core.membership import (
    ChangeKind,
    Membership,
    MembershipChange,
    MembershipEvent,
)
from ctlwire.kernel.core.quarantine import FleetQuarantine
from ctlwire.kernel.core.request_registry import (
    PendingRequest,
    ReplyDisposition,
    RequestRegistry,
    TransitionObserver,
)
from ctlwire.kernel.errors import (
    ClientClosed,
    EngineDead,
    FanOutFailed,
    NoAdmissibleRanks,
    RemoteError,
    RequestTimedOut,
    ResultTypeError,
)
from ctlwire.kernel.fan_out_mailbox import FanOutMailbox
from ctlwire.kernel.liveness_monitor import LivenessMonitor
from ctlwire.kernel.progress_callbacks import ProgressCallback, ProgressCallbacks
from ctlwire.kernel.receive_role import ReceiveRole
from ctlwire.kernel.retry_policy import RetryPolicy, merge_retried
from ctlwire.kernel.tracing import TraceProvider
from ctlwire.states import RequestState
from ctlwire.transports.envelope import Heartbeat, Reply
from ctlwire.transports.errors import (
    TransportClosed,
)
from ctlwire.transports.transport import ClientTransport, Dropped, PeerDisconnected, Received

__all__ = ["ControlClient", "ResultTypeError"]

log = logging.getLogger("ctlwire.client")
_S = RequestState
_POLICIES = {p.value: p for p in Policy}


class ControlClient:
    """Sends control requests over a :class:`ClientTransport`; see the module docstring.

    ``ranks`` is the number of engine ranks (``0..n-1``) or their ids (none, for
    a client whose ranks come from a membership backend such as
    :class:`~ctlwire.kernel.etcd_membership.EtcdMembership`).
    ``default_timeout`` applies to methods without an entry in
    ``method_timeouts``; a call's ``timeout=`` overrides both.
    ``heartbeat_interval=None`` disables time-based liveness (disconnections
    reported by the transport still fail pending requests). ``observer`` is
    called on every request transition (more can be appended to
    ``registry.observers``); ``trace_provider`` supplies the opaque trace
    carrier each request's envelope carries (see :mod:`ctlwire.kernel.tracing`).
    ``incarnation_window``: an engine incarnation claiming to be minted more than
    this many seconds ahead of this host's clock is refused (counted in
    ``implausible_incarnation``); it bounds how long a forged incarnation can
    fence a rank, and how far ahead an engine host's clock may run.
    ``admission_condition(rank) -> bool``: a fleet condition an admitted rank must
    also meet to be routed to by default (for example that its last reported
    weight version is the current one); ``admit_on_join=True`` admits ranks that
    join (:meth:`add_rank`) at once instead of waiting for :meth:`admit`.
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
    ) -> None:
        self.transport = transport
        self.codec = transport.codec
        self.ranks: tuple[int, ...] = (
            tuple(range(ranks)) if isinstance(ranks, int) else tuple(ranks))
        self._rank_set = frozenset(self.ranks)
        #: the present ranks (static: ``ranks``), their registrations and admission
        self.membership = Membership(self.ranks, admit_on_join=admit_on_join)
        #: a fleet condition an admitted rank must meet to be routed to by default
        self.admission_condition = admission_condition
        self.default_timeout = checked_timeout(default_timeout, "default_timeout")
        self.method_timeouts = {m: checked_timeout(t, f"method_timeouts[{m!r}]")
                                for m, t in (method_timeouts or {}).items()}
        self.registry = RequestRegistry(max_tombstones=max_tombstones, observer=observer)
        self.heartbeat_interval = heartbeat_interval
        self.idempotent_methods = frozenset(idempotent_methods)
        self._key_seq = itertools.count(1)
        #: the ``on_progress`` callbacks of the calls in flight
        self.progress_callbacks = ProgressCallbacks()
        self._mailboxes: dict[str, FanOutMailbox] = {}
        #: read-only methods: a fan-out's default mode follows the kind (fan_out_policy)
        self.method_kinds = MethodKinds(BUILTIN_METHODS)
        self._tg: TaskGroup | None = None
        self._closed = False
        self._now: Callable[[], float] = anyio.current_time  # the loop's own clock once entered
        #: rank -> the engine metrics last read with :meth:`engine_metrics`
        self.last_engine_metrics: dict[int, dict[str, Any]] = {}
        self.counters: dict[str, int] = {
            "dropped_malformed": 0,
            "dropped_oversized": 0,
            "dropped_framing": 0,
            "dropped_wrong_type": 0,
            "stale_incarnation": 0,
            "heartbeats_sent": 0,
            "heartbeats_received": 0,
            "engine_lost": 0,
            "engine_restarted": 0,
            "engine_stalled": 0,
            "client_stalls": 0,
            "retries": 0,
        }
        #: heartbeats, the peer table (:attr:`peers`) and the loss of ranks
        self.liveness = LivenessMonitor(transport, self.ranks, interval=heartbeat_interval,
                                        misses_allowed=heartbeat_misses,
                                        fail_rank=self._fail_rank, counters=self.counters,
                                        stall_limit=stall_limit, stall_limits=stall_limits,
                                        incarnation_window=incarnation_window)
        self.peers = self.liveness.peers
        self._reply_seen = self.peers.reply_seen
        #: which failures a ``retry=`` may send again, and the wait before it
        self.retry_policy = RetryPolicy(self.liveness, self.counters,
                                        idempotent_methods=self.idempotent_methods,
                                        heartbeat_interval=heartbeat_interval,
                                        closed=lambda: self._closed)
        #: the IO of every call: register, send, wait, decode (the mailboxes' FanOutSender)
        self.issuer = CallIssuer(
            transport, self.registry, self.liveness, trace_provider=trace_provider,
            # a fencing token for every request: engines refuse tokens older than the
            # highest they accepted, so a replaced controller cannot act after its successor
            fence=new_fence() if fence is True else int(fence) if fence else 0,
            first_contact_retry=heartbeat_interval or 0.25)
        #: ranks out of routing (shared by every OperationRunner over this client):
        #: a fan-out without explicit ``ranks`` leaves them out
        self.quarantine = FleetQuarantine()

    @property
    def fence(self) -> int:
        """This client's fencing token (0: none), sent with every request that sets none."""
        return self.issuer.fence

    @fence.setter
    def fence(self, value: int) -> None:
        self.issuer.fence = value

    @property
    def trace_provider(self) -> TraceProvider | None:
        """Supplies each request's trace carrier (see :mod:`ctlwire.kernel.tracing`)."""
        return self.issuer.trace_provider

    @trace_provider.setter
    def trace_provider(self, value: TraceProvider | None) -> None:
        self.issuer.trace_provider = value

    # -- lifetime ------------------------------------------------------------
    async def __aenter__(self) -> ControlClient:
        if self._tg is not None or self._closed:
            raise RuntimeError("a ControlClient can be entered once")
        await self.transport.__aenter__()
        issuer = self.issuer
        issuer.enter_loop()
        self._now = self.liveness.now = self.retry_policy.now = issuer.now
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        if (sniffio.current_async_library() == "trio"
                and hasattr(type(self.transport), "receive_or_handle")
                and hasattr(type(self.transport), "interrupt_receive")):
            # trio: a caller waiting for its reply may receive it itself (ReceiveRole)
            role = ReceiveRole(self.transport, self._handle_reply, self._on_event, self.aclose,
                               self._awaits_nothing_else)
            issuer.receive_role = role
            issuer.new_single_waiter = role.new_waiter
            tg.start_soon(role.run_loop, name="ctlwire.client.receive")
        else:
            tg.start_soon(self._receive_loop, name="ctlwire.client.receive")
        tg.start_soon(issuer.reaper.run, self._now, name="ctlwire.client.deadlines")
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
        for entry in self.registry.open_entries():
            for rank in entry.outstanding():
                self.registry.rank_failed(entry, rank, ClientClosed("client closed"))
            self.registry.fail(entry)
            self.issuer.wake(entry)
        for box in self._mailboxes.values():
            for ticket in box.queue.queued():
                if ticket.waiter is not None:
                    ticket.waiter.set()  # the caller finds the client closed
        self.liveness.close()  # first-contact waits and wait_ready() re-check

    @property
    def closed(self) -> bool:
        return self._closed

    def rank_status(self, rank: int) -> dict[str, Any]:
        """What this client knows of ``rank``: its PeerLink state (CONNECTED,
        BUSY, STALLED, SUSPECT, LOST, UNKNOWN), incarnation, and the request or
        step it was last reported running, for how long, with its progress;
        ``quarantined``: why it is out of routing (None when it is not).
        The three predicates: ``present`` (in :attr:`membership`), ``alive``
        (heard from and not lost), ``admissible`` (routed to by default), and
        ``excluded``: why it is not admissible (None when it is). A rank removed
        earlier is reported not present; ValueError for a rank never known."""
        member = self.membership.get(rank)
        if member is None:
            if rank not in self.membership.removed:
                raise ValueError(
                    f"rank {rank} is not one of this client's ranks {self.ranks}")
            status: dict[str, Any] = {"state": "UNKNOWN", "incarnation": 0}
        else:
            status = self.liveness.rank_status(rank)
        held = self.quarantine.get(rank)
        status["quarantined"] = None if held is None else {
            "op": held.op_id, "step": held.step, "detail": held.detail}
        why = self.membership.exclusion(rank, self.quarantine, self.admission_condition)
        status["present"] = member is not None
        status["alive"] = self.peers.is_live(rank)
        status["admissible"] = why is None
        status["excluded"] = why
        status["member"] = None if member is None else {
            "address": member.address, "incarnation": member.incarnation,
            "revision": member.revision, "admitted": member.admitted}
        return status

    # -- membership --------------------------------------------------------------
    def apply_membership(self, event: MembershipEvent) -> MembershipChange | None:
        """Apply one membership event (from a backend or the caller) and carry its
        change out: a rank added is tracked (heartbeats, transport route or
        connection) but not routed to by default until admitted; a rank removed
        has its pending calls failed (NotDelivered: not handed over, a retry is
        safe; OutcomeUnknown: handed over, it may have run) and is forgotten by
        the transport; a rank re-registered (newer incarnation) must be admitted
        again; one moved gets its new address. Stale or fenced events change
        nothing (counted in ``membership.counters``); returns None for them.
        A transport that connects to each rank needs the address of a rank
        added: ValueError without one (and the rank is not added)."""
        change = self.membership.apply(event)
        if change is None:
            return None
        rank = change.rank
        if change.kind is ChangeKind.ADDED:
            try:
                self._transport_hook("add_rank", rank, event.address)
            except BaseException:
                self.membership.undo_add(rank)  # refused (no or bad address): not added
                raise
            self.liveness.add_rank(rank)
        elif change.kind is ChangeKind.REMOVED:
            self._fail_rank(rank, "removed from the membership")
            self.liveness.remove_rank(rank)
            self._transport_hook("remove_rank", rank)
        elif (change.old is not None and change.member is not None
              and change.member.address != change.old.address):  # moved (or re-registered)
            self._transport_hook("move_rank", rank, event.address)
        self.ranks = self.membership.ranks
        self._rank_set = frozenset(self.ranks)
        return change

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
        if rank not in self.membership:
            raise ValueError(f"rank {rank} is not one of this client's ranks {self.ranks}")
        return self.membership.admit(rank)

    def routable_ranks(self) -> tuple[tuple[int, ...], dict[int, str]]:
        """The ranks a fan-out without ``ranks`` goes to, and the present ranks it
        leaves out with why (``not admitted``, ``quarantined``, ``admission
        condition not met``)."""
        if (not self.quarantine.held and self.admission_condition is None
                and self.membership.all_admitted):
            return self.ranks, {}
        return self.membership.routable(self.quarantine, self.admission_condition)

    def _was_removed(self, rank: int) -> bool:
        """``rank`` was a member and was removed (a call naming it fails NotDelivered)."""
        return rank in self.membership.removed and self.peers.is_lost(rank)

    def knows_rank(self, rank: int) -> bool:
        """``rank`` is present, or was and was removed (calls naming it fail typed)."""
        return rank in self._rank_set or self._was_removed(rank)

    def _transport_hook(self, name: str, *args: Any) -> None:
        hook = getattr(self.transport, name, None)
        if hook is not None:
            hook(*args)

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
        check_method(method)
        if rank is None:
            if not self.ranks:
                raise ValueError("this client has no ranks (yet): name one")
            rank = self.ranks[0]
        elif rank not in self._rank_set and not self._was_removed(rank):
            raise ValueError(f"rank {rank} is not one of this client's ranks {self.ranks}")
        budget = self.timeout_for(method, timeout)
        raw = self.issuer.encode_payload(payload, method)
        key = self.new_idempotency_key() if idempotency_key == "" else (idempotency_key or "")
        issuer = self.issuer
        deadline = self._now() + budget
        while True:
            try:
                if on_progress is None:  # the common case, in one frame
                    return await issuer.call_one(method, raw, rank, budget, deadline,
                                                 result_type, key, fence)
                return await self._call_watched(method, raw, rank, budget, deadline,
                                                result_type, key, fence, on_progress)
            except (EngineDead, RemoteError) as exc:
                if retry <= 0 or not self.retry_policy.retryable(exc, method, key):
                    raise
                retry -= 1
                if not await self.retry_policy.before_retry((rank,), deadline):
                    raise

    async def _call_watched(self, method: str, raw: msgspec.Raw, rank: int, budget: float,
                            deadline: float, result_type: Any, key: str, fence: int | None,
                            on_progress: ProgressCallback) -> Any:
        """One attempt of :meth:`call` whose ``on_progress`` gets the rank's reports."""
        issuer = self.issuer
        core = issuer.call_core(method, (rank,), Policy.ALL, budget, deadline, None, key, fence)
        try:
            entry = core.register(issuer.new_task_waiter())  # only this caller waits on it
            self.progress_callbacks.by_id[entry.id] = on_progress
            await issuer.send_all(core, raw)
            await issuer.wait_outcome(core, deadline)
            return issuer.single_outcome(entry, rank, result_type)
        finally:
            if core.entry is not None:
                self.progress_callbacks.by_id.pop(core.entry.id, None)
            core.finish()

    async def fan_out(
        self,
        method: str,
        payload: Any = None,
        *,
        ranks: Sequence[int] | None = None,
        timeout: float | None = None,
        mode: FanOutMode | None = None,
        policy: Literal["all", "quorum", "first"] | Policy = "all",
        result_type: Any = Any,
        idempotency_key: str | None = None,
        fence: int | None = None,
        retry: int = 0,
        on_progress: ProgressCallback | None = None,
    ) -> FanOutResult:
        """Send ``method(payload)`` to every rank in ``ranks`` (default: every rank
        not in :attr:`quarantine`; a quarantined rank is reached only by naming it).

        Returns a :class:`FanOutResult` with each rank's result or typed error
        once ``policy`` is met. Raises FanOutFailed when it cannot be met,
        RequestTimedOut (with ``partial``) at the deadline, ClientClosed.
        ``mode``: ``queueing`` (FIFO, one in flight per method), ``watching``
        (share an identical in-flight request) or ``concurrent`` (no admission);
        by default ``watching`` for a read-only method, else ``queueing``
        (:attr:`method_kinds`).
        ``idempotency_key``, ``fence``, ``on_progress`` as for :meth:`call`;
        ``retry`` re-sends to the ranks whose failure is safe to retry (and
        only to them), within the one ``timeout``, and merges their outcomes.
        Argument errors, size errors, cancellation and first contact as for
        :meth:`call`. Policy ``"all"`` returns normally even when every rank
        answered with an error: read ``errors`` or call ``raise_for_errors()``;
        FanOutFailed means ranks could not answer at all (lost, unreachable).
        """
        check_method(method)
        mode = mode or self.method_kinds.default_mode(method)
        pol = _POLICIES.get(policy) if type(policy) is str else None
        if pol is None:
            pol = policy if isinstance(policy, Policy) else Policy(policy)
        left_out: dict[int, str]
        if ranks is not None:
            targets, left_out = tuple(ranks), {}
            if not targets or not (self._rank_set.issuperset(targets)
                                   or all(map(self.knows_rank, targets))):
                raise ValueError(f"ranks {targets} must be a non-empty subset of {self.ranks}")
        else:
            targets, left_out = self.routable_ranks()
            if not targets:
                raise NoAdmissibleRanks(method, left_out)
        budget = self.timeout_for(method, timeout)
        raw = self.issuer.encode_payload(payload, method)
        key = self.new_idempotency_key() if idempotency_key == "" else (idempotency_key or "")
        if on_progress is not None:
            self.progress_callbacks.add_method(method, on_progress)
        deadline = self._now() + budget
        try:
            try:
                result = await self._fan_out_once(method, raw, targets, pol, budget, mode,
                                                  result_type, key, fence)
                failed = None
            except FanOutFailed as exc:
                result, failed = exc.result, exc
            while retry > 0 and pol is Policy.ALL:
                again = tuple(r for r, e in sorted(result.errors.items())
                              if self.retry_policy.retryable(e, method, key))
                if not again or not await self.retry_policy.before_retry(again, deadline):
                    break
                retry -= 1
                try:
                    more = await self._fan_out_once(method, raw, again, pol,
                                                    deadline - self._now(), mode, result_type,
                                                    key, fence)
                except FanOutFailed as exc:
                    more = exc.result
                failed = merge_retried(result, again, more, method, pol)
            if left_out:
                result.left_out = left_out
            if failed is not None:
                raise failed
            return result
        except RequestTimedOut as exc:
            if left_out and exc.partial is not None:
                exc.partial.left_out = left_out
            raise
        finally:
            if on_progress is not None:
                self.progress_callbacks.remove_method(method, on_progress)

    async def _fan_out_once(self, method: str, raw: msgspec.Raw, targets: tuple[int, ...],
                            pol: Policy, budget: float, mode: str, result_type: Any,
                            key: str, fence: int | None) -> FanOutResult:
        mailbox = self.mailbox(method)
        if mode == "queueing":
            return await mailbox.queueing(raw, targets, pol, budget, result_type, key, fence)
        if mode == "watching":
            return await mailbox.watching(raw, targets, pol, budget, result_type, key, fence)
        if mode == "concurrent":
            return await self.issuer.run_fan_out(method, raw, targets, pol, budget,
                                                 self._now() + budget, result_type, key, fence)
        raise ValueError(f"unknown mode {mode!r}: expected queueing, watching or concurrent")

    def mailbox(self, method: str) -> FanOutMailbox:
        """The fan-out mailbox of ``method`` (created on first use)."""
        box = self._mailboxes.get(method)
        if box is None:
            box = self._mailboxes[method] = FanOutMailbox(self.issuer, method)
        return box

    async def wait_ready(self, ranks: Sequence[int] | None = None, timeout: float = 10.0) -> None:
        """Wait until every rank in ``ranks`` (default: all) has been heard from.

        Raises RequestTimedOut naming the ranks still missing, ClientClosed
        when the client closes meanwhile.
        """
        await self.liveness.wait_ready(tuple(ranks) if ranks is not None else self.ranks,
                                       timeout)

    # -- background tasks ------------------------------------------------------
    async def _receive_loop(self) -> None:
        transport = self.transport
        receive: Callable[[], Awaitable[Any]] = transport.receive
        # a transport that can hand replies over from the event loop's reader callback
        # (asyncio): replies complete their calls without waking this task. Looked up on
        # the class, so that a wrapper forwarding attributes is not bypassed.
        if hasattr(type(transport), "receive_or_handle"):
            receive = partial(transport.receive_or_handle, self._handle_reply)  # type: ignore[attr-defined]
        while True:
            try:
                event = await receive()
            except TransportClosed:
                # the transport closed under us: pending calls fail now, typed
                await self.aclose()
                return
            try:
                self._on_event(event)
            except Exception:  # pragma: no cover - a bug must not kill the receiver
                log.exception("ctlwire client: failed to handle %r", event)

    def _awaits_nothing_else(self, entry: PendingRequest) -> bool:
        """True when no request but ``entry`` is in the request map (nothing else
        awaits a reply; the receive role may be given back quietly)."""
        return self.registry.live_count == (entry.state is not _S.CLEANED)

    def _handle_reply(self, event: Any) -> bool:
        """A reply, handled where it arrives (the transport's reader callback); any
        other event is declined, for the receiving task (:meth:`_on_event`)."""
        if type(event) is not Received or type(event.envelope) is not Reply:
            return False
        try:
            self._on_reply(event.envelope, event.peer)
        except Exception:  # pragma: no cover - a bug must not kill the receiver
            log.exception("ctlwire client: failed to handle %r", event)
        return True

    def _on_event(self, event: Any) -> None:
        if type(event) is Received:
            env = event.envelope
            if type(env) is Reply:
                self._on_reply(env, event.peer)
            elif type(env) is Heartbeat:
                rank = env.rank if event.peer is None else event.peer
                progress = self.liveness.heartbeat(rank, env)
                if progress is not None and progress.request_id and self.progress_callbacks:
                    self.progress_callbacks.dispatch(self.registry, rank, progress)
            else:
                self.counters["dropped_wrong_type"] += 1
        elif type(event) is Dropped:
            key = f"dropped_{event.reason}"
            self.counters[key] = self.counters.get(key, 0) + 1
        elif type(event) is PeerDisconnected and event.rank is not None:
            self.liveness.disconnected(event.rank, event.detail or "disconnected")

    def _on_reply(self, reply: Reply, peer: int | None) -> None:
        rank = reply.rank if peer is None else peer
        if not self._reply_seen(rank, reply.incarnation, self._now()):
            # not the common case (Connected, its admitted incarnation): the general path
            if self.peers.is_stale(rank, reply.incarnation):
                self.counters["stale_incarnation"] += 1
                return
            if not self.liveness.seen(rank, reply.incarnation, authoritative=False):
                return  # an implausible incarnation: refused and counted
            self.peers.finished(rank, reply.id)
        disposition, entry = self.registry.on_reply(reply, peer)
        if disposition is ReplyDisposition.COMPLETED and entry is not None:
            self.issuer.wake(entry)

    def _fail_rank(self, rank: int, detail: str) -> None:
        self.issuer.fail_rank(rank, detail)  # the liveness monitor lost ``rank``

    # -- observability ---------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        """This client's metrics (the client side of the one metrics shape, see
        :func:`ctlwire.kernel.metrics.client_metrics` and the README's table)."""
        from ctlwire.kernel.metrics import client_metrics

        return client_metrics(self)

    async def engine_metrics(self, rank: int, *, timeout: float | None = None
                             ) -> dict[str, Any]:
        """Engine ``rank``'s metrics, read through the built-in, read-only
        ``ctlwire.metrics`` method every :class:`EngineEndpoint` serves. The
        answer is also kept in :attr:`last_engine_metrics` (what
        :func:`ctlwire.kernel.metrics.snapshot` and the Prometheus exporter show)."""
        from ctlwire.kernel.metrics import ENGINE_METRICS_METHOD

        result: dict[str, Any] = await self.call(ENGINE_METRICS_METHOD, rank=rank,
                                                 timeout=timeout)
        self.last_engine_metrics[rank] = result
        return result
