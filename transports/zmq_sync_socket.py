"""A plain pyzmq socket used directly by the thread that owns it: the socket
mechanism of an engine driven by a synchronous loop (``EngineEndpoint.poll()``,
``run_blocking``), where no task ever waits on the socket.
:class:`~ctlwire.transports.zmq_socket.AsyncZmqSocket` is the one for an event loop;
the non-blocking calls of both are the same, so an engine transport uses either
through the same code (:mod:`~ctlwire.transports.zmq_engine_base`).

Guarantees:

* The socket belongs to the thread that created this object; every call from
  another raises :class:`~ctlwire.transports.errors.ForeignThreadError` (libzmq
  sockets are not thread-safe). After :meth:`SyncZmqSocket.close`, calls raise
  :class:`~ctlwire.transports.errors.SocketClosed`.
* A receive that finds nothing raises nothing: it asks the socket's ``EVENTS``
  first (``zmq_poll`` with no timeout). A receive with a timeout is one blocking
  receive (``ZMQ_RCVTIMEO``): a message already queued is taken without a system
  call. All parts of a message are returned together, in order.
* A send never blocks: all parts are queued, or (``zmq.Again`` at the high-water
  mark, another ``zmq.ZMQError``) none.
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
    """Blocking-free (or bounded-blocking) multipart calls on one plain ``zmq.Socket``,
    from its owner thread only; see the module docstring."""

    __slots__ = ("_closed", "_owner", "_probe", "_rcvtimeo", "_socket", "_type_name")

    def __init__(self, socket: zmq.Socket[bytes]) -> None:
        """Wrap ``socket``; the calling thread becomes its owner.

        :raises SocketClosed: if ``socket`` is already closed.
        """
        if socket.closed:
            raise SocketClosed("cannot wrap a closed zmq socket")
        self._socket = socket
        self._closed = False  # by close(): a cheaper read than the socket's own
        self._owner = threading.get_ident()
        self._type_name = socket_type_name(socket)
        #: zmq_poll's argument asking whether the socket has input
        self._probe = [(socket, _POLLIN)]
        #: the ZMQ_RCVTIMEO (ms) last set (libzmq's default: -1, wait for ever)
        self._rcvtimeo = -1

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<SyncZmqSocket {self._type_name} {state} owner={self._owner}>"

    @property
    def socket(self) -> zmq.Socket[bytes]:
        """The wrapped socket. Options may be set on it; do not send or receive on it."""
        return self._socket

    @property
    def closed(self) -> bool:
        return self._closed or self._socket.closed

    def recv_multipart_within(self, timeout: float) -> list[bytes] | None:
        """The next message, waiting up to ``timeout`` s (millisecond granularity) for
        one when none is queued; None when none came.

        :raises ForeignThreadError: if called from a thread other than the owner.
        :raises SocketClosed: if the socket is closed.
        """
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

    def recv_multipart_nowait(self) -> list[bytes] | None:
        """The next queued message, or None if none is queued; raises as
        :meth:`recv_multipart_within` does."""
        return self.recv_multipart_within(0.0)

    def poll_readable(self, timeout: float) -> bool:
        """Block up to ``timeout`` s until a message can be received (it takes none).

        :raises ForeignThreadError: if called from a thread other than the owner.
        :raises SocketClosed: if the socket is closed.
        """
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        if self._closed:  # zmq_poll would poll another descriptor
            raise SocketClosed(f"{self._type_name} socket is closed")
        try:
            return bool(_zmq_poll(self._probe, int(timeout * 1000)))
        except zmq.ZMQError as exc:
            raise self._closed_error(exc) from None

    def send_multipart_nowait(self, frames: Frames) -> None:
        """Queue one multipart message in libzmq, or raise.

        :raises zmq.Again: if the high-water mark is reached (nothing was queued).
        :raises zmq.ZMQError: what libzmq reports (``EHOSTUNREACH`` from a ROUTER with
            ``ROUTER_MANDATORY`` for an unknown identity).
        :raises ForeignThreadError: if called from a thread other than the owner.
        :raises SocketClosed: if the socket is closed.
        """
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
        """Read ``EVENTS`` now: libzmq processes what its I/O thread told the socket
        (a full pipe that was drained, a message that arrived); returns ``EVENTS``.

        :raises ForeignThreadError: if called from a thread other than the owner.
        :raises SocketClosed: if the socket is closed.
        """
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        try:
            return int(self._socket.get(_EVENTS))
        except zmq.ZMQError as exc:
            raise self._closed_error(exc) from None

    async def recv_multipart(self) -> NoReturn:
        """Not offered: no task may wait on a synchronous loop's socket (an engine
        transport entered with ``async with`` uses an AsyncZmqSocket)."""
        raise SocketClosed(f"{self._type_name} socket is driven by a synchronous loop: "
                           "an event loop receives from a transport entered with async with")

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket; ``linger_ms`` bounds how long libzmq keeps sending what is
        queued, in the background. Idempotent; never blocks.

        :raises ForeignThreadError: if called from a thread other than the owner.
        """
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        self._closed = True
        if not self._socket.closed:
            self._socket.close(linger=linger_ms)

    def _closed_error(self, exc: zmq.ZMQError) -> Exception:
        """SocketClosed when the socket is closed, else ``exc`` itself."""
        if self.closed or exc.errno == zmq.ENOTSOCK:
            return SocketClosed(f"{self._type_name} socket is closed")
        return exc

    def _raise_foreign(self) -> NoReturn:
        raise ForeignThreadError(
            f"{self._type_name} socket is owned by thread {self._owner} but was used from "
            f"thread {threading.get_ident()}; libzmq sockets are not thread-safe")
