"""Client CPU per call: ``python -m ctlwire.benchmarks.client_cpu``.

The CPU time the client's *thread* (``time.thread_time``: not libzmq's IO
thread, not the engines) spends per call, which a loaded machine disturbs far
less than latency:

* ``seq`` — sequential ``ControlClient.call`` to one engine, against the raw
  pyzmq client read with the FD technique (:class:`PyzmqUtilityClient`) to a
  bare engine, on the same backend;
* ``conc`` — 64 concurrent callers, same pair;
* ``fanout`` — ``fan_out`` (queueing) to 8 engines: CPU per fan-out and per rank;
* ``burst`` — 400 queueing fan-outs to 8 engines submitted at once, one task each
  (the shape of ``ctlwire bench --only fanout``): CPU per fan-out; ``--burst N``
  submits N at once instead (beyond ~1,000 queued callers the admission bookkeeping's
  scaling shows).

``--backend asyncio trio`` runs each kind on both backends, one after the other
(the raw client runs on the same backend). ``--profile
seq|conc|fanout|burst`` prints a cProfile (thread CPU time) of the ctlwire
client instead. ``--count`` counts instead of timing (``seq`` and ``conc``, exact
and load-independent, :mod:`.call_counter`): Python calls, C calls, task steps and bytecodes
per call of each client, and the functions the ctlwire client calls most per call.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

from .baseline_pyzmq import PyzmqUtilityClient
from .call_counter import CallCounter, Counts
from .fleets import FleetPool
from .scenarios import PAYLOAD

__all__ = ["main"]

#: fan-outs submitted at once by the ``burst`` kind, one task each
BURST = 400


#: what ``--count`` stores: the counts of the last ``_cpu`` run made with ``count=True``
_COUNTED: list[Counts] = []


async def _cpu(n: int, callers: int, one: Callable[[], Awaitable[Any]],
               prof: cProfile.Profile | None = None, count: bool = False) -> float:
    """µs of this thread's CPU per operation, ``n`` operations by ``callers`` tasks
    (``count``: counted, the counts kept in ``_COUNTED``; the time is then meaningless)."""
    per = n // callers

    async def worker() -> None:
        for _ in range(per):
            await one()

    if prof is not None:
        prof.enable()
    counter = CallCounter() if count else None
    if counter is not None:
        counter.start()
    t0 = time.thread_time()
    async with anyio.create_task_group() as tg:
        for _ in range(callers):
            tg.start_soon(worker)
    cpu = time.thread_time() - t0
    if counter is not None:
        _COUNTED.append(counter.stop())
    if prof is not None:
        prof.disable()
    return cpu / (per * callers) * 1e6


async def _ctlwire(address: str, ranks: int, kind: str, n: int,
                   prof: cProfile.Profile | None, burst: int = BURST,
                   count: bool = False) -> float:
    async with ControlClient(ZmqRouterClientTransport(address), ranks=ranks,
                             default_timeout=30.0) as ctl:
        await ctl.wait_ready(timeout=30)
        if kind == "burst":
            async def fan() -> Any:
                return await ctl.fan_out("echo", PAYLOAD, mode="queueing")
            await _cpu(burst, burst, fan)
            rounds = max(1, n // burst)
            return await _cpu(rounds * burst, burst, fan, prof)
        if kind == "fanout":
            async def one() -> Any:
                return await ctl.fan_out("echo", PAYLOAD, mode="queueing")
            await _cpu(50, 1, one)
            return await _cpu(n, 1, one, prof)

        async def call() -> Any:
            return await ctl.call("echo", PAYLOAD, rank=0)
        await _cpu(200, 1, call)
        return await _cpu(n, 64 if kind == "conc" else 1, call, prof, count)


async def _raw(address: str, kind: str, n: int, count: bool = False) -> float:
    async with PyzmqUtilityClient(address) as cli:
        await cli.wait_ready([0])

        async def call() -> Any:
            return await cli.call(0, "echo", PAYLOAD)
        await _cpu(200, 1, call)
        return await _cpu(n, 64 if kind == "conc" else 1, call, None, count)


def _by_file(stats: pstats.Stats) -> None:
    """Own (tottime) CPU share by source file: where a call's microseconds go."""
    per: dict[str, float] = {}
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in table.values())
    for (filename, _line, _name), v in table.items():
        key = filename.split("site-packages/")[-1].split("/lib/python3")[-1]
        per[key] = per.get(key, 0.0) + v[2]
    for key, t in sorted(per.items(), key=lambda kv: -kv[1])[:25]:
        print(f"{100 * t / total:5.1f}%  {key}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--profile", choices=["seq", "conc", "fanout", "burst"])
    parser.add_argument("--kinds", nargs="+", default=["seq", "conc", "fanout"],
                        choices=["seq", "conc", "fanout", "burst"])
    parser.add_argument("--backend", nargs="+", choices=["asyncio", "trio"],
                        default=["asyncio"], help="one run per backend, in this order")
    parser.add_argument("--profile-out", metavar="PATH", help="also dump the profile's stats")
    parser.add_argument("--burst", type=int, default=BURST,
                        help="fan-outs submitted at once by the burst kind")
    parser.add_argument("--count", action="store_true",
                        help="count calls and task steps per call (seq, conc) instead of timing")
    parser.add_argument("--top", type=int, default=0,
                        help="with --count: the ctlwire client's N functions called most")
    args = parser.parse_args(argv)
    with FleetPool() as pool:
        pool.ctlwire("one", 1)
        pool.baseline("raw", 1)
        pool.ctlwire("eight", 8)
        pool.start("one", "raw", "eight")
        if args.profile:
            prof = cProfile.Profile(time.thread_time)
            kind = args.profile
            ranks, name = (8, "eight") if kind in ("fanout", "burst") else (1, "one")
            us = anyio.run(_ctlwire, pool.address(name), ranks, kind, args.n, prof,
                           args.burst, backend=args.backend[0])
            print(f"{kind}: {us:.1f} µs client CPU per operation (profiled)")
            if args.profile_out:
                prof.dump_stats(args.profile_out)
            stats = pstats.Stats(prof)
            _by_file(stats)
            stats.sort_stats("tottime").print_stats(40)
            return
        for kind, backend in ((k, b) for k in args.kinds for b in args.backend):
            if args.count:
                if kind in ("seq", "conc"):
                    _print_counts(pool, kind, backend, args.n, args.top)
                continue
            if kind in ("fanout", "burst"):
                us = anyio.run(_ctlwire, pool.address("eight"), 8, kind, args.n // 10, None,
                               args.burst, backend=backend)
                label = "fanout to 8" if kind == "fanout" else f"burst of {args.burst}"
                print(f"{label}: {us:7.1f} µs client CPU per fan-out, "
                      f"{us / 8:5.1f} per rank ({backend})")
                continue
            ours = anyio.run(_ctlwire, pool.address("one"), 1, kind, args.n, None,
                             backend=backend)
            raw = anyio.run(_raw, pool.address("raw"), kind, args.n, backend=backend)
            print(f"{kind:6s}: ctlwire {ours:6.1f} µs client CPU/call, raw pyzmq {raw:6.1f}"
                  f"  ({ours / raw:.2f}x, {backend})")


def _print_counts(pool: FleetPool, kind: str, backend: str, n: int, top: int) -> None:
    _COUNTED.clear()
    anyio.run(_ctlwire, pool.address("one"), 1, kind, n, None, BURST, True, backend=backend)
    anyio.run(_raw, pool.address("raw"), kind, n, True, backend=backend)
    ours, raw = _COUNTED
    for name, c in (("ctlwire", ours), ("raw pyzmq", raw)):
        print(f"{kind:6s}: {name:9s} {c.py_calls / n:6.1f} Python calls, {c.c_calls / n:6.1f} "
              f"C calls, {c.task_steps / n:5.2f} task steps, {c.bytecodes / n:7.1f} bytecodes "
              f"per call ({backend})")
    for fn, k in ours.by_function.most_common(top):
        print(f"        {k / n:6.2f}  {fn}")


if __name__ == "__main__":
    main()
