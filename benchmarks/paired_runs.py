"""ctlwire against its peer, run by run: alternating runs, CPU per operation, medians.

A rate or a latency with many processes on two cores moves by half from one run
to the next; what each side pays in CPU moves far less. So every comparison with
a peer is made of runs that alternate, ctlwire then the peer (A B A B ...), each
a fresh client in a fresh event loop with only its own side's client in the
process, and each run reports, beside its rate or latency, the CPU per operation
of every thread of every process involved (:mod:`ctlwire.benchmarks.schedstat`):
the client's (this process) and the engines'. A row then shows the median of
the runs' values, the median of the runs' ratios (run *i* of ctlwire against
run *i* of the peer, measured next to each other) and those ratios' spread.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from . import schedstat
from .report import Row, Target

__all__ = ["INFO", "LOWER", "Cpu", "CpuMeter", "alternate_runs", "compared_row", "cpu_rows"]

T = TypeVar("T")


@dataclass(frozen=True)
class Cpu:
    """CPU per operation (µs): the client process's and the engine processes', every
    thread; ``engine_main_us`` is the engines' main threads alone (their loops)."""

    client_us: float
    engine_us: float
    engine_main_us: float
    threads_ended: int = 0

    @property
    def total_us(self) -> float:
        return self.client_us + self.engine_us


class CpuMeter:
    """Reads this process's and ``engine_pids``' CPU at :meth:`start`, and per operation
    since then at :meth:`per_op`."""

    def __init__(self, engine_pids: Sequence[int]) -> None:
        self.engine_pids = tuple(engine_pids)
        self._client = self._engines = schedstat.CpuReading({})

    def start(self) -> None:
        self._engines = schedstat.read(self.engine_pids)
        self._client = schedstat.read([os.getpid()])

    def per_op(self, ops: int) -> Cpu:
        """CPU per operation since :meth:`start`, ``ops`` operations done meanwhile."""
        client = schedstat.cpu_ns(self._client, schedstat.read([os.getpid()]))
        engines = schedstat.cpu_ns(self._engines, schedstat.read(self.engine_pids))
        per = 1e-3 / max(1, ops)
        return Cpu(client.total_ns * per, engines.total_ns * per, engines.main_ns * per,
                   client.threads_ended + engines.threads_ended)


def alternate_runs(sides: Mapping[str, Callable[[], T]], runs: int) -> dict[str, list[T]]:
    """Each side's run ``runs`` times, alternating in the order of ``sides`` (A B A B ...)."""
    out: dict[str, list[T]] = {name: [] for name in sides}
    for _ in range(runs):
        for name, run in sides.items():
            out[name].append(run())
    return out


def compared_row(group: str, scenario: str, unit: str, ctl: Sequence[float],
                 base: Sequence[float], baseline_name: str, ratio_of: str, target: Target,
                 details: Mapping[str, Any] | None = None) -> Row:
    """A row from both sides' values run by run (run *i* against run *i*): the medians
    of the values and of the ratios, and the ratios' lowest and highest."""
    ratios = [c / b if b else float("inf") for c, b in zip(ctl, base, strict=True)]
    return Row(group, scenario, unit, statistics.median(ctl), statistics.median(base),
               baseline_name, statistics.median(ratios), ratio_of, target,
               {"runs": len(ratios), "ctlwire_runs": [round(x, 2) for x in ctl],
                "baseline_runs": [round(x, 2) for x in base],
                "ratios": [round(x, 3) for x in ratios], **(details or {})},
               spread=(min(ratios), max(ratios)))


LOWER = "ctlwire / baseline (lower is better)"
INFO = Target("info")


def cpu_rows(group: str, scenario: str, ctl: Sequence[Cpu], base: Sequence[Cpu],
             baseline_name: str, *, per: str = "call", engines: int = 1,
             client_target: Target = INFO, total_target: Target | None = None
             ) -> list[Row]:
    """The rows that go beside ``scenario``'s rate or latency row: the client's CPU per
    ``per`` and the engines' (every thread of each process), each side's runs against
    the other's; with ``total_target``, the client and the engines together as well.
    The engine row's details hold the engines' main threads alone and, for several
    engines, the CPU per request of one."""
    who = "1 engine" if engines == 1 else f"{engines} engines"

    def row(what: str, value: Callable[[Cpu], float], target: Target,
            details: dict[str, Any] | None = None) -> Row:
        return compared_row(group, f"{scenario}: {what}", "µs", [value(c) for c in ctl],
                            [value(c) for c in base], baseline_name, LOWER, target, details)

    engine_details: dict[str, Any] = {
        f"{side}_main_threads_runs_us": [round(c.engine_main_us, 2) for c in cpus]
        for side, cpus in (("ctlwire", ctl), ("baseline", base))}
    if engines > 1:
        engine_details |= {f"{side}_per_request_runs_us": [round(c.engine_us / engines, 2)
                                                          for c in cpus]
                           for side, cpus in (("ctlwire", ctl), ("baseline", base))}
    rows = [row(f"client CPU per {per} (all threads)", lambda c: c.client_us, client_target),
            row(f"engine CPU per {per} ({who}, all threads)", lambda c: c.engine_us, INFO,
                engine_details)]
    if total_target is not None:
        rows.append(row(f"total CPU per {per} (client + {who})", lambda c: c.total_us,
                        total_target))
    ended = sum(c.threads_ended for c in (*ctl, *base))
    if ended:  # a thread that ended between two readings took its CPU time with it
        for r in rows:
            r.details["threads_ended_unmeasured"] = ended
    return rows
