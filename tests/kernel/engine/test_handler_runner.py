"""The handler runner alone, with an inbound core and a liveness part: where a
handler runs, what it sees while it runs, and what each ending records."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ctlwire.kernel.core.inbound_core import InboundCore, InboundRequest
from ctlwire.kernel.engine.handler_runner import HandlerRunner
from ctlwire.kernel.engine.liveness import EngineLiveness, current_request_id, report_progress
from ctlwire.kernel.engine.method_table import MethodTable
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Heartbeat, Request
from ctlwire.transports.errors import TransportClosed
from ctlwire.transports.memory import MemoryNetwork
from ctlwire.transports.transport import EngineTransport

CODEC = MsgpackCodec()


def parts() -> tuple[MethodTable, InboundCore, HandlerRunner]:
    table = MethodTable(CODEC)
    core = InboundCore(table.specs, CODEC, rank=0, incarnation=1, clock=lambda: 1000.0)
    live = EngineLiveness(MemoryNetwork().engine_transport(0), rank=0, incarnation=1)
    return table, core, HandlerRunner(core, live)


def admit(core: InboundCore, rid: int, method: str, key: str = "", route: bytes = b"r"
          ) -> InboundRequest:
    item = core.accept(Request(rid, 0, method, CODEC.encode_value(None), key=key), route)
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


class RoutedStub(EngineTransport):
    """A routed transport that keeps the heartbeats sent to it."""

    routed = True

    def __init__(self) -> None:
        self.codec = CODEC
        self.rank = 0
        self.sent: list[tuple[Any, Heartbeat]] = []

    def try_receive(self) -> Any:
        return None

    async def receive(self) -> Any:
        raise TransportClosed("a stub")

    def send_encoded_nowait(self, route: Any, data: bytes) -> None:
        hb = self.codec.decode(data)
        assert isinstance(hb, Heartbeat)
        self.sent.append((route, hb))


def test_a_sync_run_is_reported_with_its_progress_and_forgotten_however_it_ends() -> None:
    table = MethodTable(CODEC)
    core = InboundCore(table.specs, CODEC, rank=0, incarnation=1, clock=lambda: 1000.0)
    stub = RoutedStub()
    live = EngineLiveness(stub, rank=0, incarnation=1)
    runner = HandlerRunner(core, live)
    seen: list[Any] = []

    def work() -> int:
        assert report_progress(0.25, "quarter")
        live.send_progress_heartbeats()
        seen.append(dict(live.running))
        return 2

    def fails() -> None:
        report_progress(0.5)
        raise RuntimeError("no")

    def interrupted() -> None:
        report_progress(0.5)
        raise KeyboardInterrupt

    table.register("work", work)
    table.register("fails", fails)
    table.register("stop", interrupted)
    assert runner.run_sync(admit(core, 7, "work", route=b"sender")).ok
    assert seen[0][7][0] == "work"
    assert [(r, hb.busy, hb.progress) for r, hb in stub.sent] == [(b"sender", 7, 0.25)]
    reply = runner.run_sync(admit(core, 8, "fails", route=b"sender"))
    assert reply.error is not None and reply.error.type == "RuntimeError"
    assert live.running == {} and live.progress == {} and not report_progress(0.1)
    with pytest.raises(KeyboardInterrupt):
        runner.run_sync(admit(core, 9, "stop", route=b"sender"))
    assert live.running == {} and live.progress == {} and not report_progress(0.1)
    stub.sent.clear()
    live.send_progress_heartbeats()  # no route left behind
    assert stub.sent == []


def test_an_async_handler_is_refused_by_run_sync_and_its_key_not_kept() -> None:
    table, core, runner = parts()

    async def later() -> None:
        pass

    table.register("later", later)
    reply = runner.run_sync(admit(core, 1, "later", key="k"))
    assert reply.error is not None and reply.error.type == "AsyncHandlerInPoll"
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
