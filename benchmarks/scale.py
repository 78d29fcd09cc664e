"""Load and scale groups of ``ctlwire bench``.

``scale``         fan-out to 8, 64, 256 and 1,024 ranks over 4 engine processes (16 at
                  1,024; plus one hosting the last rank alone), K endpoints each
                  (:mod:`ctlwire.benchmarks.multi_rank_engine`); cost per rank (fan-out
                  p50 / ranks) against itself at 8 ranks, and the client's RSS per rank
``multi_client``  4 client processes (``ZmqDealerClientTransport``) sharing 8 engines that
                  bind ROUTERs, aggregate calls/s against one client process; every call
                  answered
``detect256``     kill -9 of the process hosting one rank (alone in its process) among
                  256 ranks: seconds until the client reports it Lost

Every comparison is a ratio against something measured in the same run; the
targets are reported, not enforced.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from ctlwire.app.engine_fleet import EngineFleet

from .fleets import BENCH_METHODS, FleetPool, ModuleFleet
from .report import Row, Target
from .scenarios import Params, _ctl_client
from .stats import median, percentile
from .traffic import wait_live, wait_lost

__all__ = [
    "GROUPS",
    "run_groups",
]

GROUPS = ("scale", "multi_client", "detect256")
HOST_PROCESSES = 4
#: ranks per engine process at most: 1,024 ranks run in 16 processes of 64 (shared beacons)
RANKS_PER_PROCESS = 64
SCALE_RANKS = (8, 64, 256, 1024)
SCALE_RANKS_QUICK = (8, 64, 256)
MC_ENGINES = 8
MC_CLIENTS = 4
DETECT_RANKS = 256
_MB = 1024 * 1024


def layout(ranks: int, *, processes: int = HOST_PROCESSES, isolate_last: bool = True
           ) -> list[tuple[int, int]]:
    """``(first rank, count)`` of each engine process hosting ``ranks`` ranks: the
    ranks spread evenly over ``processes`` processes (64 each at 256 ranks; more
    processes, of at most 64 ranks each, beyond: 16 at 1,024) and, with
    ``isolate_last``, the last rank alone in one more process (the victim of
    ``detect256``). ``scale`` uses the same shape at every size, so that the cost per
    rank compares like with like: only the number of endpoints per process grows."""
    hosted = ranks - 1 if isolate_last else ranks
    processes = max(processes, -(-hosted // RANKS_PER_PROCESS))
    n = max(1, min(processes, hosted))
    out: list[tuple[int, int]] = []
    first = 0
    for i in range(n):
        count = hosted // n + (1 if i < hosted % n else 0)
        out.append((first, count))
        first += count
    if isolate_last:
        out.append((ranks - 1, 1))
    return [(f, c) for f, c in out if c > 0]


def multi_rank_fleet(address: str, ranks: int, *, isolate_last: bool = True) -> EngineFleet:
    """Processes of :mod:`ctlwire.benchmarks.multi_rank_engine` hosting ``ranks`` ranks
    that dial ``address``; the fleet's "ranks" are process indices."""
    procs = layout(ranks, isolate_last=isolate_last)

    def args_for(index: int) -> list[str]:
        first, count = procs[index]
        return ["--first", str(first), "--count", str(count), "--connect", address]

    return ModuleFleet("ctlwire.benchmarks.multi_rank_engine", len(procs), args_for,
                       ready_timeout=60.0)


def _bench_client(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "ctlwire.benchmarks.bench_client", *args]


def _parse_result(out: str, what: str) -> dict[str, Any]:
    for line in reversed(out.splitlines()):
        if line.startswith("RESULT "):
            data: dict[str, Any] = json.loads(line[len("RESULT "):])
            return data
    raise RuntimeError(f"{what}: no RESULT line in {out[-500:]!r}")


# -- scale: 8, 64, 256 ranks ----------------------------------------------------------------
@dataclass
class ScalePoint:
    ranks: int
    processes: int
    fanout_s: list[float]
    rss_before: int
    rss_after: int  # connected to every rank
    rss_warm: int  # after the warm-up fan-outs
    ready_s: float
    cpu_s: float

    @property
    def cpu_per_rank_us(self) -> float:
        """The client process's CPU time per fan-out per rank."""
        return self.cpu_s / max(1, len(self.fanout_s)) / self.ranks * 1e6

    @property
    def p50_s(self) -> float:
        return median(self.fanout_s)

    @property
    def cost_per_rank_us(self) -> float:
        return self.p50_s / self.ranks * 1e6

    @property
    def rss_per_rank(self) -> float:
        return (self.rss_after - self.rss_before) / self.ranks


