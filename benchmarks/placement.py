"""Sequential round trips under fixed CPU placements: ``python -m ctlwire.benchmarks.placement``.

The bench's sequential ratio (ctlwire / raw pyzmq, one engine process each) moves
±0.1 from run to run on a 2-core machine although the code does not change: where
the scheduler puts the client's and the engines' threads decides a round trip more
than either stack's CPU does. This tool measures both stacks (one ctlwire engine
process, one baseline engine process, one client process holding both clients, as
in ``ctlwire bench``) under layouts it imposes itself, with every thread of a
process pinned (``sched_setaffinity`` of each task):

``all/all``  no pinning (the bench's setting)
``0/0``      client and engines on CPU 0 (every wake-up on one CPU: pure CPU cost)
``0/1``      client on CPU 0, engines on CPU 1
``1/0``      the other way round

Per layout: ABBA blocks of sequential calls, the median of the block p50s per side
and their ratio. Linux only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from collections.abc import Sequence

import anyio

from ctlwire.benchmarks.fleets import FleetPool
from ctlwire.benchmarks.scenarios import sequential, single_engine_calls

__all__ = ["LayoutResult", "main", "measure", "pin_process"]

LAYOUTS = ("all/all", "0/0", "0/1", "1/0")


def _cpus(spec: str) -> set[int]:
    return set(range(os.cpu_count() or 1)) if spec == "all" else {int(c) for c in spec.split(",")}


def pin_process(pid: int, cpus: set[int]) -> None:
    """Pin every thread of process ``pid`` (its tasks in /proc) to ``cpus``."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(int(tid), cpus)


class LayoutResult:
    """One layout's block p50s (µs) per side."""

    def __init__(self, layout: str) -> None:
        self.layout = layout
        self.ctl: list[float] = []
        self.base: list[float] = []

    @property
    def ratio(self) -> float:
        return statistics.median(self.ctl) / statistics.median(self.base)

    def line(self) -> str:
        blocks = " ".join(f"{c / b:.2f}" for c, b in zip(self.ctl, self.base, strict=True))
        return (f"{self.layout:8s} ctlwire p50 {statistics.median(self.ctl):6.0f} µs  raw pyzmq "
                f"{statistics.median(self.base):6.0f} µs  ratio {self.ratio:.3f}  "
                f"(blocks {blocks})")


def measure(layouts: Sequence[str], *, blocks: int = 6, calls: int = 500,
            warmup: int = 200) -> list[LayoutResult]:
    """Both stacks under each layout ``client/engines`` in turn (see the module doc)."""
    results: list[LayoutResult] = []
    me = os.getpid()
    original = os.sched_getaffinity(0)
    with FleetPool() as pool:
        fleets = [pool.ctlwire("ctl1", 1), pool.baseline("base1", 1)]
        pool.start("ctl1", "base1")
        engines = [pid for fleet in fleets for pid in fleet.pids().values()]

        async def run() -> None:
            async with single_engine_calls(pool.address("ctl1"), pool.address("base1")
                                           ) as (_, ctl_call, base_call):
                for layout in layouts:
                    client_spec, _, engine_spec = layout.partition("/")
                    pin_process(me, _cpus(client_spec))
                    for pid in engines:
                        pin_process(pid, _cpus(engine_spec))
                    await sequential(ctl_call, warmup)
                    await sequential(base_call, warmup)
                    res = LayoutResult(layout)
                    for i in range(blocks):
                        sides = [(res.ctl, ctl_call), (res.base, base_call)]
                        for out, call in (sides if i % 2 == 0 else sides[::-1]):
                            out.append(statistics.median(await sequential(call, calls)))
                    results.append(res)

        try:
            anyio.run(run, backend="asyncio")
        finally:
            pin_process(me, original)  # this process as it was
    return results


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ctlwire.benchmarks.placement",
                                description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("layouts", nargs="*", default=list(LAYOUTS),
                   help="client/engines CPU lists, e.g. 0/1 or all/all (default: %(default)s)")
    p.add_argument("--blocks", type=int, default=6)
    p.add_argument("--calls", type=int, default=500)
    args = p.parse_args(argv)
    ncpu = os.cpu_count() or 1
    for layout in args.layouts:
        for spec in layout.split("/"):
            if spec != "all" and any(c >= ncpu for c in _cpus(spec)):
                p.error(f"layout {layout!r}: this machine has {ncpu} CPU(s)")
    for res in measure(args.layouts, blocks=args.blocks, calls=args.calls):
        print(res.line(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
