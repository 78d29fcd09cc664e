"""Engine CPU per request: ``python -m ctlwire.benchmarks.engine_cpu``.

Measures the CPU time one engine *thread* spends per request
(``time.thread_time``, the same clock as the first field of its
``/proc/<pid>/task/<tid>/schedstat``; the libzmq IO thread, the beacon and the
load generator are not counted), which is far less sensitive to a loaded machine
than wall-clock latency. A load *process* with a plain ROUTER (ipc, like the
bench's engine fleets) keeps ``--window`` requests in flight to one rank and
reads the replies; the engine thread serves them with:

* ``bare`` — the smallest loop that speaks the protocol
  (:func:`ctlwire.benchmarks.protocol_engine.serve`: a blocking receive, decode the
  ``Request``, call the handler, encode the ``Reply``): the floor;
* ``drain`` — the same work in a loop that polls, then receives until a receive
  raises ``zmq.Again``: a poll and an exception more per wake-up;
* ``poll`` — :meth:`EngineEndpoint.poll` (the sync embedding);
* ``serve-asyncio`` / ``serve-trio`` — :meth:`EngineEndpoint.serve`.

What a request costs depends on how it comes: with ``--window 16`` (the default)
requests queue and one wake-up serves several; with ``--window 1`` each request
finds the thread asleep, and the slower the driver, the longer it slept and the
more the wake-up costs. A user's engine is driven by ``ControlClient``: the bench's
``cpu`` group measures that (``docs/benchmarks.md``, "Engine CPU per request: which
measure"); this module isolates the engine's thread.

Every variant runs in the same process, one after the other, so the ratios
``ctlwire / bare`` are comparable within one run. ``--profile`` prints a
cProfile of the ctlwire variant's engine thread instead. The load runs in a
process of its own: as a thread of the engine's process it took the GIL from
the engine at every libzmq call (pyzmq releases it there), and the engine
thread's CPU then mostly measured GIL hand-overs, which vary with batching.
Sync variants also report how many requests they found per wait for input.
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import pstats
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import anyio
import msgspec
import zmq

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.transports.envelope import Reply, Request
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

from . import protocol_engine

__all__ = ["main", "measure"]

_ADDRESS = "ipc:///tmp/ctlwire-engine-cpu.sock"  # set per measure(), in a private directory
_WAITS = [0]  # times the engine thread of a sync variant waited for input
_RTT = [0.0]  # with --window 1: the load's median round trip (µs)


def _load(address: str, n: int, window: int, ready: Any, done: Any, payload: Any,
          rtt: Any) -> None:
    """The client process: keep ``window`` requests in flight to rank 0, ``n`` in all.

    With ``window == 1`` it also puts the median round trip (µs) on ``rtt``."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.bind(address)
    ready.set()
    enc = msgspec.msgpack.Encoder()
    raw = msgspec.Raw(enc.encode(payload))
    ident = b"rank-0"
    # wait for the engine's first frame (its hello/heartbeat or a reply): it is connected
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    hello = enc.encode(Request(n + 1, 0, "ctlwire.noop", raw))  # an id the load never uses
    while True:
        try:
            sock.send_multipart([ident, hello])
            break
        except zmq.ZMQError:
            time.sleep(0.001)
    frames = [enc.encode(Request(i, 0, "echo", raw, 0.0, i, 7)) for i in range(1, n + 1)]
    got = 0
    # drain whatever the warm-up produced (error reply, heartbeats)
    while poller.poll(100):
        sock.recv_multipart()
    sent = 0
    rtts: list[int] = []
    clock = time.perf_counter_ns
    t0 = clock()
    while sent < min(window, n):
        sock.send_multipart([ident, frames[sent]])
        sent += 1
    while got < n:
        if not poller.poll(5000):
            break
        _route, data = sock.recv_multipart()
        if data[1:3] != b"\xa1r":  # not a reply (tag "r"): a heartbeat
            continue
        got += 1
        t1 = clock()
        rtts.append(t1 - t0)
        t0 = t1
        if sent < n:
            sock.send_multipart([ident, frames[sent]])
            sent += 1
    rtts.sort()
    rtt.put(rtts[len(rtts) // 2] / 1e3 if rtts and window == 1 else 0.0)
    done.set()
    sock.close(linger=0)
    ctx.term()


def _count_wait() -> None:
    _WAITS[0] += 1


def _bare(ctx: zmq.Context[zmq.Socket[bytes]], stop: threading.Event,
          started: threading.Event) -> None:
    protocol_engine.serve(ctx, _ADDRESS, 0, stop.is_set, on_wait=_count_wait)


def _drain(ctx: zmq.Context[zmq.Socket[bytes]], stop: threading.Event,
           started: threading.Event) -> None:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.IDENTITY, b"rank-0")
    sock.connect(_ADDRESS)
    enc = msgspec.msgpack.Encoder()
    dec = msgspec.msgpack.Decoder(Request)
    val_dec = msgspec.msgpack.Decoder()
    handlers: dict[str, Callable[..., Any]] = {"echo": lambda v=None: v}
    nil = msgspec.Raw(enc.encode(None))
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    while not stop.is_set():
        _WAITS[0] += 1
        if not poller.poll(50):
            continue
        while True:
            try:
                data = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            req = dec.decode(data)
            fn = handlers.get(req.method)
            if fn is None:
                reply = Reply(req.id, 0, 1, False, nil)
            else:
                reply = Reply(req.id, 0, 1, True,
                              msgspec.Raw(enc.encode(fn(val_dec.decode(req.payload)))))
            sock.send(enc.encode(reply))
    sock.close(linger=0)


def _poll(ctx: zmq.Context[zmq.Socket[bytes]], stop: threading.Event,
          started: threading.Event) -> None:
    ep = _endpoint(ctx)
    ep.open()
    try:
        # the loop of the bench's engine processes (app/engine_process.py) and of
        # EngineEndpoint.run_blocking: one request a round, the wait being the receive
        while not stop.is_set():
            ep.poll(1, 0.05)
            _WAITS[0] += 1
    finally:
        ep.close()


def _serve(backend: str) -> Callable[[zmq.Context[zmq.Socket[bytes]], threading.Event,
                                      threading.Event], None]:
    def run(ctx: zmq.Context[zmq.Socket[bytes]], stop: threading.Event,
            started: threading.Event) -> None:
        ep = _endpoint(ctx)

        async def main() -> None:
            async with anyio.create_task_group() as tg:
                tg.start_soon(ep.serve)
                while not stop.is_set():
                    await anyio.sleep(0.02)
                tg.cancel_scope.cancel()

        anyio.run(main, backend=backend)
    return run


def _endpoint(ctx: zmq.Context[zmq.Socket[bytes]]) -> EngineEndpoint:
    transport = ZmqDealerEngineTransport(_ADDRESS, 0, context=ctx)
    ep = EngineEndpoint(transport, rank=0, heartbeat_interval=0.25, beacon=False)

    @ep.method()
    def echo(value: Any = None) -> Any:
        return value

    return ep


VARIANTS: dict[str, Callable[[zmq.Context[zmq.Socket[bytes]], threading.Event,
                              threading.Event], None]] = {
    "bare": _bare,
    "drain": _drain,
    "poll": _poll,
    "serve-asyncio": _serve("asyncio"),
    "serve-trio": _serve("trio"),
}


def measure(variant: str, n: int = 20_000, window: int = 16, payload: Any = None,
            profile: bool = False) -> float:
    """CPU µs per request of the engine thread of ``variant``."""
    global _ADDRESS
    _WAITS[0] = 0
    directory = tempfile.mkdtemp(prefix="ctlwire-engine-cpu-")
    _ADDRESS = f"ipc://{directory}/load.sock"
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    started, stop = threading.Event(), threading.Event()
    mp = multiprocessing.get_context("spawn")
    ready, done, rtt = mp.Event(), mp.Event(), mp.Queue()
    load = mp.Process(target=_load, args=(_ADDRESS, n, window, ready, done, payload, rtt),
                      daemon=True)
    load.start()
    ready.wait(60)
    result: dict[str, float] = {}
    prof = cProfile.Profile(time.thread_time) if profile else None

    def engine() -> None:
        if prof is not None:
            prof.enable()
        start = time.thread_time()
        try:
            VARIANTS[variant](ctx, stop, started)
        finally:
            result["cpu"] = time.thread_time() - start
            if prof is not None:
                prof.disable()

    # the idle cost of the waiting before `started` is small (one poll wait) and the
    # same for every variant; measure the whole engine thread.
    th = threading.Thread(target=engine, daemon=True)
    th.start()
    give_up = time.monotonic() + 120
    while not done.wait(0.2):
        if not th.is_alive() or time.monotonic() > give_up:  # it died, or hangs
            stop.set()
            load.kill()
            ctx.destroy(linger=0)
            raise RuntimeError(f"engine_cpu: the {variant!r} engine served the load "
                               "only in part (its thread ended or stalled)")
    _RTT[0] = rtt.get(timeout=10)
    stop.set()
    th.join(10)
    load.join(10)
    if load.is_alive():  # pragma: no cover - the load process is stuck
        load.kill()
    ctx.term()
    shutil.rmtree(directory, ignore_errors=True)
    if prof is not None:
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
    return result["cpu"] / n * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20_000)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--profile", metavar="VARIANT")
    args = parser.parse_args(argv)
    if args.profile:
        measure(args.profile, args.n, args.window, profile=True)
        return
    best: dict[str, float] = {}
    waits: dict[str, int] = {}
    rtts: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for v in args.variants:
            us = measure(v, args.n, args.window)
            rtts.setdefault(v, []).append(_RTT[0])
            if us < best.get(v, float("inf")):
                best[v], waits[v] = us, _WAITS[0]
    base = best.get("bare")
    for v, us in best.items():
        ratio = f"  {us / base:.2f}x bare" if base else ""
        # requests per wait for input (sync variants): fewer, larger batches are cheaper
        batch = f"  {args.n / waits[v]:5.1f} req/wait" if waits.get(v) else ""
        rtt = ""
        if args.window == 1:  # sequential: the round trip a client sees, per run
            rtt = "  p50 round trip " + "/".join(f"{x:.0f}" for x in rtts[v]) + " µs"
        print(f"{v:15s} {us:6.2f} µs CPU/request (best of {args.repeat}){ratio}{batch}{rtt}")


if __name__ == "__main__":
    main()
