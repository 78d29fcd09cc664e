"""Dialing again where libzmq gave up: a connection that ended on a protocol error.

libzmq redials a connecting socket after a connection error (the peer closed,
the network failed), but ends the session for good after a protocol error: a
frame above the socket's ``MAXMSGSIZE`` (a peer configured with a larger limit,
or a hostile one), or bytes that are not ZMTP. The socket then has no connection
and never gets one back: the rank stays unroutable until its process restarts.

Its monitor tells the two apart: a connection error's ``DISCONNECTED`` is followed
at once by ``CONNECT_RETRIED``; a protocol error's by nothing. :class:`SessionWatch`
decides from the events (pure: events and times in, a verdict out);
:class:`Redialer` reads a socket's monitor without blocking, from the socket's own
thread, and dials again (``disconnect`` then ``connect`` of the same endpoint: a
new session under the same identity) once a ``DISCONNECTED`` has gone ``grace``
seconds without a retry or a new connection.
"""

from __future__ import annotations

import contextlib
from typing import Final

import zmq
from zmq.utils.monitor import parse_monitor_message

__all__ = ["EVENTS", "Redialer", "SessionWatch"]

#: the monitor events a :class:`SessionWatch` reads
EVENTS: Final = (zmq.EVENT_CONNECTED | zmq.EVENT_CONNECT_DELAYED | zmq.EVENT_CONNECT_RETRIED
                 | zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
_ALIVE: Final = EVENTS & ~zmq.EVENT_DISCONNECTED  # libzmq is connected, or dialing


class SessionWatch:
    """Whether a dialing socket's connection ended for good, from its monitor events."""

    def __init__(self, grace: float = 1.0) -> None:
        self.grace = grace
        self._down_since: float | None = None

    def note(self, event: int, now: float) -> None:
        """A monitor event of the socket, seen at ``now`` (monotonic seconds)."""
        if event & zmq.EVENT_DISCONNECTED:
            self._down_since = now
        elif event & _ALIVE:
            self._down_since = None

    def due(self, now: float) -> bool:
        """True when the connection ended ``grace`` seconds ago and libzmq has not
        dialed since: it will not."""
        return self._down_since is not None and now - self._down_since >= self.grace

    def redialed(self) -> None:
        """The socket was dialed again."""
        self._down_since = None


class Redialer:
    """Dials ``sock`` at ``address`` again when its connection ended for good.

    Use from the thread that owns ``sock`` (libzmq sockets have one owner):
    :meth:`tend` reads the socket's monitor without blocking and redials when due.
    :meth:`close` before closing ``sock``."""

    def __init__(self, sock: zmq.Socket[bytes], address: str, *, grace: float = 1.0) -> None:
        self._sock = sock
        self._address = address
        self._monitor = sock.get_monitor_socket(EVENTS)
        self.watch = SessionWatch(grace)
        #: how many times the socket was dialed again
        self.redials = 0

    def tend(self, now: float) -> bool:
        """Read the monitor's events; dial again when due. True when it did."""
        monitor, watch = self._monitor, self.watch
        while True:
            try:
                msg = monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            watch.note(int(parse_monitor_message(msg)["event"]), now)
        if not watch.due(now):
            return False
        with contextlib.suppress(zmq.ZMQError):  # the endpoint's session is gone already
            self._sock.disconnect(self._address)
        self._sock.connect(self._address)
        watch.redialed()
        self.redials += 1
        return True

    def close(self) -> None:
        """Stop monitoring (before the socket closes)."""
        if self._monitor.closed:
            return
        with contextlib.suppress(zmq.ZMQError):
            if not self._sock.closed:
                self._sock.disable_monitor()
        self._monitor.close(0)
