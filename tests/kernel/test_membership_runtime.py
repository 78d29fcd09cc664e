"""Ranks added, removed and admitted at run time, on real engine processes over ipc,
both backends: queued fan-outs keep FIFO order and every outcome across membership
changes, a pending call to a removed rank fails typed (NotDelivered or
OutcomeUnknown, and which one is true of what ran), and a joining rank is left out
of default fan-outs and operations until it is admitted and meets the fleet's
admission condition."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.app.operation_engine import weight_update_plan
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.fan_out_result import FanOutResult
from ctlwire.kernel.core.membership import ChangeKind
from ctlwire.kernel.core.quarantine import Quarantine
from ctlwire.kernel.errors import NoAdmissibleRanks, NotDelivered, OutcomeUnknown
from ctlwire.kernel.operations.runner import OperationRunner
from ctlwire.transports.envelope import Heartbeat
from ctlwire.transports.errors import Unroutable
from ctlwire.transports.zmq_client import ZmqDealerClientTransport, ZmqRouterClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

ENGINES = Path(__file__).resolve().parent / "membership_engines"
METHODS = "fleet_engine:register"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, EngineFleet]]:
    """Four engines (ranks 0..3) connecting to a client ROUTER at one ipc address;
    each test's client binds it in turn and starts with a subset of the ranks."""
    tmp = tmp_path_factory.mktemp("membership")
    os.chmod(tmp, 0o700)
    address = f"ipc://{tmp}/control.sock"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ENGINES),
                                                      env.get("PYTHONPATH", "")]))
    with EngineFleet(4, lambda r: ["--connect", address, "--methods", METHODS],
                     env=env) as f:
        yield address, f


def client_for(address: str, ranks: tuple[int, ...]) -> ControlClient:
    return ControlClient(ZmqRouterClientTransport(address), ranks=ranks, default_timeout=30.0)


async def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)


async def test_membership_changes_during_queued_fan_outs_keep_fifo_and_every_outcome(
        fleet: tuple[str, EngineFleet], tmp_path: Path) -> None:
    address, _ = fleet
    tag = uuid.uuid4().hex[:8]
    outcomes: dict[int, FanOutResult] = {}
    async with client_for(address, (0, 1, 2)) as c:
        await c.wait_ready(timeout=30)
        box = c.mailbox("mark")

        async def mark(i: int) -> None:
            outcomes[i] = await c.fan_out("mark", f"{tag}-{i}")

        # the engines' threads block until released: the first fan-out stays in
        # flight and the next ones queue behind it in the mailbox
        release = tmp_path / "release"
        await c.fan_out("block_next_step_until", str(release), mode="concurrent")
        async with anyio.create_task_group() as tg:
            for i in range(6):
                tg.start_soon(mark, i)
                # arrived in order: the first holds the mailbox (its request is
                # registered), each next one is queued before another starts
                await wait_until(lambda i=i: box.depth == i and c.registry.live_count == 1)
            assert not outcomes  # still in flight and queued
            c.add_rank(3)
            c.admit(3)
            c.remove_rank(2)
            assert c.ranks == (0, 1, 3)
            for i in range(6, 9):
                tg.start_soon(mark, i)
                await wait_until(lambda i=i: box.depth == i)
            release.touch()
        assert sorted(outcomes) == list(range(9))  # every caller got its outcome
        for i in range(6):
            res = outcomes[i]
            assert res.ranks == (0, 1, 2)  # the rank set each started with
            assert sorted(res.results) == [0, 1]
            error = res.errors[2]
            # the one in flight had been handed over (it may have run); the queued
            # ones were never sent to the removed rank
            assert type(error) is (OutcomeUnknown if i == 0 else NotDelivered), (i, error)
            assert "removed" in str(error) or "not sent" in str(error)
        for i in range(6, 9):
            assert outcomes[i].ranks == (0, 1, 3) and outcomes[i].ok
        # FIFO on every rank, across the changes
        order = [f"{tag}-{i}" for i in range(9)]
        for rank, expected in ((0, order), (1, order), (3, order[6:])):
            marks = await c.call("marks", rank=rank)
            assert [m for m in marks if m.startswith(tag)] == expected, rank
        # rank 2 comes back (named explicitly: it is not admitted): what it ran is
        # exactly what the errors said could have run
        c.add_rank(2)
        assert c.rank_status(2)["excluded"] == "not admitted"
        marks = await c.call("marks", rank=2)
        assert [m for m in marks if m.startswith(tag)] == [f"{tag}-0"]
        counters = c.metrics()["membership"]["counters"]
        assert (counters["added"], counters["removed"], counters["admitted"]) == (2, 1, 1)


