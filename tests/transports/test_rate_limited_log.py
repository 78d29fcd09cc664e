"""Log lines a peer can repeat at will are written at most once per kind per
interval, with a count of those left out: refused CURVE keys, replies to
clients that went away."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.testing import free_tcp_port
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.curve import CurveClientConfig, CurveServerConfig, generate_keypair
from ctlwire.transports.envelope import Request
from ctlwire.transports.rate_limited_log import RateLimitedLog
from ctlwire.transports.zmq_engine import ZmqRouterEngineTransport

CODEC = MsgpackCodec()


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


def test_one_line_per_kind_per_interval_then_one_with_the_count(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    log = RateLimitedLog(logging.getLogger("ctlwire.test.limited"), interval=10.0, clock=clock)
    caplog.set_level(logging.WARNING, logger="ctlwire.test.limited")
    written = [log.warning("a", "peer %s refused", i) for i in range(100)]
    assert written == [True] + [False] * 99
    assert log.warning("b", "other kind")  # kinds are limited apart
    clock.now += 9.9
    assert not log.warning("a", "peer %s refused", 100)
    clock.now += 0.2
    assert log.warning("a", "peer %s refused", 101)
    lines = _lines(caplog, "peer")
    print("\n" + "\n".join(lines))
    assert lines == ["peer 0 refused", "peer 101 refused (and 100 more like it in the last 10 s)"]
    assert log.total == 103 and log.suppressed == 100
    clock.now += 60
    assert log.warning("a", "peer %s refused", 102)
    assert _lines(caplog, "peer")[-1] == "peer 102 refused"  # nothing left out since


def test_forgotten_kinds_carry_their_count_into_the_next_line(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = _Clock()
    log = RateLimitedLog(logging.getLogger("ctlwire.test.kinds"), interval=10.0, max_kinds=2,
                         clock=clock)
    caplog.set_level(logging.WARNING, logger="ctlwire.test.kinds")
    for _ in range(5):
        log.warning("k0", "kind 0")
    log.warning("k1", "kind 1")
    log.warning("k2", "kind 2")  # forgets k0 and its 4 left out
    lines = _lines(caplog, "kind")
    assert lines == ["kind 0", "kind 1", "kind 2"]
    log.warning("k3", "kind 3")
    assert _lines(caplog, "kind")[-1] == "kind 3 (and 4 more like it in the last 10 s)"
    assert log.suppressed == 4
    with pytest.raises(ValueError):
        RateLimitedLog(logging.getLogger("x"), max_kinds=0)


def test_refused_curve_keys_log_one_line_not_one_per_handshake(
        caplog: pytest.LogCaptureFixture) -> None:
    """30 clients with keys that are not allow-listed dial an engine that binds
    with CURVE: every refusal is counted, one line is logged."""
    caplog.set_level(logging.WARNING, logger="ctlwire.curve")
    server, good = generate_keypair(), generate_keypair()
    port = free_tcp_port()
    transport = ZmqRouterEngineTransport(
        f"tcp://127.0.0.1:{port}", 0, curve=CurveServerConfig.allowing(server, [good.public]),
        beacon_address="inproc://beat-curve")
    transport.open()
    ctx: zmq.Context[Any] = zmq.Context()
    socks = []
    try:
        for _ in range(30):
            s: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            CurveClientConfig(generate_keypair(), server.public).apply(s)
            s.connect(transport.address)
            socks.append(s)
        deadline = time.monotonic() + 30
        while transport.auth_rejections < 30 and time.monotonic() < deadline:
            time.sleep(0.05)
        rejected = transport.auth_rejections
    finally:
        for s in socks:
            s.close(0)
        transport.close()
        ctx.term()
    lines = _lines(caplog, "rejected CURVE client key")
    print(f"\n{rejected} refusals, {len(lines)} line(s): {lines}")
    assert rejected >= 30
    assert len(lines) == 1


def test_replies_to_a_departed_client_log_one_line_and_count_each(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """20 clients send 10 requests each and go away before the engine answers:
    every reply that could not be sent is counted, one line is logged."""
    caplog.set_level(logging.WARNING, logger="ctlwire.engine")
    os.chmod(tmp_path, 0o700)
    transport = ZmqRouterEngineTransport(f"ipc://{tmp_path}/e.sock", 0)
    ep = EngineEndpoint(transport, heartbeat_interval=None, beacon=False)
    ep.register("echo", lambda v: v, payload_type=Any)
    ep.open()
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        for c in range(20):  # 10 each: within what the engine's pipe holds per peer
            s: zmq.Socket[bytes] = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 1000)
            s.connect(transport.address)
            for i in range(10):
                s.send(CODEC.encode(Request(i + 1, 0, "echo", CODEC.encode_value(i),
                                            client=100 + c)))
            s.close()  # flushes the requests (linger), then goes
        ctx.term()
        time.sleep(0.5)  # the engine's libzmq sees them go (their requests stay readable)
        deadline = time.monotonic() + 30
        while ep.counters["received"] < 200 and time.monotonic() < deadline:
            ep.poll(256)
            transport.wait_readable(0.05)
    finally:
        ep.close()
    lines = _lines(caplog, "reply not sent")
    print(f"\nreceived {ep.counters['received']}, send failures "
          f"{ep.counters['reply_send_failures']}, {len(lines)} line(s): {lines}")
    assert ep.counters["received"] == 200
    assert ep.counters["reply_send_failures"] + ep.counters["replied"] == 200
    assert ep.counters["reply_send_failures"] >= 20  # at least one per departed client
    assert len(lines) == 1
