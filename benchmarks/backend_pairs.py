"""trio against asyncio in paired rounds: ``python -m ctlwire.benchmarks.backend_pairs``.

``ctlwire bench``'s trio rows pool 6 rounds per backend into one ratio, which
moved by ±0.1-0.2 between runs on the 2-core VM. This tool runs the same rounds
(:func:`~ctlwire.benchmarks.scenarios.backend_round`: fresh clients, real engine
processes) as *pairs*, one round per backend back to back, the order alternating
from pair to pair, takes each pair's ratio and reports their median: a slow spell
of the machine moves both rounds of a pair. A pair during which the host took
more than ``--max-steal`` percent of the CPU (:mod:`ctlwire.benchmarks.cpu_steal`)
is run again, up to as many times as there are pairs, and reported as dropped.

Reported per scenario: each backend's median, the median paired ratio, its range,
in the bench's orientation (higher is trio's advantage): sequential p50 asyncio /
trio; 64 concurrent and fan-out rates trio / asyncio; client thread CPU per call
and per fan-out asyncio / trio.

Even so, medians of 30 pairs moved by ±5-10 % between repeats on that machine:
this narrows the spread of one run, it does not remove the machine's.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from .cpu_steal import read_cpu_times, steal_percent
from .fleets import FleetPool
from .scenarios import BackendRound, Params, backend_round

__all__ = ["PairedResult", "main", "run_pairs"]

#: (name, how a round gives it, True when the ratio is asyncio / trio)
METRICS: tuple[tuple[str, Callable[[BackendRound], float], bool], ...] = (
    ("sequential call p50 (µs)", lambda r: statistics.median(r.seq_us), True),
    ("64 concurrent callers (calls/s)", lambda r: r.rate, False),
    ("queueing fan-out, 8 engines (fan-outs/s)", lambda r: r.fan_rate, False),
    ("client CPU per concurrent call (µs)", lambda r: r.cpu_per_call_us, True),
    ("client CPU per fan-out (µs)", lambda r: r.cpu_per_fan_out_us, True),
)


@dataclass
class PairedResult:
    """The kept pairs' rounds, and how many pairs were dropped for steal."""

    asyncio: list[BackendRound] = field(default_factory=list)
    trio: list[BackendRound] = field(default_factory=list)
    dropped: int = 0

    def ratios(self, index: int) -> list[float]:
        """Each kept pair's ratio of metric ``index`` of :data:`METRICS`."""
        _name, value, inverse = METRICS[index]
        out = []
        for a, t in zip(self.asyncio, self.trio, strict=True):
            va, vt = value(a), value(t)
            out.append(va / vt if inverse else vt / va)
        return out

    def table(self) -> str:
        lines = [f"trio vs asyncio, {len(self.trio)} pairs kept, {self.dropped} dropped "
                 "for steal; ratio: higher is trio's advantage"]
        for i, (name, value, _inverse) in enumerate(METRICS):
            ratios = self.ratios(i)
            a = statistics.median(value(r) for r in self.asyncio)
            t = statistics.median(value(r) for r in self.trio)
            lines.append(f"  {name:42s} asyncio {a:10.1f}  trio {t:10.1f}  paired ratio "
                         f"{statistics.median(ratios):.3f} (range {min(ratios):.2f}-"
                         f"{max(ratios):.2f})")
        return "\n".join(lines)


def run_pairs(pairs: int, max_steal: float = 3.0, quick: bool = False) -> PairedResult:
    """``pairs`` kept pairs of rounds (asyncio then trio, then the other order, ...)
    against 1 and 8 engine processes; see the module docstring."""
    if pairs < 1:
        raise ValueError("pairs must be at least 1")
    p = Params(quick)
    result = PairedResult()
    with FleetPool() as pool:
        pool.ctlwire("one", 1)
        pool.ctlwire("eight", 8)
        pool.start("one", "eight")
        one, eight = pool.address("one"), pool.address("eight")
        i = 0
        while len(result.trio) < pairs:
            order = ("asyncio", "trio") if i % 2 == 0 else ("trio", "asyncio")
            i += 1
            before = read_cpu_times()
            rounds = {b: backend_round(one, eight, 8, p, b) for b in order}
            steal = steal_percent(before, read_cpu_times())
            if steal is not None and steal > max_steal and result.dropped < pairs:
                result.dropped += 1
                continue
            result.asyncio.append(rounds["asyncio"])
            result.trio.append(rounds["trio"])
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--max-steal", type=float, default=3.0,
                        help="run a pair again when the host took more CPU than this (%%)")
    parser.add_argument("--quick", action="store_true", help="the bench's --quick sizes")
    args = parser.parse_args(argv)
    print(run_pairs(args.pairs, args.max_steal, args.quick).table())


if __name__ == "__main__":
    main()
