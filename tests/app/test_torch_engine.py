"""A real engine on real processes: a torch decoder on CPU per rank, weights moved
by gloo broadcast from a trainer, one ctlwire operation per sync.

The equality check is the proof that weights really moved and were swapped at
once: after every sync each rank's greedy output for fixed prompts equals the
trainer's own model's. The faults: a rank killed mid-broadcast, a corrupt
weight file, a native call holding the GIL inside a step, pause(abort) under load.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import anyio
import msgspec

from ctlwire.app import torch_weight_sync
from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.app.torch_engine import (
    DecoderConfig,
    Generate,
    Pause,
    Submit,
    TorchFault,
    UpdateFromDisk,
    WeightsRef,
    save_weights,
)
from ctlwire.app.torch_weight_sync import Trainer, WeightSync, weight_sync_plan
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.operation_plan import OperationPlan, OperationStep, StepCall
from ctlwire.kernel.errors import EngineDead, OutcomeUnknown
from ctlwire.kernel.operations.runner import OperationRunner, ReleaseRefused
from ctlwire.states import OperationState
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

N = 3
CONFIG = DecoderConfig(vocab=128, width=192, layers=2, heads=4, context=32, seed=3)
PROMPTS = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
METHODS = "ctlwire.app.torch_engine:register"


def _fleet(folder: Path) -> tuple[str, EngineFleet]:
    os.chmod(folder, 0o700)
    address = f"ipc://{folder}/control.sock"
    env = dict(os.environ, CTLWIRE_TORCH_CONFIG=msgspec.json.encode(CONFIG).decode(),
               OMP_NUM_THREADS="1")
    return address, EngineFleet(N, lambda r: ["--connect", address, "--methods", METHODS,
                                                "--mode", "loop"],
                                env=env, ready_timeout=90)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[str, EngineFleet]]:
    """A fresh fleet, for the tests that kill ranks or assert the initial weights."""
    address, engines = _fleet(tmp_path)
    with engines:
        yield address, engines


@pytest.fixture(scope="module")
def shared_fleet(tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[tuple[str, EngineFleet]]:
    """One fleet for the tests that leave every rank serving (starting torch is slow)."""
    address, engines = _fleet(tmp_path_factory.mktemp("torch"))
    with engines:
        yield address, engines


def client_for(address: str) -> ControlClient:
    return ControlClient(ZmqRouterClientTransport(address), ranks=N, default_timeout=20.0)


async def infos(c: ControlClient, ranks: tuple[int, ...]) -> dict[int, Any]:
    res = await c.fan_out("get_server_info", ranks=ranks, mode="concurrent")
    res.raise_for_errors()
    return dict(res.results)


async def outputs(c: ControlClient, ranks: tuple[int, ...]) -> dict[int, Any]:
    res = await c.fan_out("generate", Generate(PROMPTS, 6), ranks=ranks, mode="concurrent")
    res.raise_for_errors()
    return dict(res.results)


async def test_weights_move_by_broadcast_and_every_rank_decodes_like_the_trainer(
        fleet: tuple[str, EngineFleet]) -> None:
    address, _ = fleet
    trainer = Trainer(CONFIG)
    async with client_for(address) as c:
        await c.wait_ready(timeout=30)
        runner = OperationRunner(c)
        before = await outputs(c, (0, 1, 2))
        assert before == {r: trainer.greedy(PROMPTS, 6) for r in range(N)}  # same seed
        seen: list[list[list[int]]] = []
        for it in range(1, 4):  # a group formed, then reused twice
            trainer.train(steps=2)
            sync = await trainer.sync(runner, update_timeout=30)
            assert sync.result.ok, (sync.result.summary(), sync.sender_error)
            assert not sync.sender_error
            expected = trainer.greedy(PROMPTS, 6)
            assert await outputs(c, (0, 1, 2)) == {r: expected for r in range(N)}, it
            seen.append(expected)
            for r, info in (await infos(c, (0, 1, 2))).items():
                assert (info["version"], info["checksum"], info["paused"]) == (
                    it, trainer.checksum(), False), r
                assert info["groups_formed"] == 1  # formed once, reused
        assert len({str(s) for s in seen}) > 1  # training really changed the outputs


async def _sync_timed_from_death(trainer: Trainer, runner: OperationRunner,
                                 engine: subprocess.Popen[str], **options: Any
                                 ) -> tuple[WeightSync, float]:
    """``trainer.sync`` while ``engine`` dies mid-broadcast; the sync and how long
    after the death it returned (s)."""
    died: list[float] = []

    async def watch() -> None:
        while engine.poll() is None:
            await anyio.sleep(0.01)
        died.append(time.monotonic())

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        sync = await trainer.sync(runner, **options)
        returned = time.monotonic()
        with anyio.fail_after(10):
            while not died:
                await anyio.sleep(0.01)
    return sync, returned - died[0]


async def test_rank_killed_mid_broadcast_survivors_freed_by_liveness_not_timeout(
        fleet: tuple[str, EngineFleet]) -> None:
    address, engines = fleet
    trainer = Trainer(CONFIG)
    async with client_for(address) as c:
        await c.wait_ready(timeout=30)
        runner = OperationRunner(c)
        trainer.train()
        assert (await trainer.sync(runner, update_timeout=30)).result.ok
        await c.call("arm_fault", TorchFault("crash_mid_broadcast", after=3), rank=1)
        trainer.train()
        # the collective's own timeout is 36 s (60 * collective_share)
        sync, after_death = await _sync_timed_from_death(trainer, runner,
                                                         engines.engines[1].proc,
                                                         update_timeout=60)
        result = sync.result
        assert engines.engines[1].proc.wait(timeout=10) == 9
        # the lost rank's step ended as it was lost; its controller aborted the step on
        # the survivors, whose broadcasts gave up, answered, and were compensated back to
        # version 1, long before the collective's timeout; the sync returned then
        print(f"\nsync returned {after_death:.2f} s after the rank died")
        assert after_death < 15, (after_death, result.summary(), sync.sender_error)
        assert result.state is OperationState.DEGRADED, result.summary()
        assert result.quarantined == (1,) and result.compensated == (0, 2), result.summary()
        assert result.ranks[1].failed_step == "update", result.ranks[1]
        assert isinstance(result.ranks[1].error, OutcomeUnknown), result.ranks[1]
        for r in (0, 2):
            assert result.ranks[r].failed_step == "update", result.ranks[r]
            assert "aborted by the operation's controller" in result.ranks[r].detail, (
                result.ranks[r].detail)
        info = await infos(c, (0, 2))
        assert {(i["version"], i["paused"], i["group"], i["transfers_aborted"])
                for i in info.values()} == {(1, False, "", 1)}  # old weights, serving
        assert runner.routable_ranks() == (0, 2)
        # the next sync forms a new group with the survivors and commits there; with a
        # rank out of the fleet, it is not ok
        trainer.train()
        again = await trainer.sync(runner, update_timeout=30)
        assert again.result.state is OperationState.COMMITTED, again.result.summary()
        assert again.result.committed == (0, 2) and not again.result.ok
        assert again.result.left_out == {1: "quarantined"}
        expected = trainer.greedy(PROMPTS, 6)
        assert await outputs(c, (0, 2)) == {0: expected, 2: expected}
        # the rank restarts on the initial weights: not released, until caught up
        engines.restart(1)
        await c.wait_ready(timeout=30)
        with pytest.raises(ReleaseRefused, match="'version': 3"):
            await runner.release(1)
        assert runner.routable_ranks() == (0, 2)
        caught_up = await trainer.catch_up(runner, 1, update_timeout=30)
        assert caught_up.result.ok, (caught_up.result.summary(), caught_up.sender_error)
        assert runner.routable_ranks() == (0, 1, 2)
        assert await outputs(c, (0, 1, 2)) == {r: expected for r in range(N)}
        info = await infos(c, (0, 1, 2))
        assert {(i["version"], i["checksum"], i["paused"]) for i in info.values()} == {
            (3, trainer.checksum(), False)}


async def test_a_broadcast_blocked_past_the_operation_is_abandoned_not_awaited(
        fleet: tuple[str, EngineFleet], monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer's own broadcast may stay blocked in gloo until the collective's
    timeout when a peer dies (no connection reset reaches it): the sync still
    returns when the operation ends, its thread abandoned."""
    address, engines = fleet
    broadcast = torch_weight_sync._Group.broadcast

    def broadcast_then_block(group: Any, tensors: Any, timeout: float) -> None:
        try:
            broadcast(group, tensors, timeout)
        finally:
            time.sleep(timeout)  # as gloo does until the collective's timeout

    trainer = Trainer(CONFIG)
    async with client_for(address) as c:
        await c.wait_ready(timeout=30)
        runner = OperationRunner(c)
        await c.call("arm_fault", TorchFault("crash_mid_broadcast", after=3), rank=1)
        trainer.train()
        monkeypatch.setattr(torch_weight_sync._Group, "broadcast", broadcast_then_block)
        sync, after_death = await _sync_timed_from_death(trainer, runner,
                                                         engines.engines[1].proc,
                                                         update_timeout=60)
        print(f"\nsync returned {after_death:.2f} s after the rank died, its broadcast "
              "still blocked")
        assert after_death < 15, (after_death, sync.result.summary())
        assert sync.result.state is OperationState.DEGRADED, sync.result.summary()
        assert sync.sender_error == ("abandoned: the operation ended during the trainer's "
                                     "broadcast")
        assert trainer.group is None and trainer.served.version == 0  # nothing committed