async def test_pending_call_to_a_removed_rank_fails_typed(
        fleet: tuple[str, EngineFleet]) -> None:
    address, _ = fleet
    async with client_for(address, (0, 1)) as c:
        await c.wait_ready(timeout=30)
        caught: list[BaseException] = []

        async def call(method: str, payload: Any, rank: int) -> None:
            try:
                await c.call(method, payload, rank=rank)
            except Exception as exc:
                caught.append(exc)

        async with anyio.create_task_group() as tg:
            # handed over and running on rank 1: it may have run
            tg.start_soon(call, "sleep", 1.0, 1)
            # the engine reports running this very request (not an earlier one)
            await wait_until(lambda: c.rank_status(1)["request"]
                             in {e.id for e in c.registry.live() if e.is_open})
            c.remove_rank(1)
        assert len(caught) == 1 and type(caught[0]) is OutcomeUnknown
        assert "removed from the membership" in str(caught[0])
        assert not c.rank_status(1)["present"]
        # naming the removed rank (an operation that started with it): not sent
        with pytest.raises(NotDelivered):
            await c.call("echo", 1, rank=1)
        res = await c.fan_out("echo", 1, ranks=(0, 1))
        assert res.results == {0: 1} and type(res.errors[1]) is NotDelivered
        with pytest.raises(ValueError):
            await c.call("echo", 1, rank=5)  # never one of its ranks
        # a rank added but never heard from: the call waits for its first contact,
        # never handed over; removed meanwhile, it certainly did not run
        c.add_rank(9)
        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "echo", 1, 9)
            await wait_until(lambda: c.registry.live_count == 1)
            c.remove_rank(9)
        assert len(caught) == 2 and type(caught[1]) is NotDelivered
        assert "removed from the membership" in str(caught[1])
        # the other rank was never disturbed
        assert await c.call("echo", 5, rank=0) == 5


async def test_joining_rank_is_left_out_until_admitted_and_at_the_fleet_version(
        fleet: tuple[str, EngineFleet]) -> None:
    address, _ = fleet
    async with client_for(address, (0, 1)) as c:
        await c.wait_ready(timeout=30)
        runner = OperationRunner(c)
        before = await c.fan_out("get_server_info", mode="concurrent")
        old = before.value(0)["version"]
        version = old + 1
        assert (await runner.run(weight_update_plan(version, old))).ok
        versions: dict[int, int] = {r: version for r in (0, 1)}
        c.admission_condition = lambda r: versions.get(r) == version

        c.add_rank(2)
        await c.wait_ready([2], timeout=30)
        status = c.rank_status(2)
        assert (status["present"], status["alive"], status["admissible"]) == (True, True, False)
        assert status["excluded"] == "not admitted"
        res = await c.fan_out("get_server_info")
        assert sorted(res.results) == [0, 1] and res.left_out == {2: "not admitted"}
        assert runner.routable_ranks() == (0, 1)

        c.admit(2)  # admitted, but not yet at the fleet's version
        res = await c.fan_out("get_server_info")
        assert sorted(res.results) == [0, 1]
        assert res.left_out == {2: "admission condition not met"}
        # an operation naming it brings it to the version; then it is routable
        behind = (await c.call("get_server_info", rank=2))["version"]
        assert behind < version
        caught_up = await runner.run(weight_update_plan(version, behind), ranks=(2,))
        assert caught_up.ok, caught_up.summary()
        versions[2] = (await c.call("get_server_info", rank=2))["version"]
        res = await c.fan_out("get_server_info")
        assert sorted(res.results) == [0, 1, 2] and not res.left_out
        assert c.rank_status(2)["admissible"]
        assert c.metrics()["membership"]["ranks"][2]["admissible"] is True

        # quarantine is the third reason; with nothing admissible, nothing is sent
        c.quarantine.add(Quarantine(1, "op-x", "update", "test"))
        res = await c.fan_out("get_server_info")
        assert sorted(res.results) == [0, 2] and res.left_out == {1: "quarantined"}
        c.admission_condition = lambda r: False
        with pytest.raises(NoAdmissibleRanks) as info:
            await c.fan_out("get_server_info")
        assert set(info.value.left_out) == {0, 1, 2}


