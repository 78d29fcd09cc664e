"""The trainer side of RL weight sync with :mod:`~ctlwire.kernel.app.torch_engine` ranks.

::

    trainer = Trainer(DecoderConfig())
    runner = OperationRunner(client)
    for _ in range(iterations):
        trainer.train(steps=2)                     # the weights change
        sync = await trainer.sync(runner)          # one operation; WeightSync
        assert sync.result.ok, sync.result.summary()

:meth:`Trainer.sync` runs one operation on the runner's routable ranks:
``pause`` -> ``init_weights_update_group`` (only when the trainer has no group
with exactly those ranks) -> ``update_weights_from_distributed`` ->
``check_weights`` (every rank holds the trainer's version and checksum) ->
``resume``, with compensations (resume, destroy the group, roll the weights
back), and a post-condition read after ``resume``: every rank serves that
version and checksum, not paused. The ranks it left out (quarantined, not
admitted) count against ``sync.result.ok``; a quarantined rank is released only
once it serves what the fleet serves, which :meth:`Trainer.catch_up` brings it to.

The trainer's own side of each collective (joining the group, the broadcasts)
blocks a thread: it runs in a daemon thread of its own, started when the
operation dispatches that step, so the client's event loop keeps serving replies
and heartbeats meanwhile. The sync returns when the operation ends: a broadcast
still blocked then (a peer lost mid-collective) is abandoned, its group dropped;
the thread ends by the collective's own timeout and never keeps the process
alive.

Deadlines: each collective's timeout is the step's timeout minus a margin
(``collective_share`` of it), so a rank blocked in a broadcast with a dead peer
errors out, answers, and is compensated before the step's deadline; gloo's
30-minute default never applies. Sooner still: a rank lost mid-broadcast makes
the runner abort the update on the others (``ctlwire.abort_step``), whose
broadcasts give up within a fraction of a second of the loss. When an operation
does not commit, the trainer drops its group; the next operation forms a new one.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel
import torch

from ctlwire.kernel.app.torch_messages import (
    GroupSpec,
    Pause,
    TensorMeta,
    UpdateFromDistributed,
    WeightsRef,
    broadcast_options,
    gloo_group,
    gloo_store,
)
from ctlwire.kernel.app.torch_model import DecoderConfig, TinyDecoder, checksum, greedy
from ctlwire.kernel.core.operation_plan import (
    OperationPlan,
    OperationStep,
    PostCondition,
    StepCall,
)
from ctlwire.kernel.core.operation_result import OperationResult, ProgressEvent
from ctlwire.kernel.operation_runner import OperationRunner, Recovery
from ctlwire.states import OperationState, RankState

__all__ = ["Trainer", "WeightSync", "served_postcondition", "weight_sync_plan"]

_names = itertools.count()
_T = TypeVar("_T")


async def _in_daemon_thread(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` in a daemon thread of its own, awaited. Cancelling the caller
    abandons the thread: it runs to its end unawaited and never keeps the process
    alive (a thread of anyio's pool would be waited for by a cancellation, or at
    exit)."""
    token = anyio.lowlevel.current_token()
    done = anyio.Event()
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, fn(*args)))
        except BaseException as exc:
            outcome.append((False, exc))
        with contextlib.suppress(RuntimeError):  # the event loop ended: nobody waits
            anyio.from_thread.run_sync(done.set, token=token)

    threading.Thread(target=run, daemon=True, name="ctlwire-trainer-collective").start()
    await done.wait()
    ok, value = outcome.pop()
    if ok:
        return value  # type: ignore[no-any-return]
    raise value


def served_postcondition(version: int, digest: str, timeout: float = 10.0) -> PostCondition:
    """What a rank serving weights ``version`` (checksum ``digest``) answers to
    ``get_server_info``: that version and checksum, not paused."""
    return PostCondition("get_server_info", {"version": version, "checksum": digest,
                                             "paused": False}, timeout=timeout)


def weight_sync_plan(version: int, digest: str, tensors: list[TensorMeta], old: WeightsRef, *,
                     group: GroupSpec | None, update_timeout: float, pause_mode: str = "abort",
                     timeout: float = 10.0, collective_share: float = 0.6) -> OperationPlan:
    """The weight-sync operation; ``group`` None: the ranks already hold the group.
    Its post-condition (:func:`served_postcondition`) is what a quarantined rank
    must meet before ``runner.release`` puts it back."""
    update = UpdateFromDistributed(version, digest, tensors, update_timeout * collective_share)
    steps = [OperationStep("pause", "pause", Pause(pause_mode), timeout,
                           compensation=StepCall("resume"))]
    if group is not None:
        steps.append(OperationStep("group", "init_weights_update_group", group,
                                   group.timeout / collective_share,
                                   compensation=StepCall("destroy_weights_update_group")))
    steps += [
        OperationStep("update", "update_weights_from_distributed", update, update_timeout,
                      compensation=StepCall("rollback_weights", old)),
        OperationStep("check", "check_weights", WeightsRef(version, digest), timeout),
        OperationStep("resume", "resume", None, timeout),
    ]
    return OperationPlan("weight-sync", tuple(steps),
                         served_postcondition(version, digest, timeout))


