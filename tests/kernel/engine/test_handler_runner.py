"""The handler runner alone, with an inbound core and a liveness part: where a
handler runs, what it sees while it runs, and what each ending records."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ctlwire.kernel.core.inbound_core import InboundCore, InboundRequest
from ctlwire.kernel.engine.handler_runner import HandlerRunner
from ctlwire.kernel.engine.liveness import EngineLiveness, current_request_id
from ctlwire.kernel.engine.method_table import MethodTable
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Request
from ctlwire.transports.memory import MemoryNetwork

CODEC = MsgpackCodec()


def parts() -> tuple[MethodTable, InboundCore, HandlerRunner]:
    table = MethodTable(CODEC)
    core = InboundCore(table.specs, CODEC, rank=0, incarnation=1, clock=lambda: 1000.0)
    live = EngineLiveness(MemoryNetwork().engine_transport(0), rank=0, incarnation=1)
    return table, core, HandlerRunner(core, live)


def admit(core: InboundCore, rid: int, method: str, key: str = "") -> InboundRequest:
    item = core.accept(Request(rid, 0, method, CODEC.encode_value(None), key=key), b"r")
    assert item is not None and core.admit(item) is None
    return item


def test_a_sync_handler_runs_here_seen_as_running() -> None:
    table, core, runner = parts()
    seen: list[Any] = []
    table.register("work", lambda: seen.append((current_request_id(),
                                                dict(runner.liveness.running))))
    reply = runner.run_sync(admit(core, 5, "work"))
    assert reply.ok and seen[0][0] == 5 and seen[0][1][5][0] == "work"
    assert runner.liveness.running == {}


def test_an_async_handler_is_refused_by_run_sync_and_its_key_not_kept() -> None:
    table, core, runner = parts()

    async def later() -> None:
        pass

    table.register("later", later)
    reply = runner.run_sync(admit(core, 1, "later", key="k"))
    assert reply.error is not None and reply.error.type == "_AsyncHandlerInPoll"
    assert admit(core, 2, "later", key="k").spec is not None  # a retry is admitted to run


def test_a_run_interrupted_without_an_outcome_forgets_its_key() -> None:
    table, core, runner = parts()

    def interrupted() -> None:
        raise KeyboardInterrupt

    table.register("stop", interrupted)
    with pytest.raises(KeyboardInterrupt):
        runner.run_sync(admit(core, 1, "stop", key="k"))
    assert admit(core, 2, "stop", key="k").spec is not None  # not "InProgress"


@pytest.mark.anyio
async def test_a_cancelled_async_run_forgets_its_key_and_a_retry_runs() -> None:
    table, core, runner = parts()
    runs: list[int] = []

    async def slow() -> int:
        runs.append(1)
        await anyio.sleep(10)
        return 1

    table.register("slow", slow)
    with anyio.move_on_after(0.05):
        await runner.run_async(admit(core, 1, "slow", key="k"))
    assert runs == [1] and runner.liveness.running == {}
    with anyio.move_on_after(0.05):
        await runner.run_async(admit(core, 2, "slow", key="k"))
    assert runs == [1, 1]
