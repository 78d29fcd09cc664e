"""Many engine ranks in one process: ``python -m ctlwire.benchmarks.multi_rank_engine``.

``python -m ctlwire.benchmarks.multi_rank_engine --rank P --first R --count K --connect ADDR``

Hosts ranks ``R .. R+K-1`` in one process so that 256 ranks fit on a 2-core
machine (e.g. 4 processes of 64). Every rank is a full
:class:`~ctlwire.kernel.engine.endpoint.EngineEndpoint` with its own request
socket and routing identity (``rank-N``, a DEALER dialling the client's ROUTER
at ``--connect``) and its own liveness beacon (a thread and a socket of its
own, as in production: the beacons are *not* turned off). By default the K
ranks share one beacon (:func:`~ctlwire.kernel.engine.shared_beacon.start_shared_beacon`:
one message a beat carrying K heartbeats); ``--beacon per-rank`` gives each
rank a beacon thread and socket of its own, the heartbeat traffic of K
single-rank engine processes. The K endpoints share one ``zmq.Context`` (one
libzmq IO thread per process instead of K).

Poll mode, one thread: a ``zmq.Poller`` waits on the K request sockets, and
each endpoint whose socket is readable (or whose heartbeat is due) gets
``endpoint.poll()`` in turn — the synchronous loop of
``ctlwire.kernel.app.engine_process --mode poll``, over K endpoints instead of one.
With one endpoint (K = 1) it is that loop exactly: ``poll(1, timeout)`` round after
round, the wait being the receive.
The request sockets are used only by this thread (one owner per socket); the
beacon sockets only by their beacon threads.

``P`` (``--rank``) is the process index; the process prints ``READY P
<incarnation of its first endpoint>`` once every endpoint is open (the line
:class:`~ctlwire.kernel.app.engine_fleet.EngineFleet` waits for) and exits
cleanly on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

import zmq

from ctlwire.kernel.app.engine_process import diagnostic_methods
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.engine.shared_beacon import start_shared_beacon
from ctlwire.transports.zmq_beacon import LivenessBeacon
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

from .call_counter import serve_counting_signals

__all__ = ["main", "serve_ranks"]


def serve_ranks(address: str, ranks: Sequence[int], stop: threading.Event, *,
                process_index: int = 0, heartbeat: float = 0.25,
                shared_beacon: bool = True) -> None:
    """Open one endpoint per rank on ``address`` and serve them all from this thread."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    endpoints: list[EngineEndpoint] = []
    poller = zmq.Poller()
    by_socket: dict[Any, EngineEndpoint] = {}
    beacon: LivenessBeacon | None = None
    try:
        for rank in ranks:
            transport = ZmqDealerEngineTransport(address, rank, context=ctx)
            endpoint = EngineEndpoint(transport, rank=rank, heartbeat_interval=heartbeat,
                                      beacon=not shared_beacon)
            diagnostic_methods(endpoint)
            endpoints.append(endpoint)
        if shared_beacon:
            beacon = start_shared_beacon(endpoints)
        for endpoint in endpoints:
            endpoint.open()
            dealer = endpoint.transport
            assert isinstance(dealer, ZmqDealerEngineTransport)
            raw = dealer.receiving_socket  # this thread owns it; poll it with the rest
            assert raw is not None
            poller.register(raw, zmq.POLLIN)
            by_socket[raw] = endpoint
        print(f"READY {process_index} {endpoints[0].incarnation}", flush=True)
        # in-band heartbeats of the endpoints (the beacons carry liveness) fall due
        # at least every ``heartbeat``: wake up that often to let each poll() send them
        idle_ms = max(1, int(heartbeat * 1000 / 2))
        if len(endpoints) == 1:  # engine_process's loop: the wait is the receive
            while not stop.is_set():
                endpoints[0].poll(1, idle_ms / 1000)
            return
        while not stop.is_set():
            ready = poller.poll(idle_ms)
            if not ready:
                for endpoint in endpoints:
                    endpoint.poll()
                continue
            for raw, _ in ready:
                by_socket[raw].poll()
    finally:
        if beacon is not None:
            beacon.stop()
        for endpoint in endpoints:
            endpoint.close()
        ctx.term()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ctlwire.benchmarks.multi_rank_engine")
    p.add_argument("--rank", type=int, required=True, help="the process index")
    p.add_argument("--first", type=int, required=True, help="the first rank hosted")
    p.add_argument("--count", type=int, required=True, help="how many ranks to host")
    p.add_argument("--connect", required=True, help="the client's ROUTER address")
    p.add_argument("--heartbeat", type=float, default=0.25)
    p.add_argument("--beacon", choices=("shared", "per-rank"), default="shared",
                   help="one beacon for the process's ranks (default) or one per rank")
    p.add_argument("--count-calls", metavar="PATH",
                   help="count this process's calls between SIGUSR1 and SIGUSR2, into PATH")
    args = p.parse_args(argv)
    if args.count_calls:
        serve_counting_signals(args.count_calls)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    serve_ranks(args.connect, range(args.first, args.first + args.count), stop,
                process_index=args.rank, heartbeat=args.heartbeat,
                shared_beacon=args.beacon == "shared")
    return 0


if __name__ == "__main__":
    sys.exit(main())
