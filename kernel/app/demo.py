"""``ctlwire demo``: the asynchronous-RL weight-update cycle against real engine processes.

Starts N engine processes (:mod:`ctlwire.kernel.app.demo_engine`, each a
synchronous step loop polling its :class:`EngineEndpoint`) over real ZeroMQ
sockets, then runs ``pause → update_weights(v) → resume`` K times, each cycle one
coordinated operation (:class:`~ctlwire.kernel.operation_runner.OperationRunner`,
progress shown live per step and rank), while concurrent callers hammer
``get_server_info`` through the queueing mailbox and ``get_load`` in watching
mode. ``--kill-one`` kills an
engine with SIGKILL mid-run to show ``EngineDead`` surfacing in about a second
while the other ranks carry on (the cycle it broke is retried on the live
ranks). ``--fault update`` makes one rank's ``update_weights`` raise in the
middle cycle: that operation aborts, every rank is compensated (old weights,
resumed) and the failed rank is named. The last cycle's ``update_weights`` is a
slow one (``--slow-update SECONDS``, 2 s by default): each engine's thread
blocks as in a real weight load, its liveness beacon keeps the rank alive
(Busy, never Lost), and the load's progress is shown live per rank.

It checks, and exits non-zero unless all hold: every cycle reached every live
rank with the right version; the queueing mailbox served ``get_server_info``
callers in arrival order on every rank; every call got exactly one outcome;
the request map is empty at the end; a killed engine was detected in time; an
injected update fault left every rank compensated on its old weights.
"""

from __future__ import annotations

import itertools
import json
import os
import platform
import re
import signal
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import anyio

from ctlwire.kernel.app.arguments import non_negative_float, positive_int
from ctlwire.kernel.app.engine_fleet import EngineFleet
from ctlwire.kernel.app.operation_engine import Fault, weight_update_plan
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.operation_result import ProgressEvent
from ctlwire.kernel.errors import CtlwireError
from ctlwire.kernel.operation_runner import OperationRunner
from ctlwire.states import RankState
from ctlwire.transports.curve import (
    CurveServerConfig,
    load_keypair,
    load_public_key,
    write_keypair,
)
from ctlwire.transports.transport import ClientTransport
from ctlwire.transports.zmq_client import ZmqDealerClientTransport, ZmqRouterClientTransport

__all__ = ["DemoConfig", "DemoReport", "run_demo"]



@dataclass
class DemoConfig:
    engines: int = 4
    cycles: int = 20
    transport: str = "ipc"
    connect: list[str] = field(default_factory=list)
    #: ``connect`` to tcp addresses without CURVE (the engines must allow it too)
    allow_insecure_tcp: bool = False
    kill_one: bool = False
    backend: str = "asyncio"
    info_callers: int = 8
    load_callers: int = 4
    train_seconds: float = 0.1
    timeout: float = 5.0
    fault: str = ""  # "update": one rank's update_weights raises in the middle cycle
    slow_update: float = 2.0  # seconds the last cycle's update_weights blocks each engine