async def test_corrupt_or_mismatched_weight_file_is_refused_old_weights_kept(
        shared_fleet: tuple[str, EngineFleet], tmp_path: Path) -> None:
    address, _ = shared_fleet
    trainer = Trainer(CONFIG)
    async with client_for(address) as c:
        await c.wait_ready(timeout=30)
        runner = OperationRunner(c)
        old = (await infos(c, (0,)))[0]
        trainer.train()
        good = str(tmp_path / "w.pt")
        new = old["version"] + 1
        digest = save_weights(trainer.model, good, new)
        corrupt = str(tmp_path / "corrupt.pt")
        data = Path(good).read_bytes()
        Path(corrupt).write_bytes(data[: len(data) // 2])

        def plan(path: str, declared: str) -> OperationPlan:
            back = WeightsRef(old["version"], old["checksum"])
            return OperationPlan("disk-update", (
                OperationStep("pause", "pause", Pause("keep"), 10,
                              compensation=StepCall("resume")),
                OperationStep("update", "update_weights_from_disk",
                              UpdateFromDisk(new, path, declared), 20,
                              compensation=StepCall("rollback_weights", back)),
                OperationStep("resume", "resume", None, 10)))

        for path, declared in ((corrupt, digest), (good, "0" * 64)):
            result = await runner.run(plan(path, declared))
            assert result.state is OperationState.ABORTED, result.summary()
            assert result.compensated == (0, 1, 2)
            assert all("WeightsRefused" in result.ranks[r].detail for r in range(N))
            for r, info in (await infos(c, (0, 1, 2))).items():
                assert (info["version"], info["checksum"], info["paused"]) == (
                    old["version"], old["checksum"], False), r
        result = await runner.run(plan(good, digest))
        assert result.ok, result.summary()
        assert await outputs(c, (0, 1, 2)) == {r: trainer.greedy(PROMPTS, 6) for r in range(N)}


async def test_native_call_holding_the_gil_in_a_step_is_busy_not_dead(
        fleet: tuple[str, EngineFleet]) -> None:
    """The beacon is a Python thread: a native call holding the GIL silences it. A
    client whose liveness window covers the engine's longest such call keeps the rank
    alive through it, and still sees a kill -9 at once (the connection closes)."""
    address, engines = fleet
    hold, interval = 2.0, 0.25
    window = int(3 * hold / interval)  # heartbeat misses allowed: 9 s of silence
    transport = ZmqRouterClientTransport(address)
    async with ControlClient(transport, ranks=N, default_timeout=20.0,
                             heartbeat_interval=interval, heartbeat_misses=window) as c:
        await c.wait_ready(timeout=30)
        await c.call("arm_fault", TorchFault("hold_gil", seconds=hold), rank=0)
        # the next step holds the GIL; a call the loop runs after it waits, then is answered
        assert await c.call("sequences", [], rank=0, timeout=30) == []
        info = await c.call("get_server_info", rank=0, timeout=30)
        assert info["pid"] == engines.engines[0].pid
        assert c.metrics()["counters"]["engine_lost"] == 0
        # the wide window does not hide a crash: it is seen before 9 s of silence pass
        engines.kill(0)
        with pytest.raises(EngineDead):
            await c.call("get_server_info", rank=0, timeout=window * interval - 1)
        assert c.metrics()["counters"]["engine_lost"] == 1


async def test_pause_abort_under_load_ends_sequences_with_abort_status(
        shared_fleet: tuple[str, EngineFleet]) -> None:
    address, _ = shared_fleet
    async with client_for(address) as c:
        await c.wait_ready(timeout=30)
        ids = await c.call("submit", Submit([[1, 2, 3]] * 16, max_new_tokens=10_000), rank=2)
        await c.call("sequences", ids, rank=2)
        paused = await c.call("pause", Pause("abort"), rank=2, timeout=10)
        assert paused["running"] == 0
        statuses = await c.call("sequences", ids, rank=2)
        assert {s["status"] for s in statuses} == {"aborted"}
        steps = (await infos(c, (2,)))[2]["steps"]
        assert steps > 0 and (await infos(c, (2,)))[2]["steps"] == steps  # nothing advances
        await c.call("resume", rank=2)
        ids = await c.call("submit", Submit([[4, 5]], max_new_tokens=3), rank=2)
        for _ in range(400):  # bounded wait for the new sequence to finish
            s = (await c.call("sequences", ids, rank=2))[0]
            if s["status"] != "running":
                break
            await anyio.sleep(0.05)
        assert s["status"] == "finished" and len(s["tokens"]) == 3, s


TRAINER_SCRIPT = """
import sys, time, anyio, msgspec
from ctlwire.app import torch_weight_sync as tws
from ctlwire.app.torch_engine import DecoderConfig
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.operations.runner import OperationRunner, ReleaseRefused
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

def stuck(self, tensors, timeout):   # the trainer is killed before its broadcast ends
    time.sleep(1.0)  # the engines have the update request: they wait in the broadcast
    print("BROADCASTING", flush=True)
    time.sleep(600)

tws._Group.broadcast = stuck

async def main():
    config = msgspec.json.decode(sys.argv[2], type=DecoderConfig)
    async with ControlClient(ZmqRouterClientTransport(sys.argv[1]), ranks=3) as c:
        await c.wait_ready(timeout=30)
        trainer = tws.Trainer(config)
        trainer.train()
        await trainer.sync(OperationRunner(c), update_timeout=30)

anyio.run(main)
"""


async def test_trainer_killed_mid_broadcast_a_restarted_trainer_recovers(
        shared_fleet: tuple[str, EngineFleet], tmp_path: Path) -> None:
    address, _ = shared_fleet
    async with client_for(address) as c:
        await c.wait_ready(timeout=30)
        before = (await infos(c, (0,)))[0]
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER_SCRIPT)
    proc = subprocess.Popen([sys.executable, str(script), address,
                             msgspec.json.encode(CONFIG).decode()],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = await anyio.to_thread.run_sync(proc.stdout.readline)
        assert line.strip() == "BROADCASTING", line
    finally:
        proc.kill()
        proc.wait(timeout=10)
    # a new trainer (a new client, a new process state) takes over
    trainer = Trainer(CONFIG)
    async with client_for(address) as c:
        await c.wait_ready(timeout=30)
        runner = OperationRunner(c)
        recovery = await trainer.recover(runner, timeout=30)  # past any collective's
        assert recovery is not None and not recovery.complete
        assert recovery.steps == {r: ("pause", "group") for r in range(N)}, recovery
        info = await infos(c, (0, 1, 2))  # answered: nothing hangs on the dead root
        assert {(i["version"], i["checksum"], i["paused"]) for i in info.values()} == {
            (before["version"], before["checksum"], True)}  # old weights, left paused
        assert trainer.served == WeightsRef(before["version"], before["checksum"])
        trainer.train()
        sync = await trainer.sync(runner, update_timeout=30)
        assert sync.result.ok, (sync.result.summary(), sync.sender_error)
        expected = trainer.greedy(PROMPTS, 6)
        assert await outputs(c, (0, 1, 2)) == {r: expected for r in range(N)}
        info = await infos(c, (0, 1, 2))
        now = (trainer.version, trainer.checksum(), False)
        assert trainer.version > before["version"]
        assert {(i["version"], i["checksum"], i["paused"]) for i in info.values()} == {now}
        # the dead trainer's operation cannot come back: fenced out everywhere
        stale = await runner.run(weight_sync_plan(9, "", [], WeightsRef(0, ""), group=None,
                                                  update_timeout=5),
                                 op_id=recovery.op_id, fence=recovery.fence)
        assert stale.state is OperationState.SUPERSEDED, stale.summary()
        assert {(i["version"], i["checksum"], i["paused"])
                for i in (await infos(c, (0, 1, 2))).values()} == {now}
