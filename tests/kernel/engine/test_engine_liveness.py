"""The liveness part alone, over a transport stub: what is running, progress,
and what its heartbeats say (and to whom)."""

from __future__ import annotations

import time
from typing import Any

from ctlwire.kernel.engine.liveness import STEP_METHOD, EngineLiveness, report_progress
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Heartbeat
from ctlwire.transports.errors import TransportClosed, Unroutable
from ctlwire.transports.transport import EngineTransport


class Stub(EngineTransport):
    routed = True

    def __init__(self) -> None:
        self.codec = MsgpackCodec()
        self.rank = 3
        self.sent: list[tuple[Any, Heartbeat]] = []

    def heartbeat_routes(self) -> list[Any]:
        return [b"a", b"gone"]

    def try_receive(self) -> Any:
        return None

    async def receive(self) -> Any:
        raise TransportClosed("a stub")

    def send_encoded_nowait(self, route: Any, data: bytes) -> None:
        if route == b"gone":
            raise Unroutable(0, "gone")
        hb = self.codec.decode(data)
        assert isinstance(hb, Heartbeat)
        self.sent.append((route, hb))


def make(**kw: Any) -> tuple[EngineLiveness, Stub]:
    stub = Stub()
    return EngineLiveness(stub, rank=3, incarnation=9, **kw), stub


def test_a_running_request_is_reported_and_its_progress_goes_to_its_route_only() -> None:
    live, stub = make()
    token = live.begin(42, "update", b"sender")
    assert report_progress(0.5, "half")  # reaches it through the context
    shared = live.status_heartbeat()
    assert shared is not None and shared.method == "update"
    assert shared.busy == 0 and shared.note == ""  # every peer sees it: no request named
    live.send_progress_heartbeats()
    assert [(r, hb.busy, hb.progress) for r, hb in stub.sent] == [(b"sender", 42, 0.5)]
    live.end(42, token)
    assert live.running == {} and live.progress == {} and not report_progress(0.1)
    idle = live.status_heartbeat()
    assert idle is not None and idle.method == "" and idle.seq > shared.seq


def test_a_private_transport_hears_the_request_id_and_progress() -> None:
    live, _ = make()
    live.shared_heartbeats = False
    token = live.begin(42, "update", None)
    live.report_progress(42, 2.0, "done")  # clamped
    hb = live.status_heartbeat()
    assert hb is not None and hb.busy == 42 and hb.progress == 1.0 and hb.note == "done"
    live.end(42, token)


def test_a_poll_loop_that_stopped_coming_round_is_in_its_step() -> None:
    live, _ = make(heartbeat_interval=0.01)
    live.polling = True
    live.loop_came_round(time.monotonic() - 1.0)
    hb = live.status_heartbeat()
    assert hb is not None and hb.method == STEP_METHOD and hb.busy_for >= 1.0


def test_in_band_heartbeats_once_an_interval_skipping_unroutable_routes() -> None:
    live, stub = make(heartbeat_interval=10.0)
    now = time.monotonic()
    live.heartbeat_if_due(now)
    live.heartbeat_if_due(now + 1.0)  # not due yet
    assert [r for r, _ in stub.sent] == [b"a"] and live.heartbeats_sent == 1
    live.paused = True
    live.heartbeat_if_due(now + 11.0)
    assert live.heartbeats_sent == 1 and live.status_heartbeat() is None


def test_a_poll_loop_coming_round_sends_an_in_band_heartbeat_when_one_is_due() -> None:
    live, stub = make(heartbeat_interval=10.0)
    now = time.monotonic()
    live.loop_came_round(now)  # not polling (an event loop's): its own task sends them
    assert stub.sent == []
    live.polling = True
    live.loop_came_round(now)
    live.loop_came_round(now + 1.0)  # not due yet
    live.loop_came_round(now + 10.5)
    assert [r for r, _ in stub.sent] == [b"a", b"a"] and live.loops == 4
    live.beacon_active = True  # the beacon sends them from now on
    live.loop_came_round(now + 30.0)
    live.loop_came_round(now + 60.0)
    assert live.heartbeats_sent == 2
