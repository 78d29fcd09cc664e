"""The baselines' engine process: a plain pyzmq DEALER serving utility calls.

``python -m ctlwire.benchmarks.baseline_engine --rank N --connect ADDR``

What an engine written without ctlwire does for a utility call, in the style
of vLLM's ``EngineCore``: receive a msgspec-msgpack frame ``[call_id, method,
args]``, decode it, look the method up in a dict, call it, encode ``[call_id,
ok, result]`` and send it back. No deadlines, no duplicate detection, no
state machine, no heartbeats. The socket loop is the plainest there is: a
blocking ``recv`` (with a receive timeout, to look at the stop flag), then the
reply's ``send``. With ``--step SECONDS`` it loops like a scheduler instead:
it sleeps the step, then answers every request that has arrived.

Prints ``READY <rank> 0`` once connected (the line :class:`EngineFleet`
waits for) and exits cleanly on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import zmq

from .call_counter import serve_counting_signals

__all__ = ["HELLO_ID", "main", "serve"]

HELLO_ID = 0
"""The call id of the frame an engine sends when it starts (the client learns its route)."""


def _methods() -> dict[str, Callable[..., Any]]:
    def echo(value: Any = None) -> Any:
        return value

    def sleep(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    return {"echo": echo, "sleep": sleep}


def serve(address: str, rank: int, stop: Callable[[], bool], step: float | None = None
          ) -> None:
    """Answer requests until ``stop()``: a blocking receive, then the reply; with ``step``,
    a scheduler's loop instead: sleep ``step`` seconds (a device step: the CPU waits),
    then answer every request that has arrived (non-blocking receives until none is
    left), and again. With ``step``, the method ``steps`` returns the steps taken."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"rank-%d" % rank)
    sock.setsockopt(zmq.LINGER, 200)
    sock.setsockopt(zmq.SNDHWM, 10_000)
    sock.setsockopt(zmq.RCVHWM, 10_000)
    sock.setsockopt(zmq.RCVTIMEO, 100)
    sock.connect(address)
    encode = msgspec.msgpack.Encoder().encode
    decode = msgspec.msgpack.Decoder().decode
    methods = _methods()
    steps = 0
    if step is not None:
        methods["steps"] = lambda: steps
    flags = 0 if step is None else zmq.NOBLOCK
    sock.send(encode((HELLO_ID, True, rank)))
    print(f"READY {rank} 0", flush=True)
    recv, send = sock.recv, sock.send
    try:
        while not stop():
            try:
                data = recv(flags)
            except zmq.Again:  # RCVTIMEO: look at the stop flag; stepping: none left
                if step is not None:
                    time.sleep(step)
                    steps += 1
                continue
            call_id, method, args = decode(data)
            try:
                result = methods[method](*args)
            except Exception as exc:  # a failed call answers with the error's text
                reply = encode((call_id, False, f"{type(exc).__name__}: {exc}"))
            else:
                reply = encode((call_id, True, result))
            send(reply)
    finally:
        sock.close()
        ctx.term()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ctlwire.benchmarks.baseline_engine")
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--connect", required=True)
    p.add_argument("--step", type=float, metavar="SECONDS",
                   help="step like a scheduler: sleep SECONDS, then answer every request "
                        "that has arrived")
    p.add_argument("--count-calls", metavar="PATH",
                   help="count this process's calls between SIGUSR1 and SIGUSR2, into PATH")
    args = p.parse_args(argv)
    if args.count_calls:
        serve_counting_signals(args.count_calls)
    stopped: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        stopped.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    serve(args.connect, args.rank, lambda: bool(stopped), args.step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
