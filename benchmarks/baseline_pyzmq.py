"""The baselines' client: a sync pyzmq ROUTER driven from anyio with the FD technique.

What a careful user writes for request/reply over ZeroMQ without a library,
on either anyio backend: a plain (sync) ``zmq.ROUTER`` bound by the client,
engines connect DEALERs whose identity names their rank; each call takes a
fresh call id, registers a reply slot (an ``anyio.Event``) *before*
sending, sends ``[call_id, method, args]`` encoded with msgspec msgpack, and
waits on the slot. One receive task owns the receiving side:

* it drains while ``EVENTS & POLLIN`` (pyzmq's ``FD`` is edge-triggered:
  it signals a change, not a level), and only then waits with
  ``anyio.wait_readable(sock.FD)``;
* a send may consume that edge (libzmq processes pending commands in any
  socket call), so every sender re-checks ``EVENTS`` after sending and drains
  what arrived itself, as ``zmq/_future.py`` re-checks after every call.

Replies complete their slots where they are read. Socket options match
ctlwire's defaults (high-water marks, ``ROUTER_MANDATORY``, linger), so both
stacks sit on the same sockets.

What it does not do (and ctlwire does): timeouts, cleanup of slots whose
reply never comes, liveness, typed errors, envelopes validated by type,
duplicate and late reply accounting.
"""

from __future__ import annotations

import contextlib
import itertools
from types import TracebackType
from typing import Any, Protocol

import anyio
import msgspec
import zmq
from anyio.abc import TaskGroup

from .baseline_engine import HELLO_ID

__all__ = ["FanInHandler", "PyzmqUtilityClient", "RemoteCallError"]

# plain ints: an IntFlag's ``&`` costs Python-level enum calls on every check
_EVENTS = int(zmq.EVENTS)
_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)


class RemoteCallError(Exception):
    """The engine answered a call with an error."""


class FanInHandler(Protocol):
    """Receives the replies addressed to a reserved (negative) call id."""

    def handle_recv(self, rank: int, ok: bool, value: Any) -> None: ...


class _Slot:
    """One call's reply: set once, read by the caller."""

    __slots__ = ("event", "ok", "value")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.ok = False
        self.value: Any = None


class PyzmqUtilityClient:
    """``async with PyzmqUtilityClient(address) as c: await c.call(0, "echo", x)``
    (inside a running anyio event loop, either backend)."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.sock: zmq.Socket[bytes] = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.SNDHWM, 10_000)
        self.sock.setsockopt(zmq.RCVHWM, 10_000)
        self.sock.setsockopt(zmq.LINGER, 200)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self._encode = msgspec.msgpack.Encoder().encode
        self._decode = msgspec.msgpack.Decoder().decode
        self._ids = itertools.count(1)
        self._slots: dict[int, _Slot] = {}
        self._fan_in: dict[int, FanInHandler] = {}
        self._stack = contextlib.AsyncExitStack()
        self._tg: TaskGroup | None = None
        self.hellos: set[int] = set()

    async def __aenter__(self) -> PyzmqUtilityClient:
        self.sock.bind(self.address)
        self._tg = await self._stack.enter_async_context(anyio.create_task_group())
        self._tg.start_soon(self._recv_loop)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._tg is not None:
            self._tg.cancel_scope.cancel()
        try:
            await self._stack.aclose()
        finally:
            self.sock.close(linger=0)
            self.ctx.term()

    async def call(self, rank: int, method: str, *args: Any) -> Any:
        """One utility call: register a slot, send, wait for the reply."""
        call_id = next(self._ids)
        slot = self._slots[call_id] = _Slot()
        try:
            self.send_nowait(rank, self._encode((call_id, method, args)))
            self.after_send()
            await slot.event.wait()
        finally:
            self._slots.pop(call_id, None)
        if not slot.ok:
            raise RemoteCallError(slot.value)
        return slot.value

    def add_fan_in(self, handler: FanInHandler) -> int:
        """Reserve a negative call id whose replies go to ``handler``
        (SGLang-style: one reply type per communicator, no per-call id)."""
        key = -(len(self._fan_in) + 1)
        self._fan_in[key] = handler
        return key

    def send_nowait(self, rank: int, frame: bytes) -> None:
        """Send an already encoded request frame to ``rank`` (raises zmq.Again at the
        high-water mark, EHOSTUNREACH for a rank not connected). Call
        :meth:`after_send` once the batch is sent."""
        send = self.sock.send
        send(b"rank-%d" % rank, _NOBLOCK | _SNDMORE)
        send(frame, _NOBLOCK)

    def after_send(self) -> None:
        """Re-check ``EVENTS`` after sending and drain here what is ready: a send may
        have consumed the FD's edge, and the receive task would not wake for it."""
        if self.sock.get(_EVENTS) & _POLLIN:  # type: ignore[operator]
            self._drain()

    def encode(self, obj: Any) -> bytes:
        return self._encode(obj)

    def _drain(self) -> None:
        sock = self.sock
        decode = self._decode
        slots = self._slots
        get, recv = sock.get, sock.recv
        while get(_EVENTS) & _POLLIN:  # type: ignore[operator]
            identity = recv(_NOBLOCK)
            data = recv(_NOBLOCK)
            call_id, ok, value = decode(data)
            if call_id > 0:
                slot = slots.get(call_id)
                if slot is not None:
                    slot.ok, slot.value = ok, value
                    slot.event.set()
            elif call_id < 0:
                handler = self._fan_in.get(call_id)
                if handler is not None:
                    handler.handle_recv(int(identity[5:]), ok, value)
            elif call_id == HELLO_ID:
                self.hellos.add(int(value))

    async def _recv_loop(self) -> None:
        fd: int = self.sock.FD
        while True:
            self._drain()
            await anyio.wait_readable(fd)

    async def wait_ready(self, ranks: range | list[int], timeout: float = 10.0) -> None:
        """Wait until every rank answers a ping (ROUTER_MANDATORY refuses a send
        to a rank that has not connected yet: retry shortly)."""
        with anyio.fail_after(timeout):
            for rank in ranks:
                while True:
                    with anyio.move_on_after(0.5):
                        try:
                            await self.call(rank, "echo", None)
                            break
                        except zmq.ZMQError:
                            pass
                    await anyio.sleep(0.01)
