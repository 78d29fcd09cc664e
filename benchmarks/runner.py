"""``ctlwire bench``: run the selected groups, turn their numbers into rows.

Groups (``--only`` takes any of them; default: all, in this order):

``latency``      sequential ``call`` p50/p99 to 1 engine vs raw pyzmq + dict of futures
``floor``        the same p50 against libzmq's own sync ping-pong floor
``throughput``   64 concurrent callers to 1 engine vs the same baseline
``fanout``       queueing fan-out to 8 engines, 100 to 4,000 callers queued at once, vs the
                 anyio Lock + Event communicator over bare pyzmq engines, on asyncio and
                 on trio (each against the baseline on the same backend)
``fanout_pipeline`` the same fan-out to 8 engines with ordered pipelining (depth 4), 1,000
                 callers queued at once, vs the same baseline, on both backends: engines
                 that answer at once, then engines that step like a scheduler
``fanout_profile`` Python calls, C calls and task steps per rank per fan-out, client and
                 engine, ctlwire vs the same baseline, on both backends (counts, not times)
``trio``         ``latency`` and ``throughput`` with both clients on trio
``live``         cost of a call as live requests grow 10 -> 10,000 (vs itself at 10)
``memory``       registry, tombstones and RSS after 100,000 calls with 10 % timeouts
``state_table``  one request lifecycle: derived table vs a transitions model
``scale``        fan-out cost per rank at 8, 64, 256 ranks (vs itself at 8), client RSS/rank
``multi_client`` 4 client processes sharing 8 engines that bind vs 1 client process
``detect256``    kill -9 of 1 rank among 256: time until the client reports it Lost
``idle_cpu``     what watching costs: an idle client's process CPU connected to 8, 64 and
                 256 ranks (64 a process), and the time to detect a killed and a frozen rank
``engine_calls`` one engine ``poll()``: Python calls per plain request (a lone one, and
                 within a burst) vs a bare pyzmq engine loop, and an idle ``poll()`` vs a
                 bare non-blocking receive attempt (timed alternately)
``weight_sync``  one weight-sync operation of a real model over 4 torch engine ranks:
                 ctlwire's share vs the data movement (needs the torch extra)
``poll_status``  status pollers' p99 during a weight update on busy-loop engines, ``--mode
                 loop`` vs ``--mode poll``
``cpu``          engine CPU per plain request, one engine driven by ControlClient, against
                 the smallest pyzmq loop that speaks the protocol, driven the same way
``import_time``  ``import ctlwire.kernel`` in a fresh process vs the same import reading
                 the package metadata (``-X importtime``, alternately)

(``scale`` to ``detect256``: :mod:`ctlwire.benchmarks.scale`; ``fanout_profile``,
``idle_cpu``, ``engine_calls``, ``poll_status``, ``import_time``: their own modules;
``cpu``: :mod:`ctlwire.benchmarks.cpu_per_call`; ``fanout_pipeline``:
:mod:`ctlwire.benchmarks.pipelined_fan_out`; ``weight_sync``:
:mod:`ctlwire.benchmarks.weight_sync`)

Every comparison with a peer (``latency``, ``floor``, ``throughput``, ``fanout``,
``trio``, ``cpu``) is made of alternating runs, 5 of each side by default (2 with
``--quick``; ``run_bench(runs=N)``), and reports beside each rate or latency the
CPU per call of the client process and of the engine processes, every thread
(:mod:`ctlwire.benchmarks.paired_runs`, :mod:`ctlwire.benchmarks.schedstat`); a
fan-out also the client and its engines together.

Every engine process is started by a :class:`FleetPool` and stopped in
``finally``, whatever happens.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

from . import (
    cpu_per_call,
    engine_calls,
    fanout_profile,
    idle_cpu,
    import_time,
    pipelined_fan_out,
    poll_status,
    scale,
    scenarios,
    state_table,
    weight_sync,
)
from .cpu_steal import read_cpu_times, steal_percent
from .fleets import FleetPool
from .paired_runs import Cpu, compared_row, cpu_rows
from .report import Report, Row, Target
from .stats import median, percentile

__all__ = ["GROUPS", "run_bench"]

GROUPS = ("latency", "floor", "throughput", "fanout", *pipelined_fan_out.GROUPS,
          *fanout_profile.GROUPS, "trio", "live",
          "memory", "state_table", *scale.GROUPS, *idle_cpu.GROUPS, *weight_sync.GROUPS,
          *poll_status.GROUPS, *engine_calls.GROUPS, *cpu_per_call.GROUPS,
          *import_time.GROUPS)
FAN_ENGINES = 8
_BASE1 = ("raw pyzmq ROUTER read with the FD technique on anyio, dict of reply slots "
          "(vLLM utility-call pattern)")
_BASE1_TRIO = _BASE1 + ", on trio"
_BASE_FAN = ("anyio Lock + Event fan-out communicator (fixed SGLang design), FD-technique "
             "receive over bare sync pyzmq engines")
_BACKENDS = ("asyncio", "trio")
_MB = 1024 * 1024


def _log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _lower(ctl: float, base: float) -> float:
    return ctl / base if base else float("inf")


def _cpus(runs: Sequence[scenarios.EngineRun], which: str) -> list[Cpu]:
    cpus = [getattr(r, which) for r in runs]
    assert all(c is not None for c in cpus), which
    return cpus


def _single_engine_rows(r: scenarios.SingleEngineResult, groups: set[str], *,
                        group_of: Callable[[str], str], base_name: str) -> list[Row]:
    """The rows of the one-engine comparison; ``group_of`` names the group of the
    latency and throughput rows (``trio`` for the trio run)."""
    rows: list[Row] = []
    lower = "ctlwire / baseline (lower is better)"
    seq = "sequential calls, 1 engine"
    if "latency" in groups:
        group = group_of("latency")
        for q, target in ((50, Target("<=", 1.0, "<= 1.0x")), (99, Target("info"))):
            rows.append(compared_row(
                group, f"sequential call p{q}, 1 engine", "µs",
                [percentile(x.seq_us, q) for x in r.ctl],
                [percentile(x.seq_us, q) for x in r.base], base_name, lower, target,
                {"samples_each_run": len(r.ctl[0].seq_us)}))
        rows += cpu_rows(group, seq, _cpus(r.ctl, "seq_cpu"), _cpus(r.base, "seq_cpu"),
                         base_name)
    if "floor" in groups and r.floor_us:
        ctl50 = [percentile(x.seq_us, 50) for x in r.ctl]
        base50 = [percentile(x.seq_us, 50) for x in r.base]
        floor50 = [percentile(x, 50) for x in r.floor_us]
        base_x = median([b / f for b, f in zip(base50, floor50, strict=True)])
        rows.append(compared_row(
            "floor", f"call p50 over libzmq floor (raw pyzmq stack: {base_x:.1f}x)", "µs",
            ctl50, floor50, "libzmq floor: sync pyzmq ROUTER/DEALER ping-pong between two "
            "processes", "ctlwire p50 / floor p50", Target("info"),
            {"baseline_p50_runs_us": [round(x, 1) for x in base50],
             "baseline_over_floor": base_x, "floor_samples_each_run": len(r.floor_us[0])}))
    if "throughput" in groups:
        group = group_of("throughput")
        scenario = f"{r.callers} concurrent callers, 1 engine"
        rows.append(compared_row(group, scenario, "calls/s", [x.rate for x in r.ctl],
                                 [x.rate for x in r.base], base_name,
                                 "ctlwire / baseline (higher is better)",
                                 Target(">=", 1.1, ">= 1.1x")))
        rows += cpu_rows(group, scenario, _cpus(r.ctl, "rate_cpu"), _cpus(r.base, "rate_cpu"),
                         base_name, client_target=Target("<=", 1.5, "<= 1.5x"))
    return rows


def _fan_out_rows(r: scenarios.FanOutResult) -> list[Row]:
    rows = []
    base_name = f"{_BASE_FAN}, on {r.backend}"
    for callers in r.ctl[0].rate:
        scenario = f"queueing fan-out, {r.engines} engines, {callers:,} callers at once, " \
                   f"{r.backend}"
        rows.append(compared_row("fanout", scenario, "fan-outs/s",
                                 [x.rate[callers] for x in r.ctl],
                                 [x.rate[callers] for x in r.base], base_name,
                                 "ctlwire / baseline (higher is better)",
                                 Target(">=", 1.0, ">= 1.0x")))
        rows += cpu_rows("fanout", scenario, [x.cpu[callers] for x in r.ctl],
                         [x.cpu[callers] for x in r.base], base_name, per="fan-out",
                         engines=r.engines, total_target=Target("<=", 1.25, "<= 1.25x"))
    return rows


def _live_rows(r: scenarios.LiveResult) -> list[Row]:
    base_level = r.levels[0]
    base = r.p50_us[base_level]
    return [Row("live", f"call p50 with {level:,} live requests", "µs", r.p50_us[level], base,
                f"ctlwire with {base_level} live requests (measured before and after)",
                r.p50_us[level] / base, f"p50 at N live / p50 at {base_level} live",
                Target("<=", 1.2, "<= 1.2x (flat)"),
                {"live_seen": r.live_seen.get(level), "p50_at_start_us": r.p50_first_base,
                 "p50_at_end_us": r.p50_last_base, "leftover_live": r.leftover})
            for level in r.levels[1:]]


def _memory_rows(r: scenarios.MemoryResult) -> list[Row]:
    detail = {"calls": r.calls, "warmup_calls": r.warmup, "ok": r.ok, "timeouts": r.timeouts,
              "timeout_fraction": round(r.timeouts / max(1, r.calls), 4),
              "other_errors": r.other_errors, "late_replies": r.late,
              "duplicate_replies": r.duplicate, "seconds": round(r.seconds, 2),
              "calls_per_s": round(r.calls / r.seconds) if r.seconds else None,
              "registry": r.stats}
    what = f"after {r.calls:,} calls, {r.timeouts / max(1, r.calls):.0%} timed out"
    growth = (r.rss_after - r.rss_before) / _MB
    return [
        Row("memory", f"live registry entries {what}", "entries", r.live_after, None, "-",
            r.live_after, "live entries", Target("<=", 0, "== 0"), detail, ratio_unit=""),
        Row("memory", "tombstones vs their bound", "entries", r.tombstones, r.tombstone_bound,
            "max_tombstones", r.tombstones / max(1, r.tombstone_bound), "tombstones / bound",
            Target("<=", 1.0, "<= 1.0x")),
        Row("memory", "RSS growth (after vs after warm-up)", "MB", r.rss_after / _MB,
            r.rss_before / _MB, "RSS after the warm-up calls", growth, "RSS growth in MB",
            Target("<=", 5.0, "<= 5 MB"), ratio_unit=" MB"),
    ]


def _state_table_rows(rows: Sequence[state_table.LifecycleRow]) -> list[Row]:
    out = [Row("state_table", f"request lifecycle, {r.live:,} live requests", "µs", r.table_us,
               r.transitions_us, "transitions: shared Machine, add_model + 4 triggers + "
               "remove_model", r.table_us / r.transitions_us,
               "derived table / transitions (lower is better)", Target("<=", 1.0, "<= 1.0x"))
           for r in rows]
    first, last = rows[0], rows[-1]
    out.append(Row("state_table", f"table lifecycle at {last.live:,} vs {first.live} live",
                   "µs", last.table_us, first.table_us, f"table at {first.live} live",
                   last.table_us / first.table_us, f"cost at {last.live:,} / at {first.live}",
                   Target("<=", 1.2, "<= 1.2x (flat)")))
    return out


def run_bench(*, quick: bool = False, only: Sequence[str] | None = None,
              progress: Callable[[str], None] = _log, runs: int | None = None) -> Report:
    """Run the selected groups (all by default) and return their report. ``runs``: the
    alternating runs of each side in a comparison with a peer (default 5, 2 with
    ``quick``)."""
    selected = set(only or GROUPS)
    unknown = selected - set(GROUPS)
    if unknown:
        raise ValueError(f"unknown bench group(s) {sorted(unknown)}; choose from {GROUPS}")
    report = Report(quick=quick)
    report.groups = [g for g in GROUPS if g in selected]
    p = scenarios.Params(quick, runs)
    started = time.perf_counter()
    cpu_at_start = read_cpu_times()

    def step(name: str, fn: Callable[[], list[Row]]) -> None:
        t0 = time.perf_counter()
        cpu0 = read_cpu_times()
        progress(f"{name} ...")
        rows = fn()
        report.add(rows)
        steal = report.group_steal_pct[name] = steal_percent(cpu0, read_cpu_times())
        stolen = "" if steal is None else f", {steal:.1f} % CPU stolen by the host"
        progress(f"{name}: {len(rows)} rows in {time.perf_counter() - t0:.1f} s{stolen}")

    with FleetPool() as pool:
        one_engine = {"latency", "floor", "throughput", "trio", "memory"} & selected
        if one_engine:
            pool.ctlwire("ctl1", 1)
        if {"latency", "floor", "throughput", "trio"} & selected:
            pool.baseline("base1", 1)
        if {"latency", "floor", "throughput"} & selected:
            if "floor" in selected:
                pool.module("floor", "ctlwire.benchmarks.libzmq_floor",
                            lambda r: ["--connect", pool.address("floor")])
            pool.start("ctl1", "base1", *(["floor"] if "floor" in selected else []))

            def single() -> list[Row]:
                res = scenarios.single_engine(
                    pool.address("ctl1"), pool.address("base1"),
                    pool.address("floor") if "floor" in selected else None, p,
                    latency=bool({"latency", "floor"} & selected),
                    throughput="throughput" in selected, ctl_pids=pool.pids("ctl1"),
                    base_pids=pool.pids("base1"))
                return _single_engine_rows(res, selected, group_of=lambda g: g,
                                           base_name=_BASE1)

            step("latency/floor/throughput", single)
            pool.stop("floor")
            if "trio" not in selected:
                pool.stop("base1")
        if "fanout" in selected:
            pool.ctlwire("ctl8", FAN_ENGINES)
            pool.baseline("base8", FAN_ENGINES)
            pool.start("ctl8", "base8")
            step("fanout", lambda: [row for backend in _BACKENDS for row in _fan_out_rows(
                scenarios.fan_out(pool.address("ctl8"), pool.address("base8"), FAN_ENGINES,
                                  p, backend, pool.pids("ctl8"), pool.pids("base8")))])
            pool.stop("base8")
            pool.stop("ctl8")
        if "fanout_pipeline" in selected:
            step("fanout_pipeline", lambda: pipelined_fan_out.run_group(pool, p))
        if "fanout_profile" in selected:
            def profile() -> list[Row]:
                rows, notes = fanout_profile.run_group(pool, p)
                report.notes.extend(notes)
                return rows

            step("fanout_profile", profile)
        if "trio" in selected:
            pool.start("ctl1", "base1")
            step("trio", lambda: _single_engine_rows(
                scenarios.single_engine(pool.address("ctl1"), pool.address("base1"), None, p,
                                        latency=True, throughput=True, backend="trio",
                                        ctl_pids=pool.pids("ctl1"),
                                        base_pids=pool.pids("base1")),
                {"latency", "throughput"}, group_of=lambda g: "trio", base_name=_BASE1_TRIO))
            pool.stop("base1")
        if "live" in selected:
            # every pending call waits at rank 1 (its own budget would answer Busy)
            pool.ctlwire("live", 2, serve_ranks=(1,), max_queued=max(p.live_levels) + 1)
            pool.start("live")
            step("live", lambda: _live_rows(scenarios.live_requests(pool.address("live"), p)))
            pool.stop("live")
        if "memory" in selected:
            pool.start("ctl1")
            step("memory", lambda: _memory_rows(scenarios.memory(pool.address("ctl1"), p)))
        pool.stop("ctl1")
        if "cpu" in selected:
            step("cpu", lambda: cpu_per_call.run_group(pool, p))
        scale.run_groups(pool, selected, p, step)
        if "idle_cpu" in selected:
            step("idle_cpu", lambda: idle_cpu.run_group(pool, p))
    if "weight_sync" in selected:
        step("weight_sync", lambda: weight_sync.rows(quick, progress))
    if "poll_status" in selected:
        step("poll_status", lambda: poll_status.rows(quick, progress))
    if "engine_calls" in selected:
        step("engine_calls", lambda: engine_calls.rows(quick))
    if "import_time" in selected:
        step("import_time", lambda: import_time.rows(quick))
    if "state_table" in selected:
        lives = (10, 1_000) if quick else (10, 10_000)
        step("state_table", lambda: _state_table_rows(state_table.measure(quick, lives)))
        if quick:
            report.notes.append("--quick: state_table compares 10 vs 1,000 live requests "
                                "(transitions' add_model is O(models); 10,000 takes long)")
    report.elapsed_s = time.perf_counter() - started
    report.steal_pct = steal_percent(cpu_at_start, read_cpu_times())
    return report
