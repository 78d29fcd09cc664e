"""Baseline 1: raw pyzmq asyncio ROUTER with a dict of futures (vLLM's utility calls).

The idiomatic way to do request/reply over ZeroMQ without a library, as
vLLM v1's ``AsyncMPClient._call_utility_async`` does it: a ``zmq.asyncio``
ROUTER bound by the client, engines connect DEALERs whose identity names
their rank; each call takes a fresh call id, puts a future in a dict *before*
sending, sends ``[call_id, method, args]`` encoded with msgspec msgpack, and
awaits the future; one receive task decodes each reply, pops the future and
sets its result. Socket options match ctlwire's defaults (high-water marks,
``ROUTER_MANDATORY``, linger), so both stacks sit on the same sockets.

What it does not do (and ctlwire does): timeouts, cleanup of futures whose
reply never comes, liveness, typed errors, envelopes validated by type,
duplicate and late reply accounting.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from types import TracebackType
from typing import Any, Protocol, cast

import msgspec
import zmq
import zmq.asyncio

from .baseline_engine import HELLO_ID

__all__ = ["FanInHandler", "PyzmqUtilityClient", "RemoteCallError"]


class RemoteCallError(Exception):
    """The engine answered a call with an error."""


class FanInHandler(Protocol):
    """Receives the replies addressed to a reserved (negative) call id."""

    def handle_recv(self, rank: int, ok: bool, value: Any) -> None: ...


def _identity(rank: int) -> bytes:
    return b"rank-%d" % rank


class PyzmqUtilityClient:
    """``async with PyzmqUtilityClient(address) as c: await c.call(0, "echo", x)``."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.ctx = zmq.asyncio.Context()
        self.sock: zmq.asyncio.Socket = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.SNDHWM, 10_000)
        self.sock.setsockopt(zmq.RCVHWM, 10_000)
        self.sock.setsockopt(zmq.LINGER, 200)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._encode = msgspec.msgpack.Encoder().encode
        self._decode = msgspec.msgpack.Decoder().decode
        self._ids = itertools.count(1)
        self._futures: dict[int, asyncio.Future[Any]] = {}
        self._fan_in: dict[int, FanInHandler] = {}
        self._task: asyncio.Task[None] | None = None
        self.hellos: set[int] = set()

    async def __aenter__(self) -> PyzmqUtilityClient:
        self.sock.bind(self.address)
        self._task = asyncio.get_running_loop().create_task(self._recv_loop())
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.sock.close(linger=0)
        self.ctx.term()

    async def call(self, rank: int, method: str, *args: Any) -> Any:
        """One utility call: register a future, send, await the reply."""
        call_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._futures[call_id] = future
        try:
            await self.sock.send_multipart(
                (_identity(rank), self._encode((call_id, method, args))))
        except BaseException:
            self._futures.pop(call_id, None)
            raise
        return await future

    def add_fan_in(self, handler: FanInHandler) -> int:
        """Reserve a negative call id whose replies go to ``handler``
        (SGLang-style: one reply type per communicator, no per-call id)."""
        key = -(len(self._fan_in) + 1)
        self._fan_in[key] = handler
        return key

    def send_nowait(self, rank: int, frame: bytes) -> None:
        """Send an already encoded request frame to ``rank`` (raises zmq.Again at the
        high-water mark, like a non-blocking send on a plain socket)."""
        done = cast("asyncio.Future[Any]",
                    self.sock.send_multipart((_identity(rank), frame), flags=zmq.NOBLOCK))
        exc = done.exception() if done.done() else None
        if exc is not None:
            raise exc

    def encode(self, obj: Any) -> bytes:
        return self._encode(obj)

    async def _recv_loop(self) -> None:
        sock = self.sock
        decode = self._decode
        futures = self._futures
        while True:
            identity, data = await sock.recv_multipart()
            call_id, ok, value = decode(data)
            if call_id > 0:
                future = futures.pop(call_id, None)
                if future is not None and not future.done():
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(RemoteCallError(value))
            elif call_id < 0:
                handler = self._fan_in.get(call_id)
                if handler is not None:
                    handler.handle_recv(int(identity[5:]), ok, value)
            elif call_id == HELLO_ID:
                self.hellos.add(int(value))

    async def wait_ready(self, ranks: range | list[int], timeout: float = 10.0) -> None:
        """Wait until every rank answers a ping (ROUTER_MANDATORY refuses a send
        to a rank that has not connected yet: retry shortly)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        for rank in ranks:
            while True:
                try:
                    await asyncio.wait_for(self.call(rank, "echo", None), 0.5)
                    break
                except (zmq.ZMQError, asyncio.TimeoutError):
                    if loop.time() > deadline:
                        raise TimeoutError(f"baseline engine rank {rank} not ready") from None
                    await asyncio.sleep(0.01)
