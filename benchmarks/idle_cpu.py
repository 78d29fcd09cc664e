"""What watching costs: ``ctlwire bench --only idle_cpu``.

An idle client (no calls: heartbeats only) connected to 8, 64, 256 and 1,024
engine ranks, hosted 64 a process by :mod:`ctlwire.benchmarks.multi_rank_engine`
(the last two ranks alone in a process each), each process's ranks sharing one
beacon (one message a beat); and 256 ranks again with a beacon per rank (the
heartbeat traffic of 256 single-rank engine processes). A fresh client process
of its own per size (``python -m ctlwire.benchmarks.idle_cpu client ...``)
waits until every rank is heard from, settles, then reports its process CPU
time (every thread: the event loop's and libzmq's) over ``seconds`` of wall
time, and the heartbeats it received meanwhile; then counts its Python calls per
heartbeat received for a second (:mod:`.call_counter`: exact, whatever the load,
and slowing the loop, so after the timing). Then it kills the last rank
(``SIGKILL``) and times until it is Lost, freezes the rank before it
(``SIGSTOP``: its connections stay up, only its heartbeats stop), times until
it is Lost, and thaws it (``SIGCONT``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import anyio

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

from .call_counter import CallCounter

__all__ = ["GROUPS", "IdlePoint", "main", "run_group"]

GROUPS = ("idle_cpu",)
POINTS = ((8, True), (64, True), (256, True), (256, False), (1024, True))
"""(ranks, whether a process's ranks share one beacon); ``--quick`` runs all but 1,024"""
#: the target of each size's idle CPU (shared beacons), in % of a core
CPU_TARGETS = {256: 2.0, 1024: 5.0}
RANKS_PER_PROCESS = 64


@dataclass
class IdlePoint:
    ranks: int
    processes: int
    shared_beacon: bool
    cpu_pct: float
    heartbeats_per_s: float
    py_calls_per_heartbeat: float
    heartbeats_per_message: float
    frozen_s: float | None
    killed_s: float | None
    others_lost: int


async def _wait_state(client: ControlClient, rank: int, lost: bool, limit: float
                      ) -> float | None:
    """Seconds until ``rank`` is Lost (``lost``) or live again; None past ``limit``."""
    start = anyio.current_time()
    with anyio.move_on_after(limit):
        while (client.peers.is_lost(rank)) != lost:
            await anyio.sleep(0.002)
        return anyio.current_time() - start
    return None


async def _client(address: str, ranks: int, seconds: float, killed_pid: int,
                  frozen_pid: int) -> dict[str, Any]:
    transport = ZmqRouterClientTransport(address)
    async with ControlClient(transport, ranks=ranks, default_timeout=30.0) as ctl:
        await ctl.wait_ready(timeout=60)
        await anyio.sleep(1.0)
        received0 = ctl.counters.get("heartbeats_received", 0)
        messages0 = transport.counters["received"]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        await anyio.sleep(seconds)
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        received = ctl.counters.get("heartbeats_received", 0) - received0
        messages = transport.counters["received"] - messages0
        counted0 = ctl.counters.get("heartbeats_received", 0)
        with CallCounter() as counter:  # after the timing: counting slows the loop down
            await anyio.sleep(1.0)
        counted = ctl.counters.get("heartbeats_received", 0) - counted0
        lost0 = ctl.counters.get("engine_lost", 0)
        os.kill(killed_pid, signal.SIGKILL)
        killed = await _wait_state(ctl, ranks - 1, True, 10.0)
        os.kill(frozen_pid, signal.SIGSTOP)
        try:
            frozen = await _wait_state(ctl, ranks - 2, True, 10.0)
        finally:
            os.kill(frozen_pid, signal.SIGCONT)
        await _wait_state(ctl, ranks - 2, False, 15.0)
        await anyio.sleep(0.3)
        lost = ctl.counters.get("engine_lost", 0) - lost0
        return {"cpu_pct": 100.0 * cpu / wall, "heartbeats_per_s": received / wall,
                "heartbeats_per_message": received / max(messages, 1),
                "py_calls_per_heartbeat": counter.counts.py_calls / max(counted, 1),
                "frozen_s": frozen, "killed_s": killed,
                "others_lost": max(0, lost - (frozen is not None) - (killed is not None))}


def layout(ranks: int) -> list[tuple[int, int]]:
    """``(first rank, count)`` per process: 64 ranks a process, the last two ranks
    alone (the one to freeze, then the one to kill)."""
    hosted = ranks - 2
    out = [(first, min(RANKS_PER_PROCESS, hosted - first))
           for first in range(0, hosted, RANKS_PER_PROCESS)]
    return [*out, (ranks - 2, 1), (ranks - 1, 1)]


def fleet(address: str, ranks: int, shared_beacon: bool = True) -> EngineFleet:
    from .fleets import ModuleFleet

    procs = layout(ranks)
    beacon = "shared" if shared_beacon else "per-rank"
    return ModuleFleet("ctlwire.benchmarks.multi_rank_engine", len(procs), lambda i: [
        "--first", str(procs[i][0]), "--count", str(procs[i][1]), "--connect", address,
        "--beacon", beacon], ready_timeout=90.0)


def measure(address: str, ranks: int, killed_pid: int, frozen_pid: int, seconds: float,
            python: str = sys.executable) -> dict[str, Any]:
    """One client process's measurement (see the module docstring)."""
    argv = [python, "-m", "ctlwire.benchmarks.idle_cpu", "client", "--connect", address,
            "--ranks", str(ranks), "--seconds", str(seconds), "--killed-pid", str(killed_pid),
            "--frozen-pid", str(frozen_pid)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            data: dict[str, Any] = json.loads(line[len("RESULT "):])
            return data
    raise RuntimeError(f"idle_cpu client ({ranks} ranks) failed: {proc.stderr[-2000:]}")


def rows(points: Sequence[IdlePoint]) -> list[Any]:
    from .report import Row, Target

    out = []
    for pt in points:
        per_rank = "" if pt.shared_beacon else ", a beacon per rank"
        out.append(Row(
            "idle_cpu", f"idle client CPU, {pt.ranks} ranks ({pt.processes} processes{per_rank})",
            "%", pt.cpu_pct, None, "-", pt.cpu_pct, "process CPU time / wall time, in % of a core",
            Target("<=", CPU_TARGETS[pt.ranks], f"<= {CPU_TARGETS[pt.ranks]:g} %")
            if pt.ranks in CPU_TARGETS and pt.shared_beacon else Target("info"),
            {"heartbeats_received_per_s": round(pt.heartbeats_per_s),
             "cpu_us_per_heartbeat": round(pt.cpu_pct * 1e4 / pt.heartbeats_per_s, 1)
             if pt.heartbeats_per_s else None,
             "py_calls_per_heartbeat": round(pt.py_calls_per_heartbeat, 1),
             "heartbeats_per_message": round(pt.heartbeats_per_message, 1)}, ratio_unit=" %"))
        for what, value in (("kill -9", pt.killed_s), ("SIGSTOP", pt.frozen_s)):
            seconds = math.inf if value is None else value
            out.append(Row(
                "idle_cpu", f"{what} of 1 rank among {pt.ranks}{per_rank}: time to Lost", "s",
                seconds,
                None, "-", seconds, f"seconds from {what} to Lost",
                Target("<=", 1.5, "<= 1.5 s"), {"other_ranks_lost": pt.others_lost},
                ratio_unit=" s"))
    return out


def run_group(pool: Any, p: Any) -> list[Any]:
    """Each size in turn: its fleet, one client process, the fleet stopped."""
    seconds = 1.5 if p.quick else 10.0
    points = []
    for ranks, shared in POINTS:
        if p.quick and ranks > 256:
            continue
        name = f"idle{ranks}{'' if shared else 'r'}"
        f = pool.custom(name, lambda address, n=ranks, s=shared: fleet(address, n, s))
        pool.start(name)
        data = measure(pool.address(name), ranks, f.engines[f.ranks[-1]].pid,
                       f.engines[f.ranks[-2]].pid, seconds)
        points.append(IdlePoint(ranks, len(f.ranks), shared, data["cpu_pct"],
                                data["heartbeats_per_s"],
                                data["py_calls_per_heartbeat"],
                                data["heartbeats_per_message"], data["frozen_s"],
                                data["killed_s"], data["others_lost"]))
        pool.stop(name)
    return rows(points)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ctlwire.benchmarks.idle_cpu")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("client", help="one idle client's measurement (prints RESULT {json})")
    c.add_argument("--connect", required=True)
    c.add_argument("--ranks", type=int, required=True)
    c.add_argument("--seconds", type=float, default=10.0)
    c.add_argument("--killed-pid", type=int, required=True, help="the last rank's process")
    c.add_argument("--frozen-pid", type=int, required=True, help="the one before it's")
    args = p.parse_args(argv)
    data = anyio.run(_client, args.connect, args.ranks, args.seconds, args.killed_pid,
                     args.frozen_pid)
    print("RESULT " + json.dumps(data), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
