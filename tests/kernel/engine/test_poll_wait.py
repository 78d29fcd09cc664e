"""``poll(max_messages, timeout)``: a sync loop's wait and receive in one call.

* With nothing queued it waits up to ``timeout`` for the first event and
  handles a request that arrives meanwhile in the same call; it returns 0 once
  the time is up. What is already queued is taken at once.
* ``poll(1, timeout)`` (the loop's round) takes one event: no second, empty
  take after a lone request.
* The same over a transport opened for a synchronous loop (the owner thread's
  blocking receive), over one entered for an event loop (its socket wrapper), and
  for a transport with the default ``receive_one`` (its ``wait_readable``, then
  its ``try_receive``).
* A receive that keeps failing does not turn the loop into a busy loop: each
  failing poll still waits.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import anyio
import pytest
import zmq
from forwarding_transport import Forwarding
from test_request_kinds import methods

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.transports.envelope import Request
from ctlwire.transports.transport import EngineTransport, TransportEvent
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

_counter = itertools.count()


class _DefaultReceiveOne(Forwarding):
    """A wrapper with the default ``receive_one`` (built on ``wait_readable`` and
    ``try_receive``)."""

    def receive_one(self, timeout: float = 0.0) -> TransportEvent | None:
        return EngineTransport.receive_one(self, timeout)


class _Rig:
    """A raw ROUTER (the client) and an engine endpoint on a ZMQ DEALER, inproc."""

    def __init__(self, path: str) -> None:
        address = f"inproc://engine-poll-wait-{next(_counter)}"
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.router.bind(address)
        self.transport = ZmqDealerEngineTransport(address, 0, context=self.ctx)
        self.codec = self.transport.codec
        wrapped: EngineTransport = (_DefaultReceiveOne(self.transport)
                                    if path == "default-receive-one" else self.transport)
        self.ep = EngineEndpoint(wrapped, heartbeat_interval=None, beacon=False,
                                 clock=lambda: 1000.0, incarnation=1)
        methods(self.ep)
        if path == "async-socket":  # entered for an event loop, then polled
            anyio.run(self.transport.__aenter__)
        self.ep.open()
        self.takes: list[bool] = []
        take = self.ep._take_one

        def counted(*args: Any) -> Any:
            event = take(*args)
            self.takes.append(event is not None)
            return event

        self.ep._take_one = counted

    def request(self, i: int) -> None:
        data = self.codec.encode(Request(i, 0, "flush", self.codec.encode_value(None),
                                         0.0, i, 9))
        for _ in range(500):  # ROUTER_MANDATORY: until the engine's identity is known
            try:
                self.router.send_multipart([b"rank-0", data])
                return
            except zmq.ZMQError:
                time.sleep(0.01)
        raise AssertionError("the engine never connected")

    def reply_ids(self, n: int) -> list[int]:
        ids = []
        for _ in range(n):
            assert self.router.poll(10_000), "no reply"
            ids.append(self.codec.decode(self.router.recv_multipart()[1]).id)
        return ids

    def close(self) -> None:
        self.ep.close()
        self.router.close(0)
        self.ctx.term()


PATHS = ["sync-socket", "async-socket", "default-receive-one"]


@pytest.mark.parametrize("path", PATHS)
def test_poll_waits_for_the_first_request_and_handles_it_in_the_same_call(
        path: str) -> None:
    rig = _Rig(path)
    try:
        started = time.monotonic()
        assert rig.ep.poll(1, 0.05) == 0  # nothing came: the time is up
        assert time.monotonic() - started >= 0.04
        late = threading.Timer(0.1, rig.request, args=(1,))
        late.start()
        try:
            assert rig.ep.poll(1, 10.0) == 1  # arrived during the wait: handled now
        finally:
            late.join()
        assert rig.reply_ids(1) == [1]
        assert rig.ep.__dict__["ran"] == [("flush", None)]
    finally:
        rig.close()


@pytest.mark.parametrize("path", PATHS)
def test_a_round_of_one_takes_one_queued_request_and_asks_for_no_other(path: str) -> None:
    rig = _Rig(path)
    try:
        for i in (1, 2, 3):
            rig.request(i)
        assert rig.transport.wait_readable(10.0)
        rig.takes.clear()
        for _ in range(3):
            assert rig.ep.poll(1, 10.0) == 1
        assert rig.takes == [True] * 3  # no empty take after each
        assert rig.reply_ids(3) == [1, 2, 3]
        rig.takes.clear()
        rig.request(4)
        assert rig.ep.poll(64, 10.0) == 1  # a larger round asks once more, finds nothing
        assert rig.takes == [True, False]
        assert rig.reply_ids(1) == [4]
    finally:
        rig.close()


class _Failing(Forwarding):
    """A transport whose every receive raises; its wait waits."""

    def __init__(self, inner: ZmqDealerEngineTransport) -> None:
        super().__init__(inner)
        self.receives = 0

    def receive_one(self, timeout: float = 0.0) -> TransportEvent | None:
        self.receives += 1
        raise RuntimeError("broken receive")


def test_a_receive_that_keeps_failing_still_waits_each_round() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    address = f"inproc://engine-poll-wait-{next(_counter)}"
    router = ctx.socket(zmq.ROUTER)
    router.bind(address)
    failing = _Failing(ZmqDealerEngineTransport(address, 0, context=ctx))
    ep = EngineEndpoint(failing, heartbeat_interval=None, beacon=False)
    try:
        ep.open()
        end = time.monotonic() + 0.3
        rounds = 0
        while time.monotonic() < end:
            assert ep.poll(1, 0.02) == 0
            rounds += 1
        # each round waited (about 15 of 20 ms): a busy loop would make thousands
        assert 1 <= failing.receives == rounds <= 30
        assert ep.counters["internal_errors"] == rounds
    finally:
        ep.close()
        router.close(0)
        ctx.term()
