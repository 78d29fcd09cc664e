"""One path, followed: a call goes down through ctlwire's modules and never climbs back.

A *climb back* is a call into a module that is already on the stack below a frame of
another module: a lower part calling up into the part that called it (a callback,
a back-reference). The tests trace every call into ``ctlwire.*`` while one fan-out
runs (each mode, both backends, in-memory engines in the same loop) and while one
request goes through an engine from its ZeroMQ socket to the handler and back, and
hold the climbs to what is listed here with its reason.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import pytest
import zmq

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.testing import EngineHarness
from ctlwire.transports.envelope import Request
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

#: (module, function) -> why it is called from below: a factory the caller hands to
#: the public Coalescer runs in the caller's module when a flight starts
ALLOWED_CLIMBS = {("ctlwire.kernel.client.fan_out_mailbox", "start")}

Call = tuple[str, str, tuple[str, ...]]


@contextmanager
def traced() -> Iterator[list[Call]]:
    """Every call into a ``ctlwire.*`` module in this thread: (module, function, the
    chain of ctlwire modules below it, nearest first, repeats folded)."""
    calls: list[Call] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("ctlwire."):
            return
        chain: list[str] = []
        below = frame.f_back
        while below is not None:
            m = below.f_globals.get("__name__", "")
            if m.startswith("ctlwire.") and (not chain or chain[-1] != m):
                chain.append(m)
            below = below.f_back
        calls.append((module, frame.f_code.co_name, tuple(chain)))

    sys.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)


def climbs(calls: list[Call]) -> set[tuple[str, str]]:
    """The calls into a module already on the stack below another module's frame."""
    return {(module, fn) for module, fn, chain in calls
            if chain and chain[0] != module and module in chain[1:]}


def _echo_engine(ep: EngineEndpoint) -> None:
    def echo(value: Any = None) -> Any:
        return value

    ep.register("echo", echo)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["queueing", "concurrent", "watching"])
async def test_a_fan_out_goes_down_and_never_climbs_back(mode: Any) -> None:
    async with EngineHarness(2, _echo_engine) as h:
        for _ in range(3):  # first-use paths (mailboxes, routes) out of the way
            await h.client.fan_out("echo", 1, mode=mode)
        with traced() as calls:
            result = await h.client.fan_out("echo", 1, mode=mode)
    assert result.results == {0: 1, 1: 1}
    modules = {m for m, _, _ in calls}
    assert {"ctlwire.kernel.client.control_client", "ctlwire.kernel.core.request_registry",
            "ctlwire.kernel.engine.endpoint"} <= modules  # the client and the engines ran
    found = climbs(calls)
    assert found <= ALLOWED_CLIMBS, sorted(found - ALLOWED_CLIMBS)
    if mode == "watching":  # the detector sees the one listed climb where it happens
        assert found == ALLOWED_CLIMBS


_addresses = itertools.count()


def test_a_request_goes_from_the_socket_to_the_handler_and_back_without_climbing() -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    address = f"inproc://one-path-{next(_addresses)}"
    router = ctx.socket(zmq.ROUTER)
    router.bind(address)
    transport = ZmqDealerEngineTransport(address, 0, context=ctx)
    ep = EngineEndpoint(transport, heartbeat_interval=None, beacon=False, incarnation=1)
    _echo_engine(ep)
    ep.open()
    try:
        def send(rid: int) -> None:
            router.send_multipart([b"rank-0", transport.codec.encode(
                Request(rid, 0, "echo", rid))])
            for _ in range(200):  # until the engine's socket has it
                if transport.wait_readable(0.01):
                    return
            raise AssertionError("the request never reached the engine")

        def reply() -> bytes:
            for _ in range(200):
                if router.poll(10):
                    return router.recv_multipart()[1]
                ep.poll()
            raise AssertionError("no reply")

        for rid in range(1, 4):  # first-use paths out of the way
            send(rid)
            ep.poll()
            reply()
        send(10)
        time.sleep(0.01)
        with traced() as calls:
            ep.poll()
        assert transport.codec.decode(reply()).id == 10  # type: ignore[union-attr]
    finally:
        ep.close()
        router.close(0)
        ctx.term()
    modules = [m for m, _, _ in calls]
    assert "ctlwire.kernel.engine.handler_runner" in modules  # the handler ran in the trace
    assert "ctlwire.transports.zmq_sync_socket" in modules
    assert climbs(calls) == set()
