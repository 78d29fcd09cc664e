"""Multipart frame helpers over a plain ``zmq.Socket``, never blocking.

What :class:`~ctlwire.transports.zmq_socket.AsyncZmqSocket` sends and receives
goes through these: one non-blocking libzmq call per frame, all frames of a
message or none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, cast

import zmq

__all__ = ["Frames", "frames_size", "receiver_for", "recv_frames", "recv_queued", "recv_routed",
           "send_frames", "socket_type_name"]

Frames = Sequence[bytes | bytearray | memoryview | zmq.Frame]
"""A multipart message to send: one buffer per frame."""

_NOBLOCK: Final = int(zmq.NOBLOCK)
_EVENTS: Final = int(zmq.EVENTS)
_POLLIN: Final = int(zmq.POLLIN)
_NOBLOCK_SNDMORE: Final = int(zmq.NOBLOCK) | int(zmq.SNDMORE)


def recv_frames(socket: zmq.Socket[bytes], meta: list[str | None] | None = None
                ) -> list[bytes]:
    """The next queued message, its parts as bytes; raises ``zmq.Again`` when none is
    queued (the parts of a message arrive together, so only the first part can).

    ``meta``: ``meta[0]`` is set to the ZAP ``User-Id`` of the message's sender (None
    when the authenticator gave none)."""
    frame = socket.recv(_NOBLOCK, copy=False)
    parts = [frame.bytes]
    while frame.more:
        frame = socket.recv(_NOBLOCK, copy=False)
        parts.append(frame.bytes)
    if meta is not None:
        try:
            meta[0] = str(frame.get("User-Id"))
        except zmq.ZMQError:
            meta[0] = None
    return parts


def recv_routed(socket: zmq.Socket[bytes], meta: list[str | None] | None = None
                ) -> list[bytes]:
    """:func:`recv_frames` for a ``ROUTER`` socket: the same parts, the routing id
    received as ``bytes`` directly (no frame object: libzmq always follows it with
    the message's parts, at least one)."""
    return [socket.recv(_NOBLOCK), *recv_frames(socket, meta)]


def receiver_for(socket: zmq.Socket[bytes]) -> Callable[..., list[bytes]]:
    """How ``socket`` receives one message: :func:`recv_routed` for a ``ROUTER``
    (whose messages always start with a routing id), else :func:`recv_frames`."""
    return recv_routed if socket.get(zmq.TYPE) == zmq.ROUTER else recv_frames


def recv_queued(socket: zmq.Socket[bytes], meta: list[str | None] | None, limit: int,
                out: list[list[bytes]], recv: Callable[..., list[bytes]] = recv_frames
                ) -> None:
    """Append the queued messages (as ``recv`` returns them: :func:`recv_frames`, or
    :func:`recv_routed` for a ``ROUTER``) to ``out`` until none is queued or ``out``
    holds ``limit``. ``EVENTS`` is read once, first;
    then messages are received until libzmq says ``EAGAIN`` (one exception for the
    burst costs less than an ``EVENTS`` read per message)."""
    if len(out) >= limit or not socket.get(_EVENTS) & _POLLIN:  # type: ignore[operator]
        return
    try:
        while len(out) < limit:
            out.append(recv(socket, meta))
    except zmq.Again:
        pass


def send_frames(socket: zmq.Socket[bytes], frames: Frames) -> None:
    """Queue ``frames`` as one message without blocking: all parts, or (``zmq.Again``
    or another ``zmq.ZMQError`` at the first part) none. Every frame is checked
    before the first is queued (:class:`TypeError` for one that is not a buffer)."""
    for i, frame in enumerate(frames):
        if not isinstance(frame, (bytes, zmq.Frame, memoryview)):
            try:
                memoryview(frame)
            except Exception:
                raise TypeError(f"Frame {i} ({repr(frame)[:32]}) does not support the "
                                "buffer interface.") from None
    last = len(frames) - 1
    for i in range(last):
        socket.send(frames[i], _NOBLOCK_SNDMORE)
    socket.send(frames[last], _NOBLOCK)


def frames_size(frames: Sequence[bytes]) -> int:
    """The bytes of a received message, all parts counted."""
    return sum(len(f) for f in frames)


def socket_type_name(socket: zmq.Socket[bytes]) -> str:
    """``"ROUTER"``, ``"DEALER"``… (``"UNKNOWN"`` when libzmq cannot tell)."""
    try:
        return zmq.SocketType(cast(int, socket.get(zmq.TYPE))).name
    except (ValueError, zmq.ZMQError):
        return "UNKNOWN"
