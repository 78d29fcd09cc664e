"""The smallest engine that speaks ctlwire's wire protocol: a pyzmq loop.

``python -m ctlwire.benchmarks.protocol_engine --rank N --connect ADDR``

What the peer of a ctlwire engine is when both are driven by the same
:class:`~ctlwire.kernel.client.control_client.ControlClient`: a DEALER with
identity ``rank-N`` dials the client's ROUTER, takes one frame with a blocking
receive (a receive timeout bounds the wait, as ``EngineEndpoint.poll(1, 0.05)``
does), decodes the envelope (:class:`~ctlwire.transports.envelope.Request`),
decodes the payload, calls the handler from a dict, encodes the
:class:`~ctlwire.transports.envelope.Reply` and sends it. A client's heartbeat
is decoded and ignored. It sends its own heartbeats in-band, on the same DEALER,
once an interval (the client knows and keeps the rank by them; the protocol
allows either identity).

What it does not do (and a ctlwire engine does): deadlines, duplicate detection,
fences, idempotency keys, typed refusals, the inbound table, a beacon thread,
progress in its heartbeats, an outbox for a full socket.

Prints ``READY <rank> <incarnation>`` once connected (the line
:class:`~ctlwire.app.engine_fleet.EngineFleet` waits for) and exits
cleanly on SIGTERM/SIGINT, or once its parent process is gone. :func:`serve` is
also the ``bare`` variant of :mod:`ctlwire.benchmarks.engine_cpu`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import zmq

from ctlwire.transports.envelope import ErrorInfo, Heartbeat, Reply, Request

__all__ = ["INCARNATION", "main", "serve"]

INCARNATION = 1
"""The incarnation in this engine's heartbeats and replies (constant: it never restarts)."""
_HEARTBEAT_S = 0.25
_RECEIVE_TIMEOUT_MS = 50


def _methods() -> dict[str, Callable[[Any], Any]]:
    def echo(value: Any = None) -> Any:
        return value

    return {"echo": echo}


def serve(ctx: zmq.Context[zmq.Socket[bytes]], address: str, rank: int,
          stop: Callable[[], bool], on_ready: Callable[[], None] = lambda: None,
          on_wait: Callable[[], None] = lambda: None) -> None:
    """Serve rank ``rank`` at ``address`` until ``stop()``, looked at once a heartbeat
    interval and at every receive timeout; ``on_wait`` is called before each receive."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"rank-%d" % rank)
    sock.setsockopt(zmq.LINGER, 200)
    sock.setsockopt(zmq.SNDHWM, 10_000)
    sock.setsockopt(zmq.RCVHWM, 10_000)
    sock.setsockopt(zmq.RCVTIMEO, _RECEIVE_TIMEOUT_MS)
    sock.connect(address)
    encode = msgspec.msgpack.Encoder().encode
    decode = msgspec.msgpack.Decoder(Request | Heartbeat).decode
    decode_value = msgspec.msgpack.Decoder().decode
    methods = _methods()
    nil = msgspec.Raw(encode(None))
    recv, send, clock = sock.recv, sock.send, time.monotonic
    beats = 0
    next_beat = 0.0
    on_ready()
    try:
        while True:
            now = clock()
            if now >= next_beat:
                if stop():
                    break
                beats += 1
                send(encode(Heartbeat(rank, INCARNATION, beats)))
                next_beat = now + _HEARTBEAT_S
            on_wait()
            try:
                data = recv()
            except zmq.Again:  # the receive timeout: look at the stop flag and the clock
                if stop():
                    break
                continue
            envelope = decode(data)
            if type(envelope) is not Request:
                continue  # a client's heartbeat
            fn = methods.get(envelope.method)
            if fn is None:
                reply = Reply(envelope.id, rank, INCARNATION, False, nil,
                              ErrorInfo("UnknownMethod", envelope.method, 404))
            else:
                result = fn(decode_value(envelope.payload))
                reply = Reply(envelope.id, rank, INCARNATION, True, msgspec.Raw(encode(result)))
            send(encode(reply))
    finally:
        sock.close()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ctlwire.benchmarks.protocol_engine")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--connect", required=True)
    args = p.parse_args(argv)
    stopped: list[int] = []
    parent = os.getppid()

    def on_signal(signum: int, frame: Any) -> None:
        stopped.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        serve(ctx, args.connect, args.rank,
              lambda: bool(stopped) or os.getppid() != parent,
              on_ready=lambda: print(f"READY {args.rank} {INCARNATION}", flush=True))
    finally:
        ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
