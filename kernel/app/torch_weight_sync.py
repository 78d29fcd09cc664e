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
``check_weights`` (the post-condition: every rank serves the trainer's version
and checksum) -> ``resume``, with compensations (resume, destroy the group,
roll the weights back). The trainer's own side of each collective (joining the
group, the broadcasts) blocks a thread: it runs in a worker thread
(``anyio.to_thread``) started when the operation dispatches that step, so the
client's event loop keeps serving replies and heartbeats meanwhile.

Deadlines: each collective's timeout is the step's timeout minus a margin
(``collective_share`` of it), so a rank blocked in a broadcast with a dead peer
errors out, answers, and is compensated before the step's deadline; gloo's
30-minute default never applies. Sooner still: a rank lost mid-broadcast makes
the runner abort the update on the others (``ctlwire.abort_step``), whose
broadcasts give up within a fraction of a second of the loss. When an operation
does not commit, the trainer drops its group; the next operation forms a new one.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
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
from ctlwire.kernel.core.operation_plan import OperationPlan, OperationStep, StepCall
from ctlwire.kernel.core.operation_result import OperationResult, ProgressEvent
from ctlwire.kernel.operation_runner import OperationRunner, Recovery
from ctlwire.states import RankState

__all__ = ["Trainer", "WeightSync", "weight_sync_plan"]

_names = itertools.count()


def weight_sync_plan(version: int, digest: str, tensors: list[TensorMeta], old: WeightsRef, *,
                     group: GroupSpec | None, update_timeout: float, pause_mode: str = "abort",
                     timeout: float = 10.0, collective_share: float = 0.6) -> OperationPlan:
    """The weight-sync operation; ``group`` None: the ranks already hold the group."""
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
    return OperationPlan("weight-sync", tuple(steps))


@dataclass
class WeightSync:
    """One sync: the operation's result, the trainer side's error (if any), timings (s)."""

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

    def drop_group(self) -> None:
        self.group = None

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
        """Push the current weights to ``runner``'s routable ranks as one operation."""
        ranks = runner.routable_ranks()
        if self.group is not None and self.group.ranks != ranks:
            self.group = None
        group = self.group or _Group(ranks, self.host, group_timeout * collective_share)
        new_group = group is not self.group
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        names = list(state)
        metas = [TensorMeta(n, list(state[n].shape), str(state[n].dtype)) for n in names]
        digest = checksum(state)
        plan = weight_sync_plan(self.version, digest, metas, self.served,
                                group=group.spec if new_group else None,
                                update_timeout=update_timeout, pause_mode=pause_mode,
                                collective_share=collective_share)
        started = {"group": anyio.Event(), "update": anyio.Event()}
        sync = WeightSync(None, plan, self.version, digest)  # type: ignore[arg-type]
        collective = update_timeout * collective_share

        def on_progress(ev: ProgressEvent) -> None:
            sync.events.append(ev)
            if ev.state is RankState.APPLYING and ev.step in started and ev.phase == "apply":
                started[ev.step].set()

        async def sender() -> None:
            try:
                if new_group:
                    await started["group"].wait()
                    t0 = time.perf_counter()
                    await anyio.to_thread.run_sync(group.join)
                    sync.group_seconds = time.perf_counter() - t0
                await started["update"].wait()
                t0 = time.perf_counter()
                await anyio.to_thread.run_sync(group.broadcast, [state[n] for n in names],
                                               collective)
                sync.transfer_seconds = time.perf_counter() - t0
            except Exception as exc:
                sync.sender_error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"

        start = time.perf_counter()
        result: Any = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(sender)
            try:
                result = await runner.run(plan, ranks=ranks, on_progress=on_progress)
            finally:
                # a step that never started: its collective is not waited for
                if not started["update"].is_set():
                    tg.cancel_scope.cancel()
        sync.result = result
        sync.seconds = time.perf_counter() - start
        if result.ok and not sync.sender_error:
            self.group = group
            self.served = WeightsRef(self.version, digest)
        else:
            self.group = None  # a group that lost a collective is not reused
        return sync