async def test_per_rank_transport_connects_and_disconnects_ranks_at_run_time(
        tmp_path: Path) -> None:
    """The DEALER client (engines bind): a rank added with its address is connected,
    one removed is closed, and a rank added without an address is refused."""
    os.chmod(tmp_path, 0o700)
    addresses = {r: f"ipc://{tmp_path}/engine-{r}.sock" for r in (0, 1)}
    with EngineFleet(2, lambda r: ["--bind", addresses[r]]) as fleet:
        transport = ZmqDealerClientTransport({0: addresses[0]})
        async with ControlClient(transport, ranks=(0,), default_timeout=30.0) as c:
            await c.wait_ready(timeout=30)
            with pytest.raises(ValueError, match="address"):
                c.add_rank(1)
            assert c.ranks == (0,) and 1 not in c.membership
            c.add_rank(1, addresses[1], incarnation=1)
            await c.wait_ready([1], timeout=30)
            assert await c.call("echo", "one", rank=1) == "one"
            async with anyio.create_task_group() as tg:
                caught: list[Exception] = []

                async def nap() -> None:
                    try:
                        await c.call("sleep", 1.0, rank=1)
                    except Exception as exc:
                        caught.append(exc)

                tg.start_soon(nap)
                await wait_until(lambda: c.registry.live_count == 1)
                c.remove_rank(1)
            assert [type(e) for e in caught] in ([OutcomeUnknown], [NotDelivered])
            assert 1 not in transport.addresses
            with pytest.raises(Unroutable):  # its socket is closed
                transport.send_nowait(1, Heartbeat(-1, 0, 0))
            # back at the same address: a new connection
            c.add_rank(1, addresses[1], incarnation=2)
            await c.wait_ready([1], timeout=30)
            assert await c.call("echo", "again", rank=1) == "again"
            assert (await c.fan_out("echo", 3, ranks=(0, 1))).results == {0: 3, 1: 3}
            # the engine comes back elsewhere and registers again: the client follows
            addresses[1] = f"ipc://{tmp_path}/engine-1-moved.sock"
            fleet.restart(1)
            change = c.add_rank(1, addresses[1], incarnation=3)
            assert change is not None and change.kind is ChangeKind.REREGISTERED
            assert transport.addresses[1] == addresses[1]
            # once the new process is heard from (a request sent before that is one
            # its first heartbeat, a restart, fails as the old incarnation's)
            await wait_until(lambda: c.rank_status(1)["incarnation"]
                             == fleet.engines[1].incarnation)
            assert await c.call("echo", "moved", rank=1) == "moved"
            assert c.rank_status(1)["excluded"] == "not admitted"


async def test_rank_removed_in_the_middle_of_an_operation_is_reported_per_rank(
        fleet: tuple[str, EngineFleet]) -> None:
    """The operation keeps the ranks it started with: the removed rank's step fails
    typed (it may have run), the others are compensated, the removed rank is
    reported failed or quarantined, and nothing raises out of the runner."""
    address, _ = fleet
    async with client_for(address, (0, 1, 2)) as c:
        await c.wait_ready(timeout=30)
        runner = OperationRunner(c)
        before = await c.fan_out("get_server_info", mode="concurrent")
        old = {r: v["version"] for r, v in before.results.items()}
        assert len(set(old.values())) == 1, old  # earlier tests left the fleet in step
        base = old[0]
        async with anyio.create_task_group() as tg:
            results: list[Any] = []

            async def run() -> None:
                results.append(await runner.run(
                    weight_update_plan(base + 1, base, load_seconds=2.0)))

            tg.start_soon(run)
            # rank 2 is loading the new weights (its update step reports progress)
            await wait_until(lambda: c.rank_status(2)["progress"] > 0)
            c.remove_rank(2)
        result = results[0]
        assert not result.ok, result.summary()
        report = result.ranks[2]
        assert report.failed_step == "update", result.summary()
        assert isinstance(report.error, OutcomeUnknown | NotDelivered), report
        assert result.ranks[0].state is not result.ranks[2].state, result.summary()
        after = await c.fan_out("get_server_info", ranks=(0, 1), mode="concurrent")
        # the others are back on the old weights and serving
        assert {r: (v["version"], v["paused"]) for r, v in after.results.items()} == {
            0: (base, False), 1: (base, False)}, result.summary()
        # rank 2 comes back and is brought to the fleet's version before it is admitted
        c.add_rank(2)
        await c.wait_ready([2], timeout=30)
        await wait_until(lambda: c.rank_status(2)["method"] == "")  # its update finished
        # still held by the quarantine the operation put it in, and not admitted
        assert c.rank_status(2)["excluded"] == "not admitted"
        if 2 in c.quarantine:
            await runner.release(2, force=True)
        # the next operation names it, and brings the whole fleet to one version
        fixed = await runner.run(weight_update_plan(base + 2, base), ranks=(0, 1, 2))
        assert fixed.ok, fixed.summary()
        assert c.rank_status(2)["excluded"] == "not admitted"
        c.admit(2)
        final = await c.fan_out("get_server_info", mode="concurrent")
        assert {r: v["version"] for r, v in final.results.items()} == {
            0: base + 2, 1: base + 2, 2: base + 2}
