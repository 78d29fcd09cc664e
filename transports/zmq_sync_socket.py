"""A plain pyzmq socket used directly by the thread that owns it: the socket
mechanism of an engine driven by a synchronous loop (``EngineEndpoint.poll()``),
where no task ever waits on the socket. Its calls are those of
:class:`~ctlwire.transports.zmq_socket.AsyncZmqSocket` (the event loop's mechanism)
that an engine transport makes (:mod:`~ctlwire.transports.zmq_engine_base`).

Guarantees: a call from a thread other than the owner raises
:class:`~ctlwire.transports.errors.ForeignThreadError` (libzmq sockets are not
thread-safe), one after :meth:`SyncZmqSocket.close`
:class:`~ctlwire.transports.errors.SocketClosed`. A receive that finds nothing
raises nothing (it asks ``EVENTS`` first); one with a timeout is one blocking
receive (``ZMQ_RCVTIMEO``: a queued message is taken without a system call). A send
never blocks: all parts are queued, or (``zmq.Again``, another ``zmq.ZMQError``) none.
"""

from __future__ import annotations

import threading
from typing import Final, NoReturn

import zmq

from .errors import ForeignThreadError, SocketClosed
from .zmq_frames import Frames, send_frames, socket_type_name

__all__ = ["SyncZmqSocket"]

_EVENTS: Final = int(zmq.EVENTS)
_POLLIN: Final = int(zmq.POLLIN)
_NOBLOCK: Final = int(zmq.NOBLOCK)
_NOBLOCK_SNDMORE: Final = int(zmq.NOBLOCK) | int(zmq.SNDMORE)
_RCVTIMEO: Final = int(zmq.RCVTIMEO)
_zmq_poll = zmq.zmq_poll


class SyncZmqSocket:
    """Non-blocking (or bounded) multipart calls on one plain ``zmq.Socket``, from the
    thread that made this object; see the module docstring."""

    __slots__ = ("_closed", "_owner", "_probe", "_rcvtimeo", "_socket", "_type_name")

    def __init__(self, socket: zmq.Socket[bytes]) -> None:
        self._socket = socket
        self._closed = False  # by close(): a cheaper read than the socket's own
        self._owner = threading.get_ident()
        self._type_name = socket_type_name(socket)
        self._probe = [(socket, _POLLIN)]  # zmq_poll's: has the socket input?
        self._rcvtimeo = -1  # the ZMQ_RCVTIMEO (ms) last set (libzmq's default)

    @property
    def socket(self) -> zmq.Socket[bytes]:
        """The wrapped socket. Options may be set on it; do not send or receive on it."""
        return self._socket

    @property
    def closed(self) -> bool:
        return self._closed or self._socket.closed

    def recv_multipart_within(self, timeout: float) -> list[bytes] | None:
        """The next message, waiting up to ``timeout`` s (millisecond granularity) for
        one when none is queued; None when none came."""
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        sock = self._socket
        try:
            if timeout:
                ms = int(timeout * 1000)
                if ms != self._rcvtimeo:
                    sock.setsockopt(_RCVTIMEO, ms)
                    self._rcvtimeo = ms
                frame = sock.recv(0, copy=False)
            elif self._closed:  # zmq_poll would poll another descriptor
                raise SocketClosed(f"{self._type_name} socket is closed")
            elif _zmq_poll(self._probe, 0):
                frame = sock.recv(_NOBLOCK, copy=False)
            else:
                return None
            parts = [frame.bytes]
            while frame.more:
                frame = sock.recv(_NOBLOCK, copy=False)
                parts.append(frame.bytes)
            return parts
        except zmq.Again:
            return None
        except zmq.ZMQError as exc:
            raise self._closed_error(exc) from None

    def poll_readable(self, timeout: float) -> bool:
        """Block up to ``timeout`` s until a message can be received (taking none)."""
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        if self._closed:  # zmq_poll would poll another descriptor
            raise SocketClosed(f"{self._type_name} socket is closed")
        try:
            return bool(_zmq_poll(self._probe, int(timeout * 1000)))
        except zmq.ZMQError as exc:
            raise self._closed_error(exc) from None

    def send_multipart_nowait(self, frames: Frames) -> None:
        """Queue one message, all its parts, or raise ``zmq.Again`` (the high-water
        mark) or another ``zmq.ZMQError`` (``EHOSTUNREACH``...), having queued none."""
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        try:
            if len(frames) == 1:  # nothing to check first: one part is queued or not
                self._socket.send(frames[0], _NOBLOCK)
            else:
                send_frames(self._socket, frames)
        except zmq.ZMQError as exc:
            raise self._closed_error(exc) from None

    def send_pair_nowait(self, first: bytes, second: bytes) -> None:
        """:meth:`send_multipart_nowait` of ``[first, second]`` without a frame list."""
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        sock = self._socket
        try:
            sock.send(first, _NOBLOCK_SNDMORE)
            sock.send(second, _NOBLOCK)
        except zmq.ZMQError as exc:
            raise self._closed_error(exc) from None

    def refresh_events(self) -> int:
        """Read ``EVENTS`` now (libzmq processes its I/O thread's news: a drained pipe)."""
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        try:
            return int(self._socket.get(_EVENTS))
        except zmq.ZMQError as exc:
            raise self._closed_error(exc) from None

    async def recv_multipart(self) -> NoReturn:
        """Not offered: no task waits on a synchronous loop's socket."""
        raise SocketClosed(f"{self._type_name} socket is a synchronous loop's: an event "
                           "loop receives from a transport entered with async with")

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket (``linger_ms``: how long libzmq keeps sending what is
        queued, in the background); idempotent, never blocks."""
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        self._closed = True
        if not self._socket.closed:
            self._socket.close(linger=linger_ms)

    def _closed_error(self, exc: zmq.ZMQError) -> Exception:
        if self.closed or exc.errno == zmq.ENOTSOCK:
            return SocketClosed(f"{self._type_name} socket is closed")
        return exc

    def _raise_foreign(self) -> NoReturn:
        raise ForeignThreadError(
            f"{self._type_name} socket is owned by thread {self._owner} but was used from "
            f"thread {threading.get_ident()}; libzmq sockets are not thread-safe")