def scale_point(address: str, ranks: int, processes: int, p: Params) -> ScalePoint:
    """Time fan-outs to ``ranks`` ranks from a fresh client process (its RSS too)."""
    fanouts = 30 if p.quick else 200
    proc = subprocess.run(_bench_client(["scale", "--connect", address, "--ranks", str(ranks),
                                         "--fanouts", str(fanouts)]),
                          capture_output=True, text=True, timeout=180)
    if proc.returncode != 0:
        raise RuntimeError(f"scale client ({ranks} ranks) failed: {proc.stderr[-2000:]}")
    data = _parse_result(proc.stdout, f"scale client ({ranks} ranks)")
    if data["live_after"] != 0:
        raise AssertionError(f"scale client: {data['live_after']} requests left live")
    return ScalePoint(ranks, processes, data["fanout_s"], data["rss_before"],
                      data["rss_connected"], data["rss_warm"], data["ready_s"], data["cpu_s"])


def scale_rows(points: Sequence[ScalePoint]) -> list[Row]:
    base = points[0]
    rows: list[Row] = []
    for pt in points:
        hosts = f"{pt.processes} engine process" + ("es" if pt.processes > 1 else "")
        rows.append(Row(
            "scale", f"fan-out cost per rank, {pt.ranks} ranks ({hosts})",
            "µs/rank", pt.cost_per_rank_us, base.cost_per_rank_us,
            f"ctlwire at {base.ranks} ranks", pt.cost_per_rank_us / base.cost_per_rank_us,
            f"cost per rank at {pt.ranks} / at {base.ranks}", Target("info"),
            {"fanout_p50_ms": pt.p50_s * 1e3,
             "fanout_p90_ms": percentile(pt.fanout_s, 90) * 1e3,
             "fanouts": len(pt.fanout_s), "wait_ready_s": round(pt.ready_s, 3),
             "client_cpu_us_per_rank": pt.cpu_per_rank_us}))
    last = points[-1]
    rows.append(Row(
        "scale", f"cost per rank at {last.ranks} vs {base.ranks} ranks", "µs/rank",
        last.cost_per_rank_us, base.cost_per_rank_us, f"ctlwire at {base.ranks} ranks",
        last.cost_per_rank_us / base.cost_per_rank_us,
        f"cost@{last.ranks} / cost@{base.ranks}",
        Target("<=", 1.3, "<= 1.3x") if last.ranks > 256 else Target("<=", 1.2, "<= 1.2x")))
    rows.append(Row(
        "scale", f"client CPU per rank at {last.ranks} vs {base.ranks} ranks", "µs/rank",
        last.cpu_per_rank_us, base.cpu_per_rank_us, f"client CPU at {base.ranks} ranks",
        last.cpu_per_rank_us / base.cpu_per_rank_us,
        f"client CPU per fan-out per rank @{last.ranks} / @{base.ranks}", Target("info"),
        {f"at_{pt.ranks}": pt.cpu_per_rank_us for pt in points}))
    if len(points) >= 3:
        # cost per rank amortises a fixed per-fan-out cost, so it flatters large N;
        # the cost of each *added* rank, low range vs high range, shows growth
        lo, mid = points[0], points[-2]
        low = (mid.p50_s - lo.p50_s) / (mid.ranks - lo.ranks) * 1e6
        high = (last.p50_s - mid.p50_s) / (last.ranks - mid.ranks) * 1e6
        rows.append(Row(
            "scale", f"fan-out cost per added rank, {mid.ranks} -> {last.ranks} vs "
            f"{lo.ranks} -> {mid.ranks}", "µs/rank", high, low,
            f"added ranks {lo.ranks} -> {mid.ranks}", high / low if low > 0 else float("inf"),
            "marginal cost high range / low range", Target("info")))
    for pt in points:
        rows.append(Row(
            "scale", f"client RSS per rank, connected to {pt.ranks} ranks", "KiB/rank",
            pt.rss_per_rank / 1024, None, "client RSS before the client existed",
            pt.rss_per_rank / 1024, "(RSS connected - RSS before) / ranks", Target("info"),
            {"rss_before_mb": pt.rss_before / _MB, "rss_connected_mb": pt.rss_after / _MB,
             "rss_after_warmup_fanouts_mb": pt.rss_warm / _MB,
             "warm_per_rank_kib": (pt.rss_warm - pt.rss_before) / pt.ranks / 1024},
            ratio_unit=" KiB"))
    if len(points) > 1:
        first = points[0]
        marginal = ((last.rss_after - last.rss_before) - (first.rss_after - first.rss_before)
                    ) / (last.ranks - first.ranks)
        rows.append(Row(
            "scale", f"client RSS per added rank, {first.ranks} -> {last.ranks} ranks",
            "KiB/rank", marginal / 1024, None, f"client connected to {first.ranks} ranks",
            marginal / 1024, f"(delta@{last.ranks} - delta@{first.ranks}) / "
            f"{last.ranks - first.ranks}", Target("info"), ratio_unit=" KiB"))
    return rows


