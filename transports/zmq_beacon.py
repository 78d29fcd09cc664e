"""Liveness beacons: an engine's heartbeats from a thread and a socket of their own.

Why a thread of its own: a real engine blocks its Python thread for seconds
to minutes (weight loads, NCCL broadcasts, CUDA-graph capture, long
prefills). Heartbeats sent from that thread stop whenever it blocks, and a
busy engine is taken for a dead one. :class:`LivenessBeacon` runs in a daemon
thread that owns one socket of its own (libzmq sockets are not thread-safe:
every socket has exactly one owner thread, and the request socket stays with
the engine's thread) and sends a :class:`~ctlwire.transports.envelope.Heartbeat`
every interval, built by a ``status`` callback that reads what the engine is
doing (the request running and since when, loop iterations, progress).

Why that is sound as a liveness signal:

* **kill -9** ends both connections: the client's socket monitor sees them
  close, and the beacon's heartbeats stop.
* **SIGSTOP** freezes every thread of the process, the beacon's too: its
  heartbeats stop and the rank is Lost after the configured misses.
* **A link going down** stops the heartbeats the same way.
* **A blocked handler or step** does not stop them: Python switches threads
  at least every ``sys.getswitchinterval()`` (5 ms) while the handler runs
  Python code, and always while it sleeps, waits on IO or runs C code that
  releases the GIL (numpy, torch, NCCL waits). A C extension that holds the
  GIL for seconds would delay heartbeats: the heartbeat then says nothing
  false (the process really is unresponsive), and the rank recovers when
  heartbeats resume.

Progress travels in the same heartbeats, so a caller sees a long
``update_weights`` move while its handler blocks.

**Beacons beat in phase**, at the multiples of the interval on the (system-wide)
monotonic clock: a client watching many ranks of a machine reads their
heartbeats in one wake-up, not one wake-up each; detection time is unchanged.

The beacon's socket is small and never blocks: a high-water mark of a few
frames, ``IMMEDIATE`` (nothing queued for a peer that is not connected),
``LINGER`` 0, and heartbeats dropped (counted) when the peer does not read.
libzmq's ZMTP heartbeats are not needed for any of this.

A beacon that binds (an engine that binds its request socket) is a ROUTER that
heartbeats to the clients that said hello (:class:`~ctlwire.transports.beacon_routes.BeaconRoutes`),
never a PUB: a PUB keeps whatever subscriptions a peer sends.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import zmq

from ctlwire.transports.beacon_routes import BeaconRoutes
from ctlwire.transports.codec import Codec
from ctlwire.transports.connection_guard import ConnectionGuard
from ctlwire.transports.envelope import Heartbeat

__all__ = ["BeaconStatus", "LivenessBeacon", "configure_beacon_socket"]

BeaconStatus = Callable[[], "Heartbeat | list[Heartbeat] | None"]
"""Builds the next heartbeat (None: send nothing this time), or, for a group
beacon, the heartbeats of its ranks (sent as one message, a frame each). Called
from the beacon's thread: it must only read the engine's state."""


def configure_beacon_socket(sock: zmq.Socket[bytes]) -> None:
    """Options for a beacon socket: tiny queues, no linger, nothing queued for absent peers."""
    sock.setsockopt(zmq.SNDHWM, 4)
    sock.setsockopt(zmq.RCVHWM, 4)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, 4096)
    if sock.type in (zmq.DEALER, zmq.PUSH):
        sock.setsockopt(zmq.IMMEDIATE, 1)
    if sock.type == zmq.ROUTER:  # a route that is gone is an error, not a silent drop
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.RECONNECT_IVL, 100)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1_000)


class LivenessBeacon:
    """Sends ``status()`` every ``interval`` seconds from a thread of its own.

    ``make_socket`` creates, configures and binds or connects the beacon's
    socket; it is called in the beacon's thread, which is the socket's only
    user. :meth:`start` returns once the socket is up and the first heartbeat
    has gone out, and re-raises whatever ``make_socket`` raised (a bind that
    failed). :meth:`stop` ends the thread and closes the socket; it never hangs.
    """

    def __init__(self, make_socket: Callable[[], zmq.Socket[bytes]], codec: Codec,
                 interval: float, status: BeaconStatus, *, name: str = "ctlwire-beacon",
                 max_connections: int | None = None,
                 routes: BeaconRoutes | None = None) -> None:
        if interval <= 0:
            raise ValueError("beacon interval must be > 0")
        self.interval = interval
        #: a socket that binds: at most this many connections stay open (None: no bound)
        self.max_connections = max_connections
        self._guard: ConnectionGuard | None = None
        #: a ROUTER beacon's clients (None: the socket has one peer, or routes itself)
        self.routes = routes
        self.sent = 0
        self.dropped = 0
        self._make_socket = make_socket
        self._codec = codec  # msgspec encoders are thread-safe
        self._status = status
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _beat(self, sock: zmq.Socket[bytes]) -> None:
        routes = self.routes
        if routes is not None:
            routes.read(sock)
        try:
            hb = self._status()
        except Exception:  # a status bug must not silence the beacon
            hb = None
            self.dropped += 1
        if not hb:
            return
        encode = self._codec.encode
        frames = [encode(one) for one in hb] if isinstance(hb, list) else [encode(hb)]
        if routes is not None:
            sent, dropped = routes.send(sock, frames)
            self.sent += sent
            self.dropped += dropped
            return
        try:
            sock.send_multipart(frames, zmq.NOBLOCK)
            self.sent += 1
        except zmq.Again:
            self.dropped += 1  # the peer is not reading, or not connected yet

    def _run(self) -> None:
        try:
            sock = self._make_socket()
        except BaseException as exc:  # reported to start()'s caller
            self._error = exc
            self._ready.set()
            return
        try:
            try:
                if self.max_connections is not None:
                    self._guard = ConnectionGuard(sock, self.max_connections,
                                                  name=f"{self._thread.name}-guard")
                    self._guard.start()
                self._beat(sock)
            finally:
                self._ready.set()
            interval = self.interval
            while not self._stop.wait(interval - time.monotonic() % interval):
                self._beat(sock)
        except zmq.ZMQError:
            pass  # the context is terminating: the transport is closing
        finally:
            if self._guard is not None:
                self._guard.stop()
            sock.close(0)

    @property
    def connections_refused(self) -> int:
        """Connections refused because ``max_connections`` were open (sockets that bind)."""
        return self._guard.refused if self._guard is not None else 0