@dataclass
class WeightSync:
    """One sync: the operation's result, the trainer side's error (if any; an
    abandoned collective says so), timings (s)."""

    result: OperationResult
    plan: OperationPlan
    version: int
    checksum: str
    sender_error: str = ""
    seconds: float = 0.0
    transfer_seconds: float = 0.0      # the trainer's broadcasts
    group_seconds: float = 0.0         # the trainer joining the group
    events: list[ProgressEvent] = field(default_factory=list)


class _Group:
    """The trainer's side of one gloo group (rank 0, owns the store)."""

    def __init__(self, ranks: tuple[int, ...], host: str, timeout: float) -> None:
        self.ranks = ranks
        self.timeout = timeout
        self.name = f"ctlwire-weights-{next(_names)}"
        self.store = gloo_store(host, 0, len(ranks) + 1, is_master=True, timeout=timeout)
        self.spec = GroupSpec(host, self.store.port, list(ranks), self.name, timeout)
        self.pg: Any = None

    def join(self) -> None:
        self.pg = gloo_group(self.store, self.name, 0, len(self.ranks) + 1, self.timeout)

    def broadcast(self, tensors: list[torch.Tensor], timeout: float) -> None:
        assert self.pg is not None, "join() first"
        opts = broadcast_options(timeout)
        for t in tensors:
            self.pg.broadcast([t], opts).wait()


