"""The clients a bound beacon heartbeats to: routes of a ROUTER, learnt from hellos.

An engine that binds its beacon cannot use a PUB: libzmq keeps every subscription
prefix a connected peer sends (in manual XPUB mode too), so a peer sending random
ones grows the process without bound. The beacon binds a ROUTER instead, and a
client's beacon DEALER says hello with its ordinary client heartbeat (rank -1);
:class:`BeaconRoutes` keeps the routes that did, and the beacon sends each
heartbeat to each of them. libzmq then holds nothing a peer chooses beyond its
connection's pipes (a high-water mark of a few frames of at most 4 KiB).

Guarantees:

* **Bounded.** At most ``max_routes`` routes. A new route takes the place of the
  least recently heard one only if that one has been silent ``idle`` seconds;
  otherwise it is refused and counted (:attr:`refused_routes`), so peers cannot
  push a live client out. A route a send finds gone (``EHOSTUNREACH``) is
  forgotten at once, one silent ``idle`` seconds when the table is full.
* **Nothing else is kept.** A frame that is not a client heartbeat is dropped and
  counted (:attr:`refused_frames`); at most ``per_read`` frames are read per beat,
  the rest waiting in libzmq's bounded pipes.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import zmq

from ctlwire.transports.codec import Codec
from ctlwire.transports.envelope import Heartbeat

__all__ = ["BeaconRoutes"]


class BeaconRoutes:
    """The routes a ROUTER beacon heartbeats to; used by the beacon's thread only."""

    def __init__(self, codec: Codec, *, max_routes: int = 64, idle: float = 10.0,
                 per_read: int = 1024) -> None:
        self.codec = codec
        self.max_routes = max_routes
        self.idle = idle
        self.per_read = per_read
        self._heard: OrderedDict[bytes, float] = OrderedDict()  # route -> last hello
        self.refused_routes = 0
        self.refused_frames = 0

    def __len__(self) -> int:
        return len(self._heard)

    def read(self, sock: zmq.Socket[bytes]) -> None:
        """Take the hellos waiting on ``sock`` (at most ``per_read`` frames)."""
        for _ in range(self.per_read):
            try:
                msg = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(msg) == 2 and self._is_hello(msg[1]):
                self._note(msg[0])
            else:
                self.refused_frames += 1

    def _is_hello(self, frame: bytes) -> bool:
        try:
            env = self.codec.decode(frame)
        except Exception:
            return False
        return type(env) is Heartbeat and env.rank == -1

    def _note(self, route: bytes) -> None:
        heard = self._heard
        now = time.monotonic()
        if route in heard:
            heard[route] = now
            heard.move_to_end(route)
            return
        if len(heard) >= self.max_routes:
            oldest, last = next(iter(heard.items()))
            if now - last < self.idle:
                self.refused_routes += 1
                return
            del heard[oldest]
        heard[route] = now

    def send(self, sock: zmq.Socket[bytes], frames: list[bytes]) -> tuple[int, int]:
        """Send ``frames`` (one message) to every route: (sent, dropped). A route that
        is gone is forgotten; one whose pipe is full misses this beat."""
        sent = dropped = 0
        for route in list(self._heard):
            try:
                sock.send_multipart([route, *frames], zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                dropped += 1
            except zmq.ZMQError as exc:
                if exc.errno != zmq.EHOSTUNREACH:
                    raise
                del self._heard[route]
        return sent, dropped
