"""Run a coordinated multi-rank operation through a ControlClient (the anyio shell).

::

    runner = OperationRunner(client)
    result = await runner.run(plan, on_progress=print)      # OperationResult
    if not result.ok:
        print(result.summary(), result.failed_ranks, result.quarantined)
    await client.fan_out("get_load")              # skips quarantined ranks: not ok
    await runner.release(2)   # back in routing once it serves what the fleet serves

    # a new controller, after the old one died mid-operation:
    recovery = await runner.recover(plan)                   # what remains, per rank
    if recovery is not None and recovery.action != "done":
        result = await runner.finish(plan, recovery)        # compensate or roll forward

:class:`OperationRunner` drives an :class:`~ctlwire.kernel.core.operation_core.OperationCore`:
the whole plan is checked first (:meth:`check`: payloads, sizes, each rank's
declared step methods; :class:`~ctlwire.kernel.core.operation_plan.InvalidPlan`
before anything is sent); then each dispatch is one ``concurrent`` fan-out of
``ctlwire.step`` (see :mod:`~ctlwire.kernel.engine.operation_ledger`) with the step's
own timeout, and each rank's typed outcome (:mod:`~ctlwire.kernel.operations.step_outcomes`)
is fed back. The plan's post-condition, if any, is read on every rank before
commit. Reports and progress events carry each failure's error object.

Guarantees, on top of the core's:

* **Quarantine.** A rank the operation could not bring back is quarantined in
  the client's :class:`~ctlwire.kernel.core.quarantine.FleetQuarantine`
  (``client.quarantine``, shared by every runner over the client): left out of
  every fan-out that does not name it, of :meth:`routable_ranks` and of every
  later operation (naming it raises InvalidPlan) until :meth:`release`; shown
  by :meth:`metrics`, ``client.rank_status()`` and the client's metrics; ranks
  an operation left out count against its ``ok``. :meth:`release` checks what it serves.
* **A lost rank frees the others.** A rank lost mid-step ends its part at once
  (``OutcomeUnknown``); the step's other ranks are asked to abort it
  (:mod:`~ctlwire.kernel.operations.step_dispatch`): one blocked in a collective with it
  fails and is compensated within the liveness delay, not the step's timeout.
* **Observable.** ``on_progress`` receives every per-rank, per-step change as it
  happens, and each rank's progress reports (``fraction``, ``note``: what its
  step says with ``report_progress``) as its heartbeats bring them;
  :meth:`progress` is a snapshot of the operations in flight.
* **Restart, honestly.** A run that is cancelled, or whose controller dies, leaves the
  operation undecided. A new controller calls :meth:`recover` (per rank, what its ledger
  applied and undid, and what remains) and :meth:`finish`, which takes the operation over
  with a newer fence and finishes its compensation or rolls it forward: steps already
  applied answer their recorded results and do not run twice. :meth:`restore_quarantine`
  rebuilds the quarantine from the ledgers. A rank that was restarted itself has lost its
  ledger; an operation that was compensated cannot be replayed forward.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Literal

import anyio

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.operation_core import Dispatch, OperationCore, StepOutcome
from ctlwire.kernel.core.operation_plan import (
    InvalidPlan,
    OperationPlan,
    PostCondition,
    PostConditionFailed,
    new_fence,
    new_operation_id,
    step_key,
)
from ctlwire.kernel.core.operation_result import OperationResult, ProgressEvent
from ctlwire.kernel.core.peer_table import Progress
from ctlwire.kernel.core.quarantine import Quarantine
from ctlwire.kernel.engine.operation_ledger import (
    STEP_METHOD,
    STEP_METHODS_METHOD,
    LastOperation,
    StepRequest,
)
from ctlwire.kernel.errors import ReleaseRefused, RequestTooLarge
from ctlwire.kernel.operations.ledger_reads import read_last_operations
from ctlwire.kernel.operations.recovery import Recovery, recovery_of, unsettled
from ctlwire.kernel.operations.step_dispatch import step_answers
from ctlwire.kernel.operations.step_outcomes import Outcome, answers, classify, outcomes, refused
from ctlwire.states import OperationState
from ctlwire.transports.codec import PayloadTypeError

__all__ = ["OperationRunner", "Quarantine", "Recovery", "ReleaseRefused", "classify",
           "recovery_of"]


class OperationRunner:
    """Runs operations over ``client`` and keeps its quarantine, with the guarantees above.

    ``history``: how many recent results :meth:`metrics` keeps. ``envelope_fields``:
    also put each step's key and fence into the request envelope (checked by the
    endpoint itself); off by default, as the endpoint keeps one highest fence for
    every request and operation tokens must not share it with another scheme's."""

    def __init__(self, client: ControlClient, *, history: int = 32,
                 envelope_fields: bool = False) -> None:
        self.client = client
        self.active: dict[str, OperationCore] = {}
        self._observed: dict[str, dict[int, Any]] = {}  # op id -> rank -> post-condition answer
        # rank -> (incarnation, the step methods its ledger declared)
        self._declared: dict[int, tuple[int, tuple[str, ...]]] = {}
        self.history: deque[OperationResult] = deque(maxlen=history)
        self.counters: dict[str, int] = {"operations": 0, "committed": 0, "aborted": 0,
                                         "degraded": 0, "superseded": 0, "quarantines": 0,
                                         "released": 0}
        self._envelope_fields = envelope_fields

    # -- routing -----------------------------------------------------------------
    @property
    def quarantined(self) -> dict[int, Quarantine]:
        """The quarantined ranks: the client's set, shared by every runner over it."""
        return self.client.quarantine.held

    def routable_ranks(self) -> tuple[int, ...]:
        """The client's admissible ranks: present, admitted, not quarantined, meeting
        its admission condition (``ControlClient.routable_ranks``)."""
        return self.client.routable_ranks()[0]

    def quarantine(self, rank: int, op_id: str = "", step: str = "", detail: str = "",
                   error: Exception | None = None,
                   postcondition: PostCondition | None = None) -> None:
        """Take ``rank`` out of routing (operations do this themselves when needed);
        ``postcondition``: what it must meet to be released without ``force``
        until an operation sets what the fleet serves (see :meth:`release`)."""
        if not self.client.knows_rank(rank):  # a rank removed meanwhile is held too
            raise ValueError(f"rank {rank} is not one of {self.client.ranks}")
        if rank not in self.quarantined:
            self.counters["quarantines"] += 1
        self.client.quarantine.add(Quarantine(rank, op_id, step, detail, error, postcondition))

    async def release(self, rank: int, *, postcondition: PostCondition | None = None,
                      force: bool = False, timeout: float = 5.0) -> Quarantine:
        """Put a quarantined ``rank`` back in routing. Unless ``force``, the rank must
        first meet ``postcondition``, read from the rank itself (default: what the
        fleet serves, ``client.quarantine.serving``, else the quarantining plan's);
        otherwise :class:`ReleaseRefused` and it stays quarantined (:meth:`catch_up`
        brings it there). KeyError when it is not quarantined."""
        record = self.quarantined[rank]
        pc = postcondition or self.client.quarantine.serving or record.postcondition
        if pc is not None and not force:
            try:
                answer = await self.client.call(pc.method, pc.payload, rank=rank,
                                                timeout=pc.timeout or timeout)
            except Exception as exc:
                raise ReleaseRefused(rank, f"its post-condition could not be read: {exc}",
                                     exc) from exc
            if not pc.holds(answer):
                raise ReleaseRefused(rank, str(PostConditionFailed(rank, pc.method, pc.expect,
                                                                   answer)), answer)
        record = self.client.quarantine.remove(rank)
        self.counters["released"] += 1
        return record

    # -- running -----------------------------------------------------------------
    async def run(self, plan: OperationPlan, *,
                  ranks: Sequence[int] | Literal["admissible"] | None = None,
                  op_id: str | None = None, fence: int | None = None,
                  on_progress: Callable[[ProgressEvent], None] | None = None
                  ) -> OperationResult:
        """Run ``plan`` on ``ranks`` (default: :meth:`routable_ranks`) as one operation.

        Without ``ranks`` the present ranks left out are in ``result.left_out``
        and count against its ``ok`` (not with ``ranks="admissible"``).
        ``op_id``/``fence`` default to fresh ones (a controller taking over another's
        operation uses :meth:`finish`; the same id with the same fence from another
        client is refused by the ledgers). Raises
        :class:`~ctlwire.kernel.core.operation_plan.InvalidPlan` (a ValueError) for
        quarantined, repeated or unknown ranks and for anything :meth:`check`
        finds, before any step is sent; ClientClosed if the client closes
        meanwhile. Once the first step is sent, every failure (one found at
        dispatch, such as a payload that no longer encodes, included) is a step
        failure: it ends in compensation and a result. An exception
        raised by ``on_progress`` (or a cancellation) ends the run like a crash of
        the controller: the operation is left undecided (see :meth:`recover`).
        ``on_progress`` is called in the task driving the run, except for the
        ranks' progress reports, which the client's receive loop delivers as
        they arrive: keep it short.
        """
        only = ranks == "admissible"
        targets, left_out = (self.client.routable_ranks() if ranks is None or ranks == "admissible"
                             else (tuple(ranks), {}))
        if not targets:
            raise InvalidPlan([f"no routable rank to run the operation on ({left_out})"])
        if len(set(targets)) != len(targets):
            raise InvalidPlan([f"ranks {targets} name a rank twice"])
        if unknown := set(targets) - set(self.client.ranks):
            raise InvalidPlan([f"ranks {sorted(unknown)} are not one of {self.client.ranks}"])
        fence = fence if fence is not None else new_fence()
        core = await self._start(plan, targets, op_id or new_operation_id(plan.name, fence),
                                 fence, on_progress)
        result = replace(await self._drive(core), left_out=left_out, admissible_only=only)
        self.history[-1] = result  # what metrics() shows says which ranks it left out
        if result.state is OperationState.COMMITTED and set(targets) >= set(self.routable_ranks()):
            self.client.quarantine.serving = plan.postcondition or self.client.quarantine.serving
        return result

    async def catch_up(self, plan: OperationPlan, rank: int, *, op_id: str | None = None,
                       fence: int | None = None,
                       on_progress: Callable[[ProgressEvent], None] | None = None
                       ) -> OperationResult:
        """Bring quarantined ``rank`` to the fleet's state and back into routing:
        ``plan`` (the one that brought the other ranks there, with its
        post-condition) runs on that rank alone, and the rank is released when
        the operation commits, that is once the post-condition held on it.

        For a rank that restarted on old state (its ledger lost) after it was
        quarantined: :meth:`release` refuses it (its post-condition does not
        hold), later operations leave it out. Otherwise it stays quarantined,
        held for this operation when this one quarantined it again. Raises
        InvalidPlan (before anything is sent) for a plan without a
        post-condition, a rank that is not quarantined, and as :meth:`run` does.
        With a membership backend, a re-registered rank must also be admitted
        (``client.admit(rank)``)."""
        if plan.postcondition is None:
            raise InvalidPlan([f"catch-up of rank {rank}: plan {plan.name!r} has no "
                               "post-condition to release it by"])
        if rank not in self.quarantined:
            raise InvalidPlan([f"catch-up of rank {rank}: it is not quarantined (run() it)"])
        fence = fence if fence is not None else new_fence()
        core = await self._start(plan, (rank,), op_id or new_operation_id(plan.name, fence),
                                 fence, on_progress, held_ok=True)
        result = await self._drive(core)
        if result.ok:
            self.client.quarantine.remove(rank)
            self.counters["released"] += 1
        return result

    async def _start(self, plan: OperationPlan, targets: tuple[int, ...], op_id: str,
                     fence: int, on_progress: Callable[[ProgressEvent], None] | None,
                     *, held_ok: bool = False) -> OperationCore:
        """The core of a new run of ``plan`` on ``targets``, the plan checked first
        (``held_ok``: quarantined ranks too, for a catch-up)."""
        held = sorted(set(targets) & set(self.quarantined))
        if held and not held_ok:
            raise InvalidPlan([f"ranks {held} are quarantined; release() them first"])
        if op_id in self.active:
            raise ValueError(f"operation {op_id!r} is already running")
        await self.check(plan, targets, op_id=op_id, fence=fence)
        return OperationCore(plan, targets, op_id=op_id, fence=fence, observer=on_progress)

    async def _drive(self, core: OperationCore) -> OperationResult:
        """Send ``core``'s dispatches until it is decided; its result, quarantines applied."""
        op_id = core.op_id
        self.active[op_id] = core
        self.counters["operations"] += 1
        try:
            while (d := core.next_dispatch()) is not None:
                outcomes = await self._dispatch(d)
                for rank in d.ranks:
                    core.record(rank, *outcomes[rank])
        finally:
            del self.active[op_id]
        result = core.result()
        observed = self._observed.pop(op_id, {})
        if observed:
            result = replace(result, observed=observed)
        for rank in result.quarantined:
            rep = result.ranks[rank]
            self.quarantine(rank, op_id, rep.failed_step or "", rep.detail, rep.error,
                            core.plan.postcondition)
        self.counters[result.state.value] = self.counters.get(result.state.value, 0) + 1
        self.history.append(result)
        return result

    async def check(self, plan: OperationPlan, ranks: Sequence[int], *, op_id: str = "",
                    fence: int = 0, timeout: float = 5.0) -> None:
        """Check the whole of ``plan`` for ``ranks`` before anything of it is sent.

        Every step's and compensation's payload must encode and fit the size
        limit as a ``ctlwire.step`` request, and every method must be one each
        rank's ledger declares (``ctlwire.step_methods``, asked once per engine
        incarnation; a rank that does not answer is not checked, its dispatch
        will tell). Raises
        :class:`~ctlwire.kernel.core.operation_plan.InvalidPlan` listing every
        problem; nothing of the plan has been sent then."""
        client = self.client
        problems: list[str] = []
        fence = fence or new_fence()
        op_id = op_id or new_operation_id(plan.name, fence)
        longest = max((s.name for s in plan.steps), key=len)
        for what, method, payload, _ in plan.calls():
            try:
                raw = client.codec.encode_value(payload)
                probe = StepRequest(op_id, longest, "compensate", fence,
                                    step_key(op_id, longest, undo=True), method, raw,
                                    len(plan.steps), list(ranks))
                client.issuer.encode_payload(probe, STEP_METHOD)
            except (PayloadTypeError, TypeError) as exc:
                problems.append(f"{what}: payload cannot be encoded ({exc})")
            except RequestTooLarge as exc:
                problems.append(f"{what}: {exc}")
        pc = plan.postcondition
        if pc is not None:
            try:
                client.issuer.encode_payload(pc.payload, pc.method)
            except (PayloadTypeError, TypeError) as exc:
                problems.append(f"post-condition {pc.method!r}: payload cannot be encoded "
                                f"({exc})")
            except RequestTooLarge as exc:
                problems.append(f"post-condition {pc.method!r}: {exc}")
        methods = {method for _, method, _, _ in plan.calls()}
        for rank, declared in sorted((await self._declared_methods(ranks, timeout)).items()):
            missing = sorted(methods - set(declared))
            if missing:
                problems.append(f"rank {rank} runs no operation step {', '.join(missing)} "
                                f"(it declares {', '.join(declared) or 'none'})")
        if problems:
            raise InvalidPlan(problems)

    async def _declared_methods(self, ranks: Sequence[int], timeout: float
                                ) -> dict[int, tuple[str, ...]]:
        """:meth:`step_methods`, asked again only of ranks whose incarnation changed."""
        known: dict[int, tuple[str, ...]] = {}
        ask: dict[int, int] = {}
        for rank in ranks:
            incarnation = int(self.client.rank_status(rank).get("incarnation") or 0)
            cached = self._declared.get(rank)
            if incarnation and cached is not None and cached[0] == incarnation:
                known[rank] = cached[1]
            else:
                ask[rank] = incarnation
        if ask:
            answers = await self.step_methods(tuple(ask), timeout)
            for rank, declared in answers.items():
                known[rank] = declared
                if ask[rank]:
                    self._declared[rank] = (ask[rank], declared)
        return known

    async def step_methods(self, ranks: Sequence[int] | None = None, timeout: float = 5.0
                           ) -> dict[int, tuple[str, ...]]:
        """The methods each rank's ledger runs as steps, for the ranks that answer."""
        targets = tuple(ranks) if ranks is not None else self.client.ranks
        res = await answers(self.client, STEP_METHODS_METHOD, ranks=targets, timeout=timeout,
                            result_type=list[str])
        if res is None:
            return {}
        return {r: tuple(v) for r, v in res.results.items()}

    async def _dispatch(self, d: Dispatch) -> dict[int, Outcome]:
        """Send ``d``; each rank's outcome, its detail and the typed error behind it."""
        if d.check:
            return await self._check_postcondition(d)
        client = self.client
        core = self.active.get(d.op_id)
        ranks = core.ranks if core is not None else d.ranks
        extra: dict[str, Any] = (
            {"idempotency_key": d.key, "fence": d.fence} if self._envelope_fields else {})
        failed: list[BaseException] = []
        scope = anyio.CancelScope()
        if core is not None and core.observer is not None:

            def report(rank: int, progress: Progress) -> None:
                # called by the client's receive loop: an exception of the observer
                # ends this run as it would in the runner's own task
                if failed or progress.fraction < 0:
                    return
                try:
                    core.report(rank, progress.fraction, progress.note)
                except BaseException as exc:
                    failed.append(exc)
                    scope.cancel()

            extra["on_progress"] = report
        try:
            payload = StepRequest(d.op_id, d.step, d.phase, d.fence, d.key, d.method,
                                  client.codec.encode_value(d.payload), d.index, list(ranks))
            with scope:
                res = await step_answers(client, d, payload, **extra)
        except (PayloadTypeError, TypeError, ValueError) as exc:
            return refused(d.ranks, exc)
        if failed:
            raise failed[0]
        return outcomes(res, d.ranks, f"no outcome of {d.key!r} in time")

    async def _check_postcondition(self, d: Dispatch) -> dict[int, Outcome]:
        """Read the plan's post-condition on ``d.ranks``: a mismatch fails that rank."""
        pc = self.active[d.op_id].plan.postcondition
        assert pc is not None
        try:
            res = await answers(self.client, d.method, d.payload, ranks=d.ranks,
                                timeout=d.timeout)
        except (PayloadTypeError, TypeError, ValueError) as exc:
            return refused(d.ranks, exc)
        observed = self._observed.setdefault(d.op_id, {})

        def judge(rank: int, answer: Any) -> Outcome:
            observed[rank] = answer
            if pc.holds(answer):
                return StepOutcome.OK, "", None
            err = PostConditionFailed(rank, pc.method, pc.expect, answer)
            return StepOutcome.ERROR, f"PostConditionFailed: {err}", err

        return outcomes(res, d.ranks, f"no answer to the post-condition {pc.method!r} in time",
                        judge)

    # -- restart recovery ----------------------------------------------------------
    async def last_operations(self, ranks: Sequence[int] | None = None, timeout: float = 5.0,
                              *, fence: int | None = None
                              ) -> dict[int, LastOperation | Exception]:
        """Ask each rank (default: all) which operation and step it last applied.

        With ``fence``, take the ranks over first (``ctlwire.take_over``): each
        raises its fence to ``fence`` before it answers, so no older controller
        changes anything there afterwards; a rank running a step is asked again
        (within ``timeout``) once it returned."""
        targets = tuple(ranks) if ranks is not None else self.client.ranks
        return await read_last_operations(self.client, targets, timeout, fence)

    async def recover(self, plan: OperationPlan, ranks: Sequence[int] | None = None,
                      timeout: float = 5.0, *, fence: int | None = None) -> Recovery | None:
        """The newest operation of ``plan`` some rank applied steps of, and what
        remains of it per rank (see :class:`Recovery`); None when there is none.
        With ``fence``, the ranks are taken over first (see :meth:`last_operations`):
        what is read stays true, and :meth:`finish` acts under that fence."""
        recovery = recovery_of(plan, await self.last_operations(ranks, timeout, fence=fence))
        if recovery is not None and fence is not None:
            recovery = replace(recovery, taken_over=fence)
        return recovery

    async def restore_quarantine(self, plan: OperationPlan, ranks: Sequence[int] | None = None,
                                 timeout: float = 5.0) -> tuple[int, ...]:
        """Rebuild the quarantine from the engines' own ledgers (after a controller
        restart): every rank whose last operation of ``plan`` is unsettled there
        -- steps applied, but neither every step nor every compensation due -- is
        quarantined (step ``""``: left mid-operation). Returns the ranks added."""
        added = []
        for rank, last in sorted((await self.last_operations(ranks, timeout)).items()):
            if isinstance(last, LastOperation) and unsettled(plan, last) \
                    and rank not in self.quarantined:
                added.append(rank)
                self.quarantine(rank, last.op, "", f"left mid-operation: applied {last.steps}, "
                                                   f"undone {last.undone}",
                                postcondition=plan.postcondition)
        return tuple(added)

    async def finish(self, plan: OperationPlan, recovery: Recovery, *,
                     on_progress: Callable[[ProgressEvent], None] | None = None
                     ) -> OperationResult:
        """Do what remains of a recovered operation, in one call, under a newer fence
        (which takes the operation over on every rank and fences its old
        controller out): finish its compensation, or roll it forward (steps
        already applied answer their recorded results and do not run again).
        A rank of the operation that did not answer the recovery is quarantined:
        what it applied is not known. Raises InvalidPlan as :meth:`run` does.

        A ``recovery`` read without taking the ranks over is read again, under a
        new fence, first: an older controller that is only stalled could have
        changed the ranks since (InvalidPlan when the operation is no longer
        the newest there)."""
        if not recovery.taken_over:
            fresh = await self.recover(plan, recovery.ranks or None, fence=new_fence())
            if fresh is None or fresh.op_id != recovery.op_id:
                raise InvalidPlan([f"{recovery.op_id!r} is no longer the newest operation of "
                                   f"{plan.name!r} on its ranks; recover() again"])
            recovery = fresh
        for rank in recovery.missing:
            self.quarantine(rank, recovery.op_id, "",
                            "did not answer the recovery of its operation",
                            postcondition=plan.postcondition)
        targets = tuple(r for r in recovery.ranks if r not in recovery.missing)
        for rank in targets:  # held only because this very operation was left unfinished
            held = self.quarantined.get(rank)
            if held is not None and held.op_id == recovery.op_id and not held.step:
                self.client.quarantine.remove(rank)
        if not targets:
            raise InvalidPlan([f"no rank of {recovery.op_id!r} answered its recovery"])
        core = await self._start(plan, targets, recovery.op_id, recovery.taken_over,
                                 on_progress)
        applied = {r: recovery.steps.get(r, ()) for r in targets}
        if recovery.action == "compensate":
            core.finish_compensation(applied, {r: recovery.undone.get(r, ()) for r in targets})
        else:
            core.resume_forward(applied)  # should it abort, what applied before is undone too
        return await self._drive(core)

    # -- observability ---------------------------------------------------------------
    def progress(self) -> dict[str, dict[str, Any]]:
        """Each operation in flight: its state, step and per-rank states."""
        return {op_id: core.snapshot() for op_id, core in self.active.items()}

    def metrics(self) -> dict[str, Any]:
        """Quarantined ranks (with why), operations in flight, counters, recent results."""
        return {
            "quarantined": self.client.quarantine.snapshot(),
            "routable": list(self.routable_ranks()),
            "active": self.progress(),
            "recent": [r.summary() for r in self.history],
            **self.counters,
        }

