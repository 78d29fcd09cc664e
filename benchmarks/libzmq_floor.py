"""libzmq's own floor: synchronous pyzmq ping-pong between two processes over ipc.

No event loop, no codec, no dispatch: the parent's ROUTER sends a frame of
the same size as a ctlwire request to the child's DEALER, which sends it
straight back (``python -m ctlwire.benchmarks.libzmq_floor --rank 0
--connect ADDR``). Its round trip is what every Python stack on top of
pyzmq starts from; the bench reports each stack as a multiple of it.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import zmq

__all__ = ["FloorPinger", "echo_main", "ping_pong"]

_STOP = b"\x00stop"


class FloorPinger:
    """The timing side: binds a ROUTER at ``address``; the echo process dials it.

    Kept open across blocks so floor blocks can alternate with the stacks' blocks.
    """

    def __init__(self, address: str, size: int = 96) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 200)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.RCVTIMEO, 10_000)
        self.sock.bind(address)
        self.identity: bytes | None = None
        self.frame = b"x" * size

    def block(self, n: int) -> list[float]:
        """``n`` timed round trips (µs each); the first call waits for the echo's hello."""
        sock = self.sock
        if self.identity is None:
            self.identity, _hello = sock.recv_multipart()
        identity, frame = self.identity, self.frame
        clock = time.perf_counter_ns
        send, recv = sock.send_multipart, sock.recv_multipart
        samples: list[float] = []
        for _ in range(n):
            t0 = clock()
            send((identity, frame))
            recv()
            samples.append((clock() - t0) / 1000.0)
        return samples

    def close(self) -> None:
        """Tell the echo process to stop, close the socket."""
        if self.identity is not None:
            with contextlib.suppress(zmq.ZMQError):
                self.sock.send_multipart((self.identity, _STOP), zmq.NOBLOCK)
        self.sock.close()
        self.ctx.term()


def ping_pong(address: str, n: int, size: int = 96, warmup: int = 200) -> list[float]:
    """``n`` timed round trips (after ``warmup``) against an echo process dialing ``address``."""
    pinger = FloorPinger(address, size)
    try:
        pinger.block(warmup)
        return pinger.block(n)
    finally:
        pinger.close()


def echo_main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ctlwire.benchmarks.libzmq_floor")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--connect", required=True)
    args = p.parse_args(argv)
    stopped: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        stopped.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 100)  # a blocking recv that still notices SIGTERM
    sock.setsockopt(zmq.IDENTITY, b"floor-%d" % args.rank)
    sock.connect(args.connect)
    sock.send(b"hello")
    print(f"READY {args.rank} 0", flush=True)
    try:
        while not stopped:
            try:
                frame = sock.recv()
            except zmq.Again:
                continue
            if frame == _STOP:
                break
            sock.send(frame)
    finally:
        sock.close()
        ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(echo_main())
