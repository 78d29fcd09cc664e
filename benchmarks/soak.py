"""Soak and load runs against real engine processes over ZeroMQ ipc.

* **Soak** (:func:`run_soak`): 100,000 calls (``quick``: 5,000) from 128
  concurrent callers to 4 engine processes, through a
  :class:`~ctlwire.testing.faults.FaultyClientTransport` injecting
  1% drops, 1% duplicates and delays (2% of frames, up to 20 ms) both ways,
  while one engine is killed with SIGKILL and restarted mid-run. Every 100th
  call raises remotely and every 500th is a fan-out to all ranks. Checks:
  every caller got exactly one outcome (a value or a typed error) and none
  was lost; no unexpected outcome type; nothing left in the request map;
  tombstones never above their bound; RSS growth bounded; the kill detected
  within 3 s and the restarted engine rejoined.
* **Load** (:func:`run_load`): 10,000 requests (``quick``: 2,000) in flight at
  once. Each engine is first held by a ``gate`` call, so every request stays
  pending until all are registered; then the gate opens and they drain.
  Checks: the request map peaked at every request plus the gates, every
  request succeeded, and the map drained to 0.

``python -m ctlwire.benchmarks.soak [--quick] [--json FILE]`` runs both;
:func:`main` is the same as a function.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.benchmarks.soak_engine import METHODS
from ctlwire.benchmarks.traffic import (
    EXPECTED,
    Gauges,
    Tally,
    Workload,
    accounting_problems,
    drive,
    leaked_entries,
    outcome_name,
    private_dir,
    rss_bytes,
    wait_live,
    wait_lost,
)
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.testing.faults import Fault, FaultPlan, FaultyClientTransport
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

__all__ = [
    "LoadConfig",
    "LoadReport",
    "SoakConfig",
    "SoakReport",
    "load_on",
    "main",
    "run_load",
    "run_soak",
    "soak_on",
]

DETECTION_BOUND = 3.0
"""Seconds within which a killed engine must be reported dead (liveness is ~1 s)."""


@dataclass
class SoakConfig:
    calls: int = 100_000
    engines: int = 4
    workers: int = 128
    timeout: float = 1.0
    drop: float = 0.01
    duplicate: float = 0.01
    delay_probability: float = 0.02
    max_delay: float = 0.02
    kill_at: float | None = 0.4
    """Kill rank 1 once this fraction of the calls was sent (None: no kill)."""
    seed: int = 1
    fail_every: int = 100
    fan_out_every: int = 500
    max_tombstones: int = 10_000
    rss_bound_mb: float = 64.0
    backend: str = "asyncio"

    @classmethod
    def quick(cls) -> SoakConfig:
        return cls(calls=5_000)

    def plan(self) -> FaultPlan:
        return FaultPlan(seed=self.seed, faults=(
            Fault.drop(self.drop), Fault.duplicate(self.duplicate),
            Fault.delay(0.0, self.max_delay, probability=self.delay_probability)))


@dataclass
class SoakReport:
    config: SoakConfig
    sent: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    unexpected: dict[str, int] = field(default_factory=dict)
    samples: list[str] = field(default_factory=list)
    lost: int = 0
    leaked: int = 0
    wall_s: float = 0.0
    calls_per_s: float = 0.0
    max_live: int = 0
    max_tombstones: int = 0
    tombstones_end: int = 0
    rss_start_mb: float = 0.0
    rss_mid_mb: float = 0.0
    rss_end_mb: float = 0.0
    kill_detection_s: float | None = None
    rejoin_s: float | None = None
    late: int = 0
    duplicate: int = 0
    stale: int = 0
    unknown: int = 0
    faults: dict[str, int] = field(default_factory=dict)

    @property
    def rss_growth_mb(self) -> float:
        return self.rss_end_mb - self.rss_start_mb

    def problems(self) -> list[str]:
        cfg = self.config
        out = accounting_problems(self.sent, self.outcomes, self.unexpected, self.lost,
                                  self.leaked, self.samples)
        if self.max_tombstones > cfg.max_tombstones:
            out.append(f"{self.max_tombstones} tombstones, bound {cfg.max_tombstones}")
        if self.max_live > cfg.workers + 1:
            out.append(f"{self.max_live} live entries with {cfg.workers} callers")
        if self.rss_growth_mb > cfg.rss_bound_mb:
            out.append(f"RSS grew {self.rss_growth_mb:.1f} MB (bound {cfg.rss_bound_mb} MB)")
        if cfg.kill_at is not None:
            if self.kill_detection_s is None or self.kill_detection_s > DETECTION_BOUND:
                out.append(f"killed engine detected after {self.kill_detection_s} s")
            if self.rejoin_s is None:
                out.append("the restarted engine never rejoined")
        return out

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["rss_growth_mb"] = self.rss_growth_mb
        data["problems"] = self.problems()
        return data


def _mb(n: int) -> float:
    return n / (1 << 20)


def fleet_for(address: str, engines: int, *, serve: bool = False,
              max_queued: int | None = None) -> EngineFleet:
    """``engines`` processes dialing ``address`` with the soak methods (serve mode:
    room for ``max_queued`` requests waiting to start, per method, if given)."""
    mode = ["--mode", "serve"] if serve else []
    if max_queued is not None:
        mode += ["--max-queued", str(max_queued)]
    return EngineFleet(engines, lambda r: ["--connect", address, "--methods", METHODS, *mode])


async def soak_on(address: str, fleet: EngineFleet, cfg: SoakConfig) -> SoakReport:
    """The soak against a running ``fleet`` whose engines dial ``address``."""
    report = SoakReport(cfg)
    transport = FaultyClientTransport(ZmqRouterClientTransport(address), cfg.plan())
    tally = Tally()
    gauges = Gauges()
    rss: dict[str, int] = {}
    kill_rank = 1
    kill_from = int(cfg.calls * cfg.kill_at) if cfg.kill_at is not None else -1
    kill_now = anyio.Event()
    kill_done = anyio.Event()
    if cfg.kill_at is None:
        kill_done.set()

    def progress(n: int) -> None:
        if n == cfg.calls // 10:
            rss["start"] = rss_bytes()
        elif n == cfg.calls // 2:
            rss["mid"] = rss_bytes()
        if n == kill_from:
            kill_now.set()

    async with ControlClient(transport, ranks=cfg.engines, default_timeout=cfg.timeout,
                             max_tombstones=cfg.max_tombstones) as client:

        async def kill_and_restart() -> None:
            await kill_now.wait()
            start = anyio.current_time()
            await anyio.to_thread.run_sync(fleet.kill, kill_rank)
            report.kill_detection_s = await wait_lost(client, kill_rank, start)
            restart = anyio.current_time()
            await anyio.to_thread.run_sync(fleet.restart, kill_rank)
            report.rejoin_s = await wait_live(client, kill_rank, restart)
            kill_done.set()

        await client.wait_ready(timeout=15.0)
        work = Workload(cfg.calls, cfg.workers, cfg.timeout, fail_every=cfg.fail_every,
                        fan_out_every=cfg.fan_out_every)
        async with anyio.create_task_group() as tg:
            tg.start_soon(gauges.watch, client)
            if cfg.kill_at is not None:
                tg.start_soon(kill_and_restart)
            report.wall_s = await drive(client, work, tally,
                                        keep_going=lambda: not kill_done.is_set(),
                                        on_progress=progress)
            tg.cancel_scope.cancel()
        await anyio.sleep(cfg.max_delay + 0.2)  # stragglers: delayed and duplicated frames
        gauges.sample(client)
        rss["end"] = rss_bytes()
        report.leaked = leaked_entries(client)
        report.tombstones_end = client.registry.tombstone_count
        stats = client.registry.stats
        report.late, report.duplicate, report.unknown = stats.late, stats.duplicate, stats.unknown
        report.stale = client.counters["stale_incarnation"]
        report.faults = dict(sorted(transport.faults.counters.items()))
    report.sent = tally.sent
    report.outcomes = {k: tally.outcomes[k] for k in EXPECTED if tally.outcomes[k]}
    report.unexpected = dict(tally.unexpected)
    report.samples = tally.samples
    report.lost = tally.lost
    report.calls_per_s = tally.sent / report.wall_s if report.wall_s else 0.0
    report.max_live = gauges.max_live
    report.max_tombstones = max(gauges.max_tombstones, report.tombstones_end)
    report.rss_start_mb = _mb(rss.get("start", rss["end"]))
    report.rss_mid_mb = _mb(rss.get("mid", rss["end"]))
    report.rss_end_mb = _mb(rss["end"])
    return report


def run_soak(quick: bool = False, cfg: SoakConfig | None = None) -> SoakReport:
    """Start the engines, run the soak, stop the engines; see the module docstring."""
    cfg = cfg or (SoakConfig.quick() if quick else SoakConfig())
    with private_dir() as d:
        address = f"ipc://{d}/control.sock"
        with fleet_for(address, cfg.engines) as fleet:
            return anyio.run(soak_on, address, fleet, cfg, backend=cfg.backend)


@dataclass
class LoadConfig:
    requests: int = 10_000
    engines: int = 4
    timeout: float = 60.0
    backend: str = "asyncio"

    @classmethod
    def quick(cls) -> LoadConfig:
        return cls(requests=2_000)


@dataclass
class LoadReport:
    config: LoadConfig
    max_live: int = 0
    gates: int = 0
    fill_s: float = 0.0
    drain_s: float = 0.0
    requests_per_s: float = 0.0
    outcomes: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    leaked: int = 0
    live_after: int = 0
    rss_growth_mb: float = 0.0

    def problems(self) -> list[str]:
        out = []
        want = self.config.requests + self.gates
        if self.max_live < want:
            out.append(f"request map peaked at {self.max_live}, expected {want}")
        if self.outcomes.get("ok", 0) != want:
            out.append(f"outcomes {self.outcomes}, expected {want} ok")
        if self.lost or self.leaked or self.live_after:
            out.append(f"lost {self.lost}, leaked {self.leaked}, live after {self.live_after}")
        return out

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["problems"] = self.problems()
        return data


async def load_on(address: str, cfg: LoadConfig, gate_dir: str) -> LoadReport:
    """The load run against engines in serve mode (the ``gate`` method) dialing ``address``."""
    report = LoadReport(cfg, gates=cfg.engines)
    gate = os.path.join(gate_dir, f"gate-{os.getpid()}-{time.monotonic_ns()}")
    tally = Tally()
    gauges = Gauges()
    gc.collect()
    rss0 = rss_bytes()
    async with ControlClient(ZmqRouterClientTransport(address), ranks=cfg.engines,
                             default_timeout=cfg.timeout) as client:
        await client.wait_ready(timeout=15.0)

        async def call(method: str, payload: Any, rank: int) -> None:
            with anyio.move_on_after(cfg.timeout + 5.0) as guard:
                try:
                    await client.call(method, payload, rank=rank)
                except Exception as exc:
                    tally.outcomes[outcome_name(exc)] += 1
                else:
                    tally.outcomes["ok"] += 1
            if guard.cancelled_caught:
                tally.lost += 1

        async with anyio.create_task_group() as tg:
            for rank in client.ranks:
                tg.start_soon(call, "gate", gate, rank)
            while client.registry.live_count < cfg.engines:
                await anyio.sleep(0.001)
            start = anyio.current_time()
            for i in range(cfg.requests):
                # queued at the engine behind the gate (one gated_echo at a time)
                tg.start_soon(call, "gated_echo", (gate, i), client.ranks[i % cfg.engines])
                if i % 500 == 499:
                    await anyio.sleep(0)  # a server admits requests over time, not in one step
            want = cfg.requests + cfg.engines
            with anyio.move_on_after(cfg.timeout):
                while client.registry.live_count < want:
                    await anyio.sleep(0.001)
            gauges.sample(client)
            report.fill_s = anyio.current_time() - start
            with open(gate, "w"):
                pass
            opened = anyio.current_time()
        report.drain_s = anyio.current_time() - opened
        os.unlink(gate)
        report.live_after = client.registry.live_count
        report.leaked = leaked_entries(client)
    report.max_live = gauges.max_live
    report.outcomes = dict(tally.outcomes)
    report.lost = tally.lost
    report.requests_per_s = cfg.requests / report.drain_s if report.drain_s else 0.0
    gc.collect()  # request tasks leave reference cycles behind: count memory kept, not garbage
    report.rss_growth_mb = _mb(rss_bytes() - rss0)
    return report


def run_load(quick: bool = False, cfg: LoadConfig | None = None) -> LoadReport:
    """Start serve-mode engines, run the load, stop them; see the module docstring."""
    cfg = cfg or (LoadConfig.quick() if quick else LoadConfig())
    with private_dir() as d:
        address = f"ipc://{d}/control.sock"
        # every gated request waits at its engine (its own budget would answer Busy)
        with fleet_for(address, cfg.engines, serve=True, max_queued=cfg.requests + 1):
            return anyio.run(load_on, address, cfg, d, backend=cfg.backend)


def format_soak(r: SoakReport) -> str:
    cfg = r.config
    outcomes = ", ".join(f"{k} {v}" for k, v in r.outcomes.items())
    injected = {a: sum(n for k, n in r.faults.items() if k.startswith(a + "."))
                for a in ("drop", "duplicate", "delay")}
    injected["undeliverable"] = sum(n for k, n in r.faults.items() if k.startswith("lost."))
    lines = [
        f"soak: {r.sent} calls to {cfg.engines} engine processes (ipc), {cfg.workers} callers, "
        f"timeout {cfg.timeout:g} s, faults {cfg.drop:.0%} drop, {cfg.duplicate:.0%} duplicate, "
        f"{cfg.delay_probability:.0%} delayed <= {cfg.max_delay * 1000:g} ms, "
        f"{'SIGKILL + restart of rank 1' if cfg.kill_at is not None else 'no kill'}",
        f"  outcomes: {outcomes}; lost {r.lost}; unexpected {sum(r.unexpected.values())}; "
        f"leaked {r.leaked}",
        f"  {r.calls_per_s:,.0f} calls/s over {r.wall_s:.1f} s; max live entries {r.max_live}; "
        f"tombstones max {r.max_tombstones} (bound {cfg.max_tombstones})",
        f"  RSS {r.rss_start_mb:.1f} -> {r.rss_mid_mb:.1f} -> {r.rss_end_mb:.1f} MB "
        f"(growth {r.rss_growth_mb:+.1f} MB from 10% to the end)",
        f"  injected: {injected}; client saw late {r.late}, duplicate {r.duplicate}, "
        f"stale {r.stale}, unknown {r.unknown}",
    ]
    if cfg.kill_at is not None:
        det = "never" if r.kill_detection_s is None else f"{r.kill_detection_s:.3f} s"
        rej = "never" if r.rejoin_s is None else f"{r.rejoin_s:.2f} s"
        lines.append(f"  kill: detected after {det}; restarted and rejoined after {rej}")
    lines.append("  " + ("OK" if not r.problems() else "PROBLEMS: " + "; ".join(r.problems())))
    return "\n".join(lines)


def format_load(r: LoadReport) -> str:
    cfg = r.config
    return "\n".join([
        f"load: {cfg.requests} requests in flight at once over {cfg.engines} engine processes",
        f"  request map peaked at {r.max_live} live entries ({cfg.requests} + {r.gates} gates), "
        f"filled in {r.fill_s:.2f} s; drained in {r.drain_s:.2f} s "
        f"({r.requests_per_s:,.0f} requests/s); live after {r.live_after}",
        f"  outcomes {r.outcomes}; lost {r.lost}; leaked {r.leaked}; "
        f"RSS growth {r.rss_growth_mb:+.1f} MB",
        "  " + ("OK" if not r.problems() else "PROBLEMS: " + "; ".join(r.problems())),
    ])


def main(quick: bool = False, json_path: str | None = None) -> int:
    """Run the soak and the load run, print both; non-zero on any problem."""
    soak = run_soak(quick)
    print(format_soak(soak), flush=True)
    load = run_load(quick)
    print(format_load(load), flush=True)
    if json_path:
        data = {"quick": quick, "python": platform.python_version(),
                "soak": soak.to_json(), "load": load.to_json()}
        with open(json_path, "w") as f:
            json.dump(data, f, indent=2, default=str)
    return 1 if soak.problems() or load.problems() else 0


def _cli(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ctlwire.benchmarks.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="5,000 calls and 2,000 in flight")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    return main(args.quick, args.json)


if __name__ == "__main__":
    sys.exit(_cli())