@dataclass
class DemoReport:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, dict[str, int]] = field(default_factory=lambda: defaultdict(dict))
    fifo_checked: int = 0
    fifo_violations: list[str] = field(default_factory=list)
    cycle_failures: list[str] = field(default_factory=list)
    killed_rank: int | None = None
    detection_seconds: float | None = None
    final_versions: dict[int, int] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    wall_seconds: float = 0.0
    address: str = ""
    watch_joins: int = 0
    operations: dict[str, int] = field(default_factory=dict)
    aborted: list[str] = field(default_factory=list)
    fault: str = ""
    fault_verified: bool = False
    quarantined: list[int] = field(default_factory=list)
    slow_progress: dict[int, float] = field(default_factory=dict)  # rank -> highest fraction
    slow_busy: set[int] = field(default_factory=set)  # ranks seen Busy during the slow load
    slow_lost: int = 0  # ranks lost while the slow update ran

    def problems(self, cfg: DemoConfig) -> list[str]:
        out = list(self.cycle_failures) + list(self.fifo_violations)
        if self.metrics.get("live_requests", 1) != 0:
            out.append(f"{self.metrics.get('live_requests')} request-map entries left behind")
        if self.fifo_checked == 0:
            out.append("no get_server_info call completed: FIFO order not verified")
        expected = {"EngineDead", "NotDelivered", "OutcomeUnknown"}
        if cfg.fault:
            expected.add("InjectedFault")
        unexpected = {m: e for m, e in self.errors.items()
                      if any(k not in expected for k in e)}
        if unexpected:
            out.append(f"unexpected errors: {unexpected}")
        if cfg.kill_one:
            if self.detection_seconds is None:
                out.append("the killed engine was never detected")
            elif self.detection_seconds > 3.0:
                out.append(f"engine death took {self.detection_seconds:.2f} s to detect")
        if cfg.fault and not self.fault_verified:
            out.append(f"injected {cfg.fault} fault: compensation not verified ({self.fault})")
        stuck = [r for r in self.quarantined if r != self.killed_rank]
        if stuck:
            out.append(f"ranks {stuck} quarantined")
        if cfg.slow_update > 0 and cfg.cycles > 0:
            if self.slow_lost:
                out.append(f"{self.slow_lost} ranks declared lost while busy loading weights")
            live_ranks = [r for r in self.final_versions if r != self.killed_rank]
            unseen = [r for r in live_ranks if self.slow_progress.get(r, -1.0) <= 0]
            if unseen:
                out.append(f"no load progress seen from ranks {unseen}")
        live = [v for r, v in self.final_versions.items() if r != self.killed_rank]
        if any(v != cfg.cycles for v in live):
            out.append(f"final weight versions {self.final_versions}, expected {cfg.cycles}")
        return out


def step_summary(step: str, ranks: dict[int, str]) -> str:
    """A running operation step for the progress line: ``"step pause: 3 ranks applying"``."""
    states: dict[str, int] = defaultdict(int)
    for state in ranks.values():
        states[state] += 1
    return f"step {step}: " + ", ".join(
        f"{n} {'rank' if n == 1 else 'ranks'} {state}" for state, n in sorted(states.items()))


#: why an error the summary counts is expected, by its type name
_EXPECTED_ERRORS = {
    "NotDelivered": "a call to a rank already known lost is refused at once, never sent "
                    "(the work did not run; a retry is safe)",
    "OutcomeUnknown": "a call in flight when its rank died: it may have run (only an "
                      "idempotent call is retried)",
    "EngineDead": "a rank died while the call waited for it",
    "InjectedFault": "the update_weights failure injected by --fault update; the "
                     "operation undid every rank's change (compensated)",
}


def expected_error_notes(cfg: DemoConfig, report: DemoReport) -> list[str]:
    """One line per error type in the summary, saying why it is expected here."""
    import textwrap

    seen = sorted({name for errs in report.errors.values() for name in errs})
    notes = []
    for name in seen:
        why = _EXPECTED_ERRORS.get(name)
        if why is None:
            continue
        if report.killed_rank is not None and name in ("NotDelivered", "OutcomeUnknown",
                                                       "EngineDead"):
            why += f"; here: rank {report.killed_rank}, killed on purpose by --kill-one"
        notes.extend(textwrap.wrap(f"{name}: {why}", width=88, initial_indent="    ",
                                   subsequent_indent="      "))
    return notes


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


class _Progress:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = out.isatty()
        self.last = ""

    def show(self, line: str, *, final: bool = False) -> None:
        if self.tty:
            pad = max(0, len(self.last) - len(line))
            self.out.write("\r" + line + " " * pad + ("\n" if final else ""))
            self.out.flush()
        elif final or line.split("]")[0] != self.last.split("]")[0]:
            self.out.write(line + "\n")  # not a terminal: one line per cycle
        self.last = line


