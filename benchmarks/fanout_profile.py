"""Where a fan-out's cost goes: ``ctlwire bench --only fanout_profile``.

Counts (:mod:`ctlwire.benchmarks.call_counter`), not times: Python calls, C
calls and task steps per rank per fan-out, for ctlwire and for the fan-out
baseline (the anyio Lock + Event communicator over bare pyzmq engines), with
100, 1,000 and 4,000 fan-outs queued at once on one mailbox (``--quick``: 100), on
asyncio and on trio:

* client side -- the client's event-loop thread, counted in this process;
* engine side -- each engine process's serving thread, counted in that process
  between ``SIGUSR1`` and ``SIGUSR2`` (ctlwire ranks are hosted one per process
  by :mod:`ctlwire.benchmarks.multi_rank_engine` in poll mode, as
  ``engine_process --mode poll`` serves them; the baseline by
  :mod:`ctlwire.benchmarks.baseline_engine`). The ctlwire engines' beacon
  threads are not counted (they work per interval, not per request).

Counts are exact and load-independent, so they tell where ctlwire does more
work than the baseline even when a timed ratio on a loaded machine cannot.
Each row's details name the functions called most per rank per fan-out.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from typing import Any

import anyio

from ctlwire.app.engine_fleet import EngineFleet

from .call_counter import CallCounter, Counts
from .fleets import FleetPool, ModuleFleet
from .report import Row, Target
from .scenarios import Params, burst_rate, fan_out_calls

__all__ = ["GROUPS", "SideCounts", "measure", "rows", "run_group"]

GROUPS = ("fanout_profile",)
ENGINES = 8
BACKENDS = ("asyncio", "trio")
_TOP = 12


@dataclass
class SideCounts:
    """One side's counts over ``fan_outs`` fan-outs to ``ranks`` ranks."""

    client: Counts
    engine: Counts
    fan_outs: int
    ranks: int

    def per_rank(self, value: int) -> float:
        return value / (self.fan_outs * self.ranks)

    def top(self, counts: Counts) -> dict[str, float]:
        return {name: round(self.per_rank(n), 2)
                for name, n in counts.by_function.most_common(_TOP)}


def _signal_all(fleet: EngineFleet, signum: int) -> None:
    for engine in fleet.engines.values():
        os.kill(engine.pid, signum)


def _read_counts(paths: list[str], timeout: float = 10.0) -> Counts:
    total = Counts()
    deadline = time.monotonic() + timeout
    for path in paths:
        while True:
            try:
                with open(path) as f:
                    total = total + Counts.from_json(json.load(f))
                os.unlink(path)
                break
            except (FileNotFoundError, json.JSONDecodeError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"fanout_profile: no counts in {path}") from None
                time.sleep(0.02)
    return total


def measure(ctl_address: str, base_address: str, ctl_fleet: EngineFleet,
            base_fleet: EngineFleet, count_paths: dict[str, list[str]], backend: str,
            *, callers: int, bursts: int) -> dict[str, SideCounts]:
    """Count ``bursts`` bursts of ``callers`` queued fan-outs on each side."""
    out: dict[str, SideCounts] = {}

    async def run() -> None:
        async with fan_out_calls(ctl_address, base_address, ENGINES) as (ctl, ctl_call,
                                                                         base_call):
            for name, call, fleet in (("ctlwire", ctl_call, ctl_fleet),
                                      ("baseline", base_call, base_fleet)):
                await burst_rate(call, callers)  # warm-up
                _signal_all(fleet, signal.SIGUSR1)
                await anyio.sleep(0.2)  # every engine counting before the first request
                with CallCounter() as counter:
                    for _ in range(bursts):
                        await burst_rate(call, callers)
                _signal_all(fleet, signal.SIGUSR2)
                engine = await anyio.to_thread.run_sync(_read_counts, count_paths[name])
                out[name] = SideCounts(counter.counts, engine, bursts * callers, ENGINES)
            assert ctl.registry.live_count == 0

    anyio.run(run, backend=backend)
    return out


def rows(backend: str, sides: dict[str, SideCounts], callers: int) -> list[Row]:
    ctl, base = sides["ctlwire"], sides["baseline"]
    base_name = f"anyio Lock + Event communicator over bare pyzmq engines, on {backend}"
    out: list[Row] = []
    for where, what, attr in (("client", "Python calls", "py_calls"),
                              ("client", "C calls", "c_calls"),
                              ("client", "task steps", "task_steps"),
                              ("client", "bytecodes", "bytecodes"),
                              ("engine", "Python calls", "py_calls"),
                              ("engine", "C calls", "c_calls"),
                              ("engine", "bytecodes", "bytecodes")):
        c = ctl.per_rank(getattr(getattr(ctl, where), attr))
        b = base.per_rank(getattr(getattr(base, where), attr))
        details: dict[str, Any] = {"fan_outs": ctl.fan_outs, "ranks": ctl.ranks}
        if attr == "py_calls":
            details["ctlwire_top_per_rank"] = ctl.top(getattr(ctl, where))
            details["baseline_top_per_rank"] = base.top(getattr(base, where))
        out.append(Row("fanout_profile",
                       f"{where} {what} per rank per fan-out, {callers} callers, {backend}",
                       "count", c, b, base_name, c / b if b else float("inf"),
                       "ctlwire / baseline (lower is less work)", Target("info"), details))
    return out


def breakdown(backend: str, sides: dict[str, SideCounts], callers: int) -> list[str]:
    """The table's notes: where each side's calls go, per rank per fan-out."""
    lines: list[str] = []
    for name, side in sides.items():
        for where in ("client", "engine"):
            counts: Counts = getattr(side, where)
            top = ", ".join(f"{fn} {n:.2f}" for fn, n in side.top(counts).items())
            lines.append(f"fanout_profile {backend} {callers} callers {name} {where} "
                         f"({side.per_rank(counts.py_calls):.1f} Python calls/rank): {top}")
    return lines


def run_group(pool: FleetPool, p: Params) -> tuple[list[Row], list[str]]:
    """Start the counted fleets, count on each backend, return rows and notes."""
    paths = {side: [os.path.join(pool.directory, f"{side}-{r}.counts") for r in range(ENGINES)]
             for side in ("ctlwire", "baseline")}
    ctl = pool.custom("profile_ctl", lambda address: ModuleFleet(
        "ctlwire.benchmarks.multi_rank_engine", ENGINES, lambda r: [
            "--first", str(r), "--count", "1", "--connect", address,
            "--count-calls", paths["ctlwire"][r]]))
    base = pool.custom("profile_base", lambda address: ModuleFleet(
        "ctlwire.benchmarks.baseline_engine", ENGINES, lambda r: [
            "--connect", address, "--count-calls", paths["baseline"][r]]))
    pool.start("profile_ctl", "profile_base")
    out: list[Row] = []
    notes: list[str] = []
    for backend in BACKENDS:
        for callers in (100,) if p.quick else (100, 1_000, 4_000):
            sides = measure(pool.address("profile_ctl"), pool.address("profile_base"), ctl,
                            base, paths, backend, callers=callers,
                            bursts=max(1, 400 // callers))
            out += rows(backend, sides, callers)
            notes += breakdown(backend, sides, callers)
    pool.stop("profile_ctl")
    pool.stop("profile_base")
    return out, notes