class Trainer:
    """A model that trains on random tokens and pushes its weights to engine ranks."""

    def __init__(self, config: DecoderConfig | None = None, *, host: str = "127.0.0.1",
                 lr: float = 1e-3, seed: int = 1) -> None:
        self.model = TinyDecoder(config or DecoderConfig())
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)
        self.host = host
        self.data = torch.Generator().manual_seed(seed)
        self.version = 0
        self.served = WeightsRef(0, self.checksum())  # what the fleet serves (last committed)
        # its weights, kept for a catch-up (None: not held, e.g. learned from the ranks)
        self._served_state: dict[str, torch.Tensor] | None = {
            k: v.detach().clone() for k, v in self.model.state_dict().items()}
        self.group: _Group | None = None

    def checksum(self) -> str:
        return checksum(self.model.state_dict())

    def train(self, steps: int = 2, batch: int = 8, length: int = 16) -> float:
        """A few optimizer steps of next-token prediction on random tokens; a new version."""
        cfg = self.model.config
        self.model.train()
        loss = torch.zeros(())
        for _ in range(steps):
            ids = torch.randint(0, cfg.vocab, (batch, length + 1), generator=self.data)
            logits = self.model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab),
                                                     ids[:, 1:].reshape(-1))
            self.optimizer.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            self.optimizer.step()
        self.model.eval()
        self.version += 1
        return float(loss.detach())

    def greedy(self, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
        """Greedy decoding with one intra-op thread, as the engines decode (another
        thread count may split a matrix product differently and change its last bits)."""
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return greedy(self.model, prompts, new_tokens)
        finally:
            torch.set_num_threads(threads)

    async def recover(self, runner: OperationRunner, timeout: float = 5.0) -> Recovery | None:
        """The newest weight sync some rank applied steps of (a restarted trainer asks).

        A sync a dead trainer left undecided (ranks paused, maybe holding a group
        whose root is gone) is finished by the next :meth:`sync`: its fence is newer,
        so the old operation is fenced out; ``pause`` is idempotent, a new group
        replaces the dangling one, and the new weights are checked on every rank."""
        any_plan = weight_sync_plan(0, "", [], self.served, group=None, update_timeout=1.0)
        recovery = await runner.recover(any_plan, timeout=timeout)
        await self.learn_served(runner, timeout)
        return recovery

    async def learn_served(self, runner: OperationRunner, timeout: float = 5.0) -> bool:
        """Take what the routable ranks serve as the rollback target, when they all
        agree (a restarted trainer does not know it); its next version is newer."""
        try:
            res = await runner.client.fan_out("get_server_info", ranks=runner.routable_ranks(),
                                              timeout=timeout, mode="concurrent")
        except Exception:  # timeouts, dead ranks: keep what we had
            return False
        served = {(v["version"], v["checksum"]) for v in res.results.values()}
        if len(served) != 1 or len(res.results) != len(runner.routable_ranks()):
            return False
        version, digest = served.pop()
        self.served = WeightsRef(version, digest)
        self.version = max(self.version, version)
        return True

    async def sync(self, runner: OperationRunner, *, update_timeout: float = 20.0,
                   group_timeout: float = 10.0, pause_mode: str = "abort",
                   collective_share: float = 0.6) -> WeightSync:
        """Push the current weights to ``runner``'s routable ranks as one operation.

        Returns when the operation ends, whatever the trainer's own collective is
        doing (a broadcast still blocked then is abandoned). ``sync.result.ok``
        only when it committed on every rank of the fleet: ranks left out
        (``sync.result.left_out``) count. What the fleet serves changes once it
        committed on the ranks it ran on (``sync.result.state``)."""
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        sync = await self._push(runner, None, state, self.version, self.served,
                                update_timeout=update_timeout, group_timeout=group_timeout,
                                pause_mode=pause_mode, collective_share=collective_share)
        if sync.result.state is OperationState.COMMITTED and not sync.sender_error:
            self.served = WeightsRef(sync.version, sync.checksum)
            self._served_state = state
        return sync

    async def catch_up(self, runner: OperationRunner, rank: int, *,
                       update_timeout: float = 20.0, group_timeout: float = 10.0,
                       collective_share: float = 0.6, timeout: float = 10.0) -> WeightSync:
        """Bring quarantined ``rank`` to what the fleet serves and back into routing:
        the weights of the last sync that committed, pushed to that rank alone
        (``runner.catch_up``: released once the post-condition holds there), with
        a group of its own. Raises InvalidPlan as ``runner.catch_up`` does, and
        ValueError when this trainer does not hold the weights the fleet serves
        (a restarted trainer that learned them from the ranks: sync first)."""
        served = self._served_state
        if served is None or checksum(served) != self.served.checksum:
            raise ValueError(f"this trainer does not hold the weights the fleet serves "
                             f"(version {self.served.version}): sync() first")
        info = await runner.client.call("get_server_info", rank=rank, timeout=timeout)
        return await self._push(runner, rank, served, self.served.version,
                                WeightsRef(info["version"], info["checksum"]),
                                update_timeout=update_timeout, group_timeout=group_timeout,
                                pause_mode="abort", collective_share=collective_share)

    async def _push(self, runner: OperationRunner, rank: int | None,
                    state: dict[str, torch.Tensor], version: int, rollback: WeightsRef, *,
                    update_timeout: float, group_timeout: float, pause_mode: str,
                    collective_share: float) -> WeightSync:
        """``state`` as ``version`` to the routable ranks (``rank`` None: one
        operation, the fleet's group reused while its ranks are the same) or, as a
        catch-up, to ``rank`` alone (a group of its own); ``rollback``: what the
        ranks go back to should it not commit."""
        ranks = runner.routable_ranks() if rank is None else (rank,)
        if rank is None and self.group is not None and self.group.ranks != ranks:
            self.group = None
        group = (self.group if rank is None else None) or _Group(
            ranks, self.host, group_timeout * collective_share)
        new_group = group is not self.group
        names = list(state)
        metas = [TensorMeta(n, list(state[n].shape), str(state[n].dtype)) for n in names]
        digest = checksum(state)
        plan = weight_sync_plan(version, digest, metas, rollback,
                                group=group.spec if new_group else None,
                                update_timeout=update_timeout, pause_mode=pause_mode,
                                collective_share=collective_share)
        started = {"group": anyio.Event(), "update": anyio.Event()}
        sent = anyio.Event()
        sync = WeightSync(None, plan, version, digest)  # type: ignore[arg-type]
        collective = update_timeout * collective_share

        def on_progress(ev: ProgressEvent) -> None:
            sync.events.append(ev)
            if ev.state is RankState.APPLYING and ev.step in started and ev.phase == "apply":
                started[ev.step].set()

        async def sender() -> None:
            step = "group"
            try:
                if new_group:
                    await started["group"].wait()
                    t0 = time.perf_counter()
                    await _in_daemon_thread(group.join)
                    sync.group_seconds = time.perf_counter() - t0
                step = "update"
                await started["update"].wait()
                t0 = time.perf_counter()
                await _in_daemon_thread(group.broadcast, [state[n] for n in names], collective)
                sync.transfer_seconds = time.perf_counter() - t0
            except anyio.get_cancelled_exc_class():
                if started[step].is_set():  # its collective runs on, unawaited
                    sync.sender_error = ("abandoned: the operation ended during the "
                                         f"trainer's {'join' if step == 'group' else 'broadcast'}")
                raise
            except Exception as exc:
                sync.sender_error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            finally:
                sent.set()

        start = time.perf_counter()
        result: Any = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(sender)
            try:
                result = await (runner.run(plan, on_progress=on_progress) if rank is None
                                else runner.catch_up(plan, rank, on_progress=on_progress))
            finally:
                if result is not None and result.state is OperationState.COMMITTED:
                    # every rank received the weights: the sender is done, or about to be
                    with anyio.move_on_after(1.0):
                        await sent.wait()
                tg.cancel_scope.cancel()  # whatever it still waits for is abandoned
        sync.result = result
        sync.seconds = time.perf_counter() - start
        if rank is None:  # a group that lost a collective is not reused
            committed = result.state is OperationState.COMMITTED and not sync.sender_error
            self.group = group if committed else None
        return sync
