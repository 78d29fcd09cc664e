"""``ctlwire demo``: the asynchronous-RL weight-update cycle against real engine processes.

Starts N engine processes (:mod:`ctlwire.app.demo_engine`, each a
synchronous step loop polling its :class:`EngineEndpoint`) over real ZeroMQ
sockets, then runs ``pause → update_weights(v) → resume`` K times, each cycle one
coordinated operation (:class:`~ctlwire.kernel.operations.runner.OperationRunner`,
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
import re
import signal
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, TextIO

import anyio

from ctlwire.app.arguments import UsageError, non_negative_float, positive_int
from ctlwire.app.demo_report import DemoConfig, DemoReport, format_report, report_data
from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.app.operation_engine import Fault, weight_update_plan
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.operation_result import ProgressEvent
from ctlwire.kernel.errors import CtlwireError, RequestTimedOut
from ctlwire.kernel.operations.runner import OperationRunner
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



def step_summary(step: str, ranks: dict[int, str]) -> str:
    """A running operation step for the progress line: ``"step pause: 3 ranks applying"``."""
    states: dict[str, int] = defaultdict(int)
    for state in ranks.values():
        states[state] += 1
    return f"step {step}: " + ", ".join(
        f"{n} {'rank' if n == 1 else 'ranks'} {state}" for state, n in sorted(states.items()))


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
                                             allow_insecure_tcp=cfg.allow_insecure_tcp,
                                             allow_abstract_ipc=cfg.allow_abstract_ipc)
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
                "ctlwire.app.operation_engine:register", *curve]

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
            try:
                await client.wait_ready(timeout=cfg.ready_timeout)
            except RequestTimedOut as exc:
                if not cfg.connect:
                    raise
                raise UsageError(f"--connect {' '.join(cfg.connect)}: no engine answered "
                                 f"within {cfg.ready_timeout:g} s ({exc}); is an engine "
                                 "serving there?") from None
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


def main(cfg: DemoConfig, json_path: str | None = None, out: TextIO = sys.stdout) -> int:
    report = anyio.run(run_demo, cfg, out, backend=cfg.backend)
    out.write(format_report(cfg, report))
    if json_path:
        Path(json_path).write_text(json.dumps(report_data(cfg, report), indent=2, default=str),
                                   encoding="utf-8")
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
    p.add_argument("--allow-abstract-ipc", action="store_true",
                   help="--connect to abstract ipc names (ipc://@name: any local process "
                        "could speak for a rank)")
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
                      allow_abstract_ipc=args.allow_abstract_ipc,
                      kill_one=args.kill_one, backend=args.backend,
                      fault=args.fault, slow_update=args.slow_update)