# -- multi_client: several client processes, engines bind ---------------------------------
@dataclass
class ClientRun:
    clients: int
    calls: int
    ok: int
    wrong: int
    errors: int
    seconds: float
    live_after: int

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0


def _run_clients(addresses: Sequence[str], clients: int, calls: int, callers: int) -> ClientRun:
    """Start ``clients`` client processes, wait until each is READY, say GO to all,
    and add up their answers over the wall time from the first start to the last end."""
    argv = _bench_client(["calls", "--addresses", *addresses, "--calls", str(calls),
                          "--callers", str(callers)])
    procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              start_new_session=True) for _ in range(clients)]
    try:
        deadline = time.monotonic() + 60
        for proc in procs:
            assert proc.stdout is not None
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([proc.stdout], [], [], left)[0]:
                    raise RuntimeError("multi_client: a client process did not get READY")
                line = proc.stdout.readline()
                if not line:
                    raise RuntimeError("multi_client: a client process exited before READY")
                if line.strip() == "READY":
                    break
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("GO\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            if proc.returncode != 0:
                raise RuntimeError(f"multi_client: a client exited with {proc.returncode}")
            results.append(_parse_result(out, "multi_client client"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return ClientRun(clients, sum(r["calls"] for r in results), sum(r["ok"] for r in results),
                     sum(r["wrong"] for r in results), sum(r["errors"] for r in results),
                     max(r["end"] for r in results) - min(r["start"] for r in results),
                     sum(r["live_after"] for r in results))


@dataclass
class MultiClientResult:
    single: list[ClientRun] = field(default_factory=list)
    multi: list[ClientRun] = field(default_factory=list)


def multi_client(addresses: Sequence[str], p: Params) -> MultiClientResult:
    calls = 2_000 if p.quick else 10_000
    rounds = 1 if p.quick else 2
    result = MultiClientResult()
    for i in range(rounds * 2):  # single, multi, multi, single, ...
        if (i + i // 2) % 2 == 0:
            result.single.append(_run_clients(addresses, 1, calls, 16))
        else:
            result.multi.append(_run_clients(addresses, MC_CLIENTS, calls, 16))
    return result


def multi_client_rows(r: MultiClientResult, engines: int) -> list[Row]:
    one = median([c.rate for c in r.single])
    many = median([c.rate for c in r.multi])
    runs = r.single + r.multi
    sent = sum(c.calls for c in runs)
    unanswered = sum(c.calls - c.ok for c in runs)
    n = r.multi[0].clients
    return [
        Row("multi_client", f"{n} client processes, {engines} engines that bind",
            "calls/s", many, one, "1 client process, same engines, same load per process",
            many / one, f"aggregate of {n} / 1 (higher is better)",
            Target(">=", 1.0, ">= 1.0x"),
            {"multi_blocks": [c.rate for c in r.multi],
             "single_blocks": [c.rate for c in r.single],
             "calls_per_client": r.multi[0].calls // n}),
        Row("multi_client", "calls not answered correctly (all runs)", "calls", unanswered,
            sent, "calls made", unanswered, "calls without the right answer",
            Target("<=", 0, "== 0"),
            {"errors": sum(c.errors for c in runs), "wrong": sum(c.wrong for c in runs),
             "live_after": sum(c.live_after for c in runs)}, ratio_unit=""),
    ]


# -- detect256 --------------------------------------------------------------------------------
@dataclass
class DetectResult:
    ranks: int
    seconds: list[float | None] = field(default_factory=list)
    others_lost: int = 0
    victim_lost_records: int = 0
    reasons: list[str] = field(default_factory=list)


def detect(address: str, fleet: EngineFleet, ranks: int, p: Params) -> DetectResult:
    """kill -9 the process of the last rank (alone in its process) while a client is
    connected to all ``ranks``; time until that rank is Lost. The full run restarts
    it and repeats."""
    result = DetectResult(ranks)
    victim_rank, victim_proc = ranks - 1, fleet.ranks[-1]
    trials = 1 if p.quick else 3

    lost: list[int] = []
    reasons: list[str] = []

    class LostRanks(logging.Handler):
        """Every rank the client declares lost (its ``engine rank %d lost`` record)."""

        def emit(self, record: logging.LogRecord) -> None:
            args = record.args
            if record.msg == "ctlwire: engine rank %d lost (%s)" and isinstance(args, tuple):
                rank = args[0]
                if isinstance(rank, int):
                    lost.append(rank)
                    if rank == victim_rank and len(args) > 1:
                        reasons.append(str(args[1]))

    handler = LostRanks()
    client_log = logging.getLogger("ctlwire.client")

    async def run() -> None:
        async with _ctl_client(address, ranks) as ctl:
            await ctl.wait_ready(timeout=60)
            lost.clear()
            for trial in range(trials):
                if trial:
                    await anyio.to_thread.run_sync(fleet.restart, victim_proc)
                    if await wait_live(ctl, victim_rank, anyio.current_time(), 30.0) is None:
                        raise RuntimeError("detect256: the restarted victim did not rejoin")
                    await anyio.sleep(0.5)
                start = anyio.current_time()
                os.kill(fleet.engines[victim_proc].pid, 9)
                result.seconds.append(await wait_lost(ctl, victim_rank, start, 10.0))
                await anyio.to_thread.run_sync(fleet.engines[victim_proc].proc.wait)
            await anyio.sleep(0.3)
            result.others_lost = len({r for r in lost if r != victim_rank})
            result.victim_lost_records = lost.count(victim_rank)
            result.reasons = list(reasons)

    client_log.addHandler(handler)
    try:
        anyio.run(run, backend="asyncio")
    finally:
        client_log.removeHandler(handler)
    return result


def detect_rows(r: DetectResult) -> list[Row]:
    seen = [s for s in r.seconds if s is not None]
    worst = max(seen) if len(seen) == len(r.seconds) else float("inf")
    return [Row("detect256", f"kill -9 of 1 rank among {r.ranks}: time to Lost (worst)",
                "s", worst, None, "-", worst, "seconds from kill -9 to Lost",
                Target("<=", 1.5, "<= 1.5 s"),
                {"trials_s": r.seconds, "median_s": median(seen) if seen else None,
                 "other_ranks_lost": r.others_lost, "detected_by": r.reasons},
                ratio_unit=" s"),
            Row("detect256", f"other ranks reported Lost (of {r.ranks - 1} alive)", "ranks",
                r.others_lost, r.ranks - 1, "ranks alive throughout", r.others_lost,
                "false Lost among the survivors", Target("<=", 0, "== 0"),
                {"victim_lost_records": r.victim_lost_records}, ratio_unit="")]


# -- the runner's hook ------------------------------------------------------------------------
def run_groups(pool: FleetPool, selected: set[str], p: Params,
               step: Callable[[str, Callable[[], list[Row]]], None]) -> None:
    """Run the selected groups of this module with engine fleets from ``pool``."""
    if "scale" in selected:
        def scale_all() -> list[Row]:
            points: list[ScalePoint] = []
            for ranks in SCALE_RANKS_QUICK if p.quick else SCALE_RANKS:
                name = f"scale{ranks}"
                # the detect256 layout at every size, so that group reuses the 256 fleet
                fleet = pool.custom(name, functools.partial(multi_rank_fleet, ranks=ranks))
                pool.start(name)
                points.append(scale_point(pool.address(name), ranks, len(fleet.ranks), p))
                if not (ranks == DETECT_RANKS and "detect256" in selected):
                    pool.stop(name)
            return scale_rows(points)

        step("scale", scale_all)
    if "multi_client" in selected:
        addresses = [f"ipc://{pool.directory}/mc-{r}.sock" for r in range(MC_ENGINES)]
        pool.custom("mc", lambda _addr: EngineFleet(MC_ENGINES, lambda r: [
            "--bind", addresses[r], "--mode", "poll", "--methods", BENCH_METHODS]))
        pool.start("mc")
        step("multi_client", lambda: multi_client_rows(multi_client(addresses, p),
                                                       MC_ENGINES))
        pool.stop("mc")
    if "detect256" in selected:
        name = f"scale{DETECT_RANKS}"
        fleet = pool.custom(name, functools.partial(multi_rank_fleet, ranks=DETECT_RANKS))
        pool.start(name)
        step("detect256", lambda: detect_rows(detect(pool.address(name), fleet,
                                                     DETECT_RANKS, p)))
        with contextlib.suppress(Exception):
            pool.stop(name)