async def run_demo(cfg: DemoConfig, out: TextIO = sys.stdout) -> DemoReport:
    """Run the demo; returns its report (see :meth:`DemoReport.problems`)."""
    report = DemoReport()
    start = time.perf_counter()
    transport: ClientTransport
    router: ZmqRouterClientTransport | None = None
    fleet: EngineFleet | None = None
    keys = tempfile.TemporaryDirectory(prefix="ctlwire-demo-keys-")
    engine_args: list[str] = []
    if cfg.connect:
        transport = ZmqDealerClientTransport(cfg.connect,
                                             allow_insecure_tcp=cfg.allow_insecure_tcp)
        n = len(cfg.connect)
        report.address = ", ".join(cfg.connect)
    elif cfg.transport == "tcp":
        # tcp is CURVE-encrypted, each rank bound to its own key
        n = cfg.engines
        _, server_secret = write_keypair(keys.name, "server")
        ranks = {}
        for r in range(n):
            public, _ = write_keypair(keys.name, f"rank{r}")
            ranks[r] = load_public_key(public)
        curve = CurveServerConfig.allowing(load_keypair(server_secret), ranks=ranks)
        transport = router = ZmqRouterClientTransport("tcp://127.0.0.1:0", curve=curve)
        engine_args = ["--curve-server-key", str(Path(keys.name) / "server.key")]
    else:
        transport = router = ZmqRouterClientTransport()
        n = cfg.engines

    def args_for(rank: int, address: str) -> list[str]:
        curve = (["--curve-secret", str(Path(keys.name) / f"rank{rank}.key_secret"),
                  *engine_args] if engine_args else [])
        return ["--connect", address, "--methods",
                "ctlwire.kernel.app.operation_engine:register", *curve]

    # callers queue behind the slow update (it blocks every engine for slow_update s)
    client = ControlClient(transport, ranks=n, default_timeout=cfg.timeout + 2 * cfg.slow_update)
    try:
        async with client:
            if router is not None:
                addr = router.address  # bound by now (a tcp port is known)
                report.address = addr
                fleet = EngineFleet(n, lambda r: args_for(r, addr))
                out.write(f"starting {n} engine processes over {addr} ...\n")
                await anyio.to_thread.run_sync(fleet.start)
            await client.wait_ready(timeout=30.0)
            pids = list(fleet.pids().values()) if fleet else "-"
            out.write(f"{n} engines ready (pids {pids}); {cfg.cycles} weight-update cycles, "
                      f"{cfg.info_callers} get_server_info callers (queueing), "
                      f"{cfg.load_callers} get_load callers (watching)\n")
            await _drive(cfg, client, fleet, report, _Progress(out))
            report.metrics = client.metrics()
    finally:
        # engines stop after the client has closed: nobody is left to report them lost
        if fleet is not None:
            await anyio.to_thread.run_sync(fleet.stop)
        keys.cleanup()
    report.watch_joins = client.mailbox("get_load").watch_joins
    report.wall_seconds = time.perf_counter() - start
    return report


def _record(report: DemoReport, method: str, seconds: float) -> None:
    report.latencies[method].append(seconds)


_UNDO_FAILED = re.compile(r"undo of .*? failed: (.*)", re.S)


def error_name(detail: str) -> str:
    """The exception type a rank report's ``detail`` names: ``"Type: message"``,
    also inside ``"undo of 'step' failed: Type: message"`` (a compensation that
    failed on a dead rank fails with the same typed error as the step did)."""
    if not detail:
        return "Unknown"
    undo = _UNDO_FAILED.match(detail)
    if undo is not None:
        detail = undo.group(1)
    return detail.split(":")[0].split()[-1] if detail.split(":")[0].split() else "Unknown"


def _count_error(report: DemoReport, method: str, exc: BaseException) -> None:
    errs = report.errors[method]
    name = type(exc).__name__
    errs[name] = errs.get(name, 0) + 1


