"""Socket monitor events, read by an anyio task.

:class:`SocketMonitor` wraps ``socket.get_monitor_socket()`` (an inproc PAIR)
and yields ``(event, value, endpoint)`` tuples. Connected/accepted and
disconnected/closed events are what the transports turn into peer events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

import zmq
from zmq.utils.monitor import parse_monitor_message

from ctlwire.transports.errors import SocketClosed
from ctlwire.transports.zmq_socket import AsyncZmqSocket

__all__ = ["DOWN_EVENTS", "UP_EVENTS", "SocketMonitor"]

UP_EVENTS: Final = zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | zmq.EVENT_HANDSHAKE_SUCCEEDED
DOWN_EVENTS: Final = zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
_WATCHED: Final = (UP_EVENTS | DOWN_EVENTS | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                   | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                   | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_CONNECT_DELAYED
                   | zmq.EVENT_MONITOR_STOPPED)


class SocketMonitor:
    """Monitor events of one socket; the reader must run in the socket's thread."""

    def __init__(self, socket: zmq.Socket[bytes]) -> None:
        self._target = socket
        raw = socket.get_monitor_socket(_WATCHED)
        self._sock = AsyncZmqSocket(raw)
        self.auth_failures = 0

    async def events(self) -> AsyncIterator[tuple[int, int, str]]:
        """``(event, value, endpoint)`` until the monitor is stopped or closed."""
        while True:
            try:
                msg = await self._sock.recv_multipart()
            except SocketClosed:
                return
            parsed = parse_monitor_message(msg)
            event = int(parsed["event"])
            if event == zmq.EVENT_MONITOR_STOPPED:
                return
            if event & (zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                self.auth_failures += 1
            endpoint = parsed["endpoint"]
            yield event, int(parsed["value"]), (endpoint.decode(errors="replace")
                                               if isinstance(endpoint, bytes) else str(endpoint))

    def close(self) -> None:
        """Stop monitoring and close the monitor socket (before closing the target)."""
        if self._sock.closed:
            return
        try:
            if not self._target.closed:
                self._target.disable_monitor()
        except zmq.ZMQError:
            pass
        self._sock.close(linger_ms=0)