async def _drive(cfg: DemoConfig, client: ControlClient, fleet: EngineFleet | None,
                 report: DemoReport, progress: _Progress) -> None:
    ranks = list(client.ranks)
    done = anyio.Event()
    arrivals = itertools.count()
    served: dict[int, list[tuple[int, int]]] = defaultdict(list)  # rank -> (arrival, seq)
    cycle = [0]
    kill_at = max(1, cfg.cycles // 3) if cfg.kill_one and fleet is not None else None
    killed: dict[str, float] = {}
    fault_at = max(1, cfg.cycles // 2) if cfg.fault else None
    fault_rank = [-1]
    runner = OperationRunner(client)

    async def timed(method: str, coro: Any) -> Any:
        t = time.perf_counter()
        try:
            return await coro
        finally:
            _record(report, method, time.perf_counter() - t)

    async def rl_cycles() -> None:
        try:
            version = 0
            for k in range(1, cfg.cycles + 1):
                cycle[0] = k
                if kill_at == k and fleet is not None:
                    victim = ranks[-1]
                    report.killed_rank = victim
                    killed["t"] = time.perf_counter()
                    fleet.kill(victim, signal.SIGKILL)
                if fault_at == k:
                    fault_rank[0] = ranks[len(ranks) // 2]
                    await client.call("arm_fault", Fault("update_weights"), rank=fault_rank[0])
                    report.fault = f"rank {fault_rank[0]} update_weights raises in cycle {k}"
                slow = cfg.slow_update if k == cfg.cycles else 0.0
                lost_before = client.counters["engine_lost"]
                for _attempt in range(2):  # a cycle broken by the killed rank: once more
                    version, retry = await weight_update(k, version, fault_at == k, slow)
                    if not retry:
                        break
                else:
                    report.cycle_failures.append(f"cycle {k}: failed again without the "
                                                 f"killed rank")
                if slow:
                    report.slow_lost = client.counters["engine_lost"] - lost_before
                await anyio.sleep(cfg.train_seconds)  # the trainer's step between updates
        finally:
            report.quarantined = sorted(runner.quarantined)
            done.set()

    async def weight_update(k: int, version: int, faulty: bool,
                            slow: float = 0.0) -> tuple[int, bool]:
        """One cycle as one operation; (the fleet's version after it, retry?)."""
        plan = weight_update_plan(k, version, timeout=cfg.timeout, load_seconds=slow)
        methods = {s.name: s.method for s in plan.steps}
        started: dict[str, float] = {}
        waiting: dict[str, set[int]] = defaultdict(set)

        def on_progress(ev: ProgressEvent) -> None:  # per-step latency, as fan-outs had
            if ev.phase != "apply" or ev.step not in methods:  # steps, not the post-condition
                return
            if ev.state is RankState.APPLYING:
                started.setdefault(ev.step, time.perf_counter())
                waiting[ev.step].add(ev.rank)
            elif ev.rank in waiting[ev.step]:
                waiting[ev.step].discard(ev.rank)
                if not waiting[ev.step]:
                    _record(report, methods[ev.step], time.perf_counter() - started[ev.step])

        targets = [r for r in runner.routable_ranks() if not client.peers.is_lost(r)]
        result = await runner.run(plan, ranks=targets, on_progress=on_progress)
        ops = report.operations
        ops[result.state.value] = ops.get(result.state.value, 0) + 1
        for rank in result.failed_ranks:
            rep = result.ranks[rank]
            step = (rep.failed_step or "").split(":")[0]
            errs = report.errors[methods.get(step, step)]
            name = error_name(rep.detail)
            errs[name] = errs.get(name, 0) + 1
        if result.ok:
            for rank in result.committed:
                report.final_versions[rank] = k
            return k, False
        report.aborted.append(result.summary())
        if faulty:
            infos = await client.fan_out("get_server_info", -1, ranks=targets,
                                         mode="concurrent")
            back = {r: (v["version"], v["paused"]) for r, v in infos.results.items()}
            report.fault_verified = (result.failed_ranks == (fault_rank[0],)
                                     and result.compensated == tuple(targets)
                                     and back == {r: (version, False) for r in targets})
            report.fault += (f" -> {result.state.value}, compensated "
                             f"{list(result.compensated)}, (version, paused) after {back}")
            return version, False
        dead = report.killed_rank
        if dead is not None and set(result.failed_ranks) == {dead}:
            if dead not in runner.quarantined:  # dead: out of routing from now on
                rep = result.ranks[dead]
                runner.quarantine(dead, result.op_id, rep.failed_step or "", rep.detail)
            return version, True
        report.cycle_failures.append(f"cycle {k}: {result.summary()}")
        return version, False

    async def info_caller() -> None:
        while not done.is_set():
            idx = next(arrivals)  # no await until the mailbox admits: arrival order
            try:
                res = await timed("get_server_info",
                                  client.fan_out("get_server_info", idx))
            except CtlwireError as exc:
                _count_error(report, "get_server_info", exc)
                continue
            for rank, info in res.results.items():
                served[rank].append((idx, int(info["seq"])))
            for err in res.errors.values():
                _count_error(report, "get_server_info", err)

    async def load_caller() -> None:
        while not done.is_set():
            try:
                res = await timed("get_load", client.fan_out("get_load", mode="watching"))
            except CtlwireError as exc:
                _count_error(report, "get_load", exc)
                continue
            for err in res.errors.values():
                _count_error(report, "get_load", err)

    async def watch_death() -> None:
        while not done.is_set():
            victim = report.killed_rank
            if victim is not None and "t" in killed and client.peers.is_lost(victim):
                report.detection_seconds = time.perf_counter() - killed["t"]
                return
            await anyio.sleep(0.005)

    async def show_progress() -> None:
        while True:
            m = client.metrics()
            calls = sum(len(v) for v in report.latencies.values())
            dead = (f" | rank {report.killed_rank} dead, detected in "
                    f"{report.detection_seconds:.2f} s" if report.detection_seconds else "")
            for op in runner.progress().values():
                dead += " | " + step_summary(op["step"], op["ranks"])
            loading = []
            for rank in ranks:
                status = client.rank_status(rank)
                if status["progress"] >= 0 and status["method"] == "update_weights":
                    fraction = float(status["progress"])
                    best = report.slow_progress.get(rank, 0.0)
                    report.slow_progress[rank] = max(best, fraction)
                    loading.append(f"{rank}:{fraction:4.0%}")
                if status["state"] == "BUSY" and cycle[0] == cfg.cycles and cfg.slow_update:
                    report.slow_busy.add(rank)
            if loading:
                dead += " | loading weights " + " ".join(loading)
            progress.show(f"[cycle {cycle[0]:>3}/{cfg.cycles}] calls {calls:>6} | "
                          f"info {len(report.latencies['get_server_info']):>5} | "
                          f"load {len(report.latencies['get_load']):>5} | "
                          f"live {m['live_requests']:>3} | queue "
                          f"{client.mailbox('get_server_info').depth:>2}{dead}")
            if done.is_set():
                return
            await anyio.sleep(0.1)

    progress.last = ""
    async with anyio.create_task_group() as tg:
        tg.start_soon(rl_cycles)
        for _ in range(cfg.info_callers):
            tg.start_soon(info_caller)
        for _ in range(cfg.load_callers):
            tg.start_soon(load_caller)
        if kill_at is not None:
            tg.start_soon(watch_death)
        tg.start_soon(show_progress)
    if progress.tty:
        progress.show(progress.last, final=True)

    for rank, pairs in served.items():
        seqs = [seq for _, seq in sorted(pairs)]
        report.fifo_checked += len(seqs)
        if any(b <= a for a, b in itertools.pairwise(seqs)):
            report.fifo_violations.append(f"rank {rank}: get_server_info served out of order")


def format_report(cfg: DemoConfig, report: DemoReport) -> str:
    m = report.metrics
    reg = m.get("replies_dropped", {})
    lines = ["", "ctlwire demo — summary", ""]
    lines.append(f"  {'method':<18}{'calls':>8}{'p50 ms':>10}{'p99 ms':>10}  errors")
    for method in ("pause", "update_weights", "resume", "get_server_info", "get_load"):
        lat = report.latencies.get(method, [])
        errs = report.errors.get(method) or {}
        err_s = ", ".join(f"{k} {v}" for k, v in sorted(errs.items())) or "0"
        lines.append(f"  {method:<18}{len(lat):>8}{_pct(lat, 0.5) * 1e3:>10.2f}"
                     f"{_pct(lat, 0.99) * 1e3:>10.2f}  {err_s}")
    notes = expected_error_notes(cfg, report)
    if notes:
        lines.append("")
        lines.append("  expected errors (the demo injects these failures on purpose):")
        lines.extend(notes)
    lines.append("")
    fifo = ("verified" if not report.fifo_violations else "VIOLATED")
    lines.append(f"  FIFO order (get_server_info, queueing mailbox): {fifo} over "
                 f"{report.fifo_checked} rank-replies")
    lines.append(f"  watching mode (get_load): {report.watch_joins} callers shared an "
                 "in-flight request")
    lines.append(f"  replies dropped: late {reg.get('late', 0)}, duplicate "
                 f"{reg.get('duplicate', 0)}, unknown {reg.get('unknown', 0)}, stale incarnation "
                 f"{reg.get('stale_incarnation', 0)}")
    lines.append(f"  requests: {m.get('registered', 0)} registered, {m.get('cleaned', 0)} "
                 f"cleaned; live registry entries: {m.get('live_requests')} "
                 f"(tombstones {m.get('tombstones')})")
    killed = (f" (rank {report.killed_rank} was killed, so it stays behind)"
              if report.killed_rank is not None else "")
    lines.append(f"  weight versions at the end: {dict(sorted(report.final_versions.items()))}"
                 f"{killed}")
    ops = ", ".join(f"{n} {state}" for state, n in sorted(report.operations.items()))
    lines.append(f"  operations (pause -> update_weights -> resume): {ops or 'none'}")
    for summary in report.aborted:
        lines.append(f"    not committed: {summary}")
    if report.aborted and report.killed_rank is not None:
        lines.append(f"    (rank {report.killed_rank}'s death broke a cycle: it was undone and "
                     "retried on the live ranks)")
    if report.fault:
        verdict = "verified" if report.fault_verified else "NOT verified"
        lines.append(f"  injected fault: {report.fault}: compensation {verdict}")
    if report.quarantined:
        lines.append(f"  quarantined ranks (out of routing): {report.quarantined}")
    if cfg.slow_update > 0 and report.slow_progress:
        seen = " ".join(f"{r}:{f:.0%}" for r, f in sorted(report.slow_progress.items()))
        lines.append(f"  slow update_weights ({cfg.slow_update:g} s blocking each engine, on "
                     "purpose: the update_weights p99 above): "
                     f"progress seen live {seen}; busy ranks {sorted(report.slow_busy)}, "
                     f"lost {report.slow_lost}")
    if report.killed_rank is not None:
        det = (f"{report.detection_seconds:.2f} s" if report.detection_seconds is not None
               else "never")
        lines.append(f"  engine death: rank {report.killed_rank} killed with SIGKILL, "
                     f"EngineDead after {det}; the other ranks kept serving")
    diagrams = Path(__file__).resolve().parents[2] / "diagrams"
    where = diagrams if (diagrams / "README.md").exists() else "run 'ctlwire diagrams'"
    lines.append(f"  state diagrams: {where}")
    lines.append(f"  wall time {report.wall_seconds:.1f} s on {os.cpu_count()} cores, "
                 f"Python {platform.python_version()}, backend {cfg.backend}")
    problems = report.problems(cfg)
    lines.append("")
    lines.append("  OK: every invariant holds" if not problems
                 else "  FAILED:\n" + "\n".join(f"    - {p}" for p in problems))
    return "\n".join(lines) + "\n"


def main(cfg: DemoConfig, json_path: str | None = None, out: TextIO = sys.stdout) -> int:
    report = anyio.run(run_demo, cfg, out, backend=cfg.backend)
    out.write(format_report(cfg, report))
    if json_path:
        data = {
            "latency_ms": {k: {"calls": len(v), "p50": _pct(v, 0.5) * 1e3,
                               "p99": _pct(v, 0.99) * 1e3} for k, v in report.latencies.items()},
            "errors": report.errors,
            "fifo_checked": report.fifo_checked,
            "problems": report.problems(cfg),
            "detection_seconds": report.detection_seconds,
            "metrics": report.metrics,
        }
        Path(json_path).write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    return 0 if not report.problems(cfg) else 1


def add_arguments(p: Any) -> None:
    p.add_argument("--engines", type=positive_int, default=4, metavar="N",
                   help="engine processes to start (4)")
    p.add_argument("--cycles", type=positive_int, default=20, metavar="K",
                   help="weight-update cycles (20)")
    p.add_argument("--transport", choices=["ipc", "tcp"], default="ipc")
    p.add_argument("--connect", nargs="+", default=[], metavar="ADDR",
                   help="drive engines already running elsewhere, one ROUTER address per rank")
    p.add_argument("--allow-insecure-tcp", action="store_true",
                   help="--connect to tcp addresses without CURVE (any local process could "
                        "speak for a rank)")
    p.add_argument("--kill-one", action="store_true", help="SIGKILL one engine mid-run")
    p.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    p.add_argument("--fault", choices=["update"], default="",
                   help="update: one rank's update_weights raises mid-run (compensated)")
    p.add_argument("--slow-update", type=non_negative_float, default=2.0, metavar="SECONDS",
                   help="the last cycle's update_weights blocks each engine this long, "
                        "reporting progress (2; 0 turns it off)")
    p.add_argument("--json", metavar="PATH", help="also write the summary as JSON here")


def from_args(args: Any) -> DemoConfig:
    return DemoConfig(engines=args.engines, cycles=args.cycles, transport=args.transport,
                      connect=list(args.connect), allow_insecure_tcp=args.allow_insecure_tcp,
                      kill_one=args.kill_one, backend=args.backend,
                      fault=args.fault, slow_update=args.slow_update)
