"""The fault matrix: ctlwire's guarantees, measured under each kind of fault.

One fleet of 4 engine processes over ZeroMQ ipc serves every scenario; each
scenario gets a fresh :class:`ControlClient` whose transport is wrapped in a
:class:`~ctlwire.testing.faults.FaultyClientTransport`, and runs
concurrent traffic (``echo`` calls, every 100th a ``fail`` that must come back
as RemoteError, every 500th an ``echo`` fan-out to all ranks):

============== ===============================================================
baseline       no faults (the plain ZeroMQ transport)
drop 1%        1% of frames lost, both ways, heartbeats included
duplicate 1%   1% of frames delivered twice, both ways
delay+reorder  10% of frames delayed 1-50 ms, 5% overtaken by the next frame
partition      rank 2 cut off (no frame either way) for 2 s, then healed
kill -9        rank 1 killed with SIGKILL, then restarted
hostile        hostile peers during traffic: a flood of junk frames, spoofed identities
               (``rank-00``, out-of-range ranks, ``beat-00``), forged replies (unknown ids,
               ids of live requests), and a thawed old incarnation (rank 3 SIGSTOPped,
               restarted as a new process, then SIGCONTed)
soak           :mod:`ctlwire.benchmarks.soak`: drops, duplicates, delays and a kill
============== ===============================================================

Each row: requests sent, outcomes by type, **lost** (a call without an
outcome by its deadline plus 5 s: must be 0), **leaked** (request-map entries
or queued callers left once idle: must be 0), unexpected outcome types (must
be 0), and for the partition and the kill the time until the client declared
the rank dead (must be under 3 s; the liveness bound is ~1 s) and until it
rejoined. ``quick`` runs 2,000 calls a scenario and the 5,000-call soak
(well under a minute); the full form 20,000 and the 100,000-call soak.

:func:`main` prints the matrix (and writes JSON); it returns non-zero when
anything was lost, leaked or unexpected, or a death went undetected.
"""

from __future__ import annotations

import json
import os
import platform
import random
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio
import zmq

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.benchmarks.soak import (
    DETECTION_BOUND,
    SoakConfig,
    SoakReport,
    fleet_for,
    soak_on,
)
from ctlwire.benchmarks.traffic import (
    EXPECTED,
    Tally,
    Workload,
    accounting_problems,
    drive,
    leaked_entries,
    private_dir,
    wait_live,
    wait_lost,
)
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.testing.faults import Fault, FaultPlan, FaultyClientTransport
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Heartbeat, Reply
from ctlwire.transports.transport import ClientTransport
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

__all__ = [
    "ReliabilityReport",
    "ScenarioRow",
    "format_report",
    "main",
    "run_reliability",
    "to_json",
]

ENGINES = 4
WORKERS = 128
PARTITION_RANK = 2
KILL_RANK = 1
THAW_RANK = 3
FORGED = "FORGED"
PARTITION_SECONDS = 2.0


@dataclass
class ScenarioRow:
    """One scenario's figures; :meth:`problems` lists what breaks a guarantee."""

    scenario: str
    description: str
    sent: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    unexpected: dict[str, int] = field(default_factory=dict)
    samples: list[str] = field(default_factory=list)
    lost: int = 0
    leaked: int = 0
    detection: str = ""
    """What was detected: "engine death", "partition" or "" (nothing to detect)."""
    detection_s: float | None = None
    rejoin_s: float | None = None
    wall_s: float = 0.0
    calls_per_s: float = 0.0
    late: int = 0
    duplicate: int = 0
    stale: int = 0
    injected: dict[str, int] = field(default_factory=dict)
    hostile: bool = False
    # calls whose result was a forged reply's (must be 0)
    forged_accepted: int = 0
    # engine processes that died without the scenario killing them (must be 0)
    crashed: int = 0
    # times an older incarnation was admitted again after a newer one (must be 0)
    readmitted: int = 0
    # what the client dropped and counted (hostile row)
    dropped: dict[str, int] = field(default_factory=dict)

    def problems(self) -> list[str]:
        out = accounting_problems(self.sent, self.outcomes, self.unexpected, self.lost,
                                  self.leaked, self.samples)
        if self.forged_accepted:
            out.append(f"{self.forged_accepted} forged results accepted")
        if self.crashed:
            out.append(f"{self.crashed} engine processes crashed")
        if self.readmitted:
            out.append(f"an old incarnation was admitted again {self.readmitted} times")
        if self.detection:
            if self.detection_s is None or self.detection_s > DETECTION_BOUND:
                out.append(f"{self.detection} detected after {self.detection_s} s "
                           f"(bound {DETECTION_BOUND} s)")
            if self.rejoin_s is None:
                out.append("never rejoined")
        return out


@dataclass
class ReliabilityReport:
    quick: bool
    rows: list[ScenarioRow] = field(default_factory=list)
    wall_s: float = 0.0
    python: str = field(default_factory=platform.python_version)
    machine: str = field(default_factory=platform.platform)

    @property
    def lost(self) -> int:
        return sum(r.lost for r in self.rows)

    @property
    def leaked(self) -> int:
        return sum(r.leaked for r in self.rows)

    def problems(self) -> list[str]:
        return [f"{r.scenario}: {p}" for r in self.rows for p in r.problems()]


def _injected(transport: ClientTransport) -> dict[str, int]:
    if not isinstance(transport, FaultyClientTransport):
        return {}
    faults = transport.faults
    out = {a: faults.count(a) for a in ("drop", "duplicate", "delay", "reorder", "partition")}
    # copies delayed or duplicated that their link could no longer carry (not lost calls)
    out["undeliverable"] = faults.count("lost")
    return {k: v for k, v in out.items() if v}


Event = Callable[[ControlClient, ClientTransport, ScenarioRow], Awaitable[None]]


async def _scenario(address: str, row: ScenarioRow, plan: FaultPlan | None, work: Workload,
                    event: Event | None = None) -> ScenarioRow:
    # ZMTP heartbeats are off by default on every socket (with them on, libzmq 4.3.5
    # aborted the process under the hostile row's churn: #4364/#4767)
    inner = ZmqRouterClientTransport(address)
    transport: ClientTransport = inner if plan is None else FaultyClientTransport(inner, plan)
    tally = Tally()
    done = anyio.Event()
    async with ControlClient(transport, ranks=ENGINES, default_timeout=work.timeout) as client:
        await client.wait_ready(timeout=15.0)

        async def run_event() -> None:
            try:
                if event is not None:
                    await event(client, transport, row)
            finally:
                done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run_event)
            row.wall_s = await drive(client, work, tally, keep_going=lambda: not done.is_set())
        await anyio.sleep(0.25)  # stragglers: delayed and duplicated frames
        row.leaked = leaked_entries(client)
        stats = client.registry.stats
        row.late, row.duplicate = stats.late, stats.duplicate
        row.stale = client.counters["stale_incarnation"]
        if row.hostile:
            row.dropped = {k: v for k, v in client.counters.items()
                           if k.startswith("dropped_") and v}
            row.dropped["stray"] = stats.stray
            row.dropped["unknown"] = stats.unknown
            row.dropped["foreign_rank"] = client.peers.foreign
            row.dropped["fenced_incarnation"] = client.peers.fenced
        else:
            row.injected = _injected(transport)
    row.sent = tally.sent
    row.outcomes = {k: tally.outcomes[k] for k in EXPECTED if tally.outcomes[k]}
    row.unexpected = dict(tally.unexpected)
    row.samples = tally.samples
    row.lost = tally.lost
    row.forged_accepted = tally.forged
    row.calls_per_s = tally.sent / row.wall_s if row.wall_s else 0.0
    return row


async def _partition(client: ControlClient, transport: ClientTransport, row: ScenarioRow
                     ) -> None:
    assert isinstance(transport, FaultyClientTransport)
    await anyio.sleep(0.3)
    start = anyio.current_time()
    transport.partition(PARTITION_RANK)
    row.detection_s = await wait_lost(client, PARTITION_RANK, start)
    await anyio.sleep(max(0.0, start + PARTITION_SECONDS - anyio.current_time()))
    healed = anyio.current_time()
    transport.heal(PARTITION_RANK)
    row.rejoin_s = await wait_live(client, PARTITION_RANK, healed)


def _kill(fleet: EngineFleet) -> Event:
    async def kill(client: ControlClient, transport: ClientTransport, row: ScenarioRow) -> None:
        await anyio.sleep(0.3)
        start = anyio.current_time()
        await anyio.to_thread.run_sync(fleet.kill, KILL_RANK)
        row.detection_s = await wait_lost(client, KILL_RANK, start)
        restart = anyio.current_time()
        await anyio.to_thread.run_sync(fleet.restart, KILL_RANK)
        row.rejoin_s = await wait_live(client, KILL_RANK, restart)

    return kill


class _Attacker:
    """Hostile peers on the client's ROUTER, from a thread of their own: a flood
    of junk frames from 50 identities, spoofed identities (non-canonical
    ``rank-00``/``beat-00``/``rank-+1``, out-of-range ``rank-99``/``rank-7``/
    ``beat-77``) sending heartbeats and forged replies, both for ids never
    issued and for the ids of live requests (``live_ids``, fed by the loop)."""

    SPOOFS = (b"rank-00", b"beat-00", b"rank-99", b"rank-7", b"beat-77", b"rank-+1")

    def __init__(self, address: str) -> None:
        self.address = address
        self.stop = threading.Event()
        self.live_ids: deque[int] = deque(maxlen=64)
        self.counts = {"flood": 0, "spoofed": 0, "forged": 0}

    def run(self) -> None:
        codec = MsgpackCodec()
        forged = codec.encode_value(FORGED)
        rng = random.Random(11)
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        socks: list[tuple[bytes, zmq.Socket[bytes]]] = []
        try:
            for identity in (*self.SPOOFS, *(b"junk-%d" % i for i in range(50))):
                sock = ctx.socket(zmq.DEALER)
                sock.setsockopt(zmq.IDENTITY, identity)
                sock.setsockopt(zmq.LINGER, 0)
                sock.setsockopt(zmq.SNDHWM, 100)
                sock.connect(self.address)
                socks.append((identity, sock))
            while not self.stop.is_set():
                for identity, sock in socks:
                    try:
                        if identity.startswith(b"junk-"):
                            for _ in range(10):
                                sock.send(rng.randbytes(rng.randint(1, 64)), zmq.NOBLOCK)
                                self.counts["flood"] += 1
                            continue
                        claimed = rng.randrange(ENGINES)
                        sock.send(codec.encode(Heartbeat(claimed, 1 << 50, 1)), zmq.NOBLOCK)
                        self.counts["spoofed"] += 1
                        for rid in [*list(self.live_ids)[-8:], rng.getrandbits(62)]:
                            sock.send(codec.encode(Reply(rid, claimed, 1 << 50, True, forged)),
                                      zmq.NOBLOCK)
                            self.counts["forged"] += 1
                    except zmq.Again:
                        pass
                time.sleep(0.005)
        finally:
            for _, sock in socks:
                sock.close(0)
            ctx.term()


def _hostile(fleet: EngineFleet, address: str) -> Event:
    async def feed(client: ControlClient, attacker: _Attacker, seconds: float) -> None:
        end = anyio.current_time() + seconds
        while anyio.current_time() < end:  # forged replies for live requests' ids
            attacker.live_ids.extend(e.id for e in client.registry.live()[:16])
            await anyio.sleep(0.005)

    async def hostile(client: ControlClient, transport: ClientTransport, row: ScenarioRow
                      ) -> None:
        attacker = _Attacker(address)
        thread = threading.Thread(target=attacker.run, name="ctlwire-attacker", daemon=True)
        thread.start()
        old = fleet.engines[THAW_RANK]
        try:
            await feed(client, attacker, 1.0)
            # a frozen engine, replaced by a new process, then thawed
            os.kill(old.pid, signal.SIGSTOP)
            restart = anyio.current_time()
            await anyio.to_thread.run_sync(fleet.spawn, THAW_RANK)
            new = await anyio.to_thread.run_sync(fleet.await_ready, THAW_RANK)
            with anyio.move_on_after(15):  # the client admitted the new incarnation
                while client.peers.peers[THAW_RANK].incarnation != new.incarnation:
                    await anyio.sleep(0.005)
            row.rejoin_s = await wait_live(client, THAW_RANK, restart)
            os.kill(old.pid, signal.SIGCONT)
            end = anyio.current_time() + 1.5
            while anyio.current_time() < end:
                await feed(client, attacker, 0.05)
                if client.peers.peers[THAW_RANK].incarnation != new.incarnation:
                    row.readmitted += 1
        finally:
            attacker.stop.set()
            await anyio.to_thread.run_sync(thread.join)
            if old.alive:
                os.kill(old.pid, signal.SIGCONT)
                old.proc.terminate()
                await anyio.to_thread.run_sync(old.proc.wait, 10)
            row.injected = {k: v for k, v in attacker.counts.items() if v}
            row.injected["thawed"] = 1
        # the new incarnation serves rank 3 again once the old one is gone
        await wait_live(client, THAW_RANK, anyio.current_time())

    return hostile


def _soak_row(report: SoakReport) -> ScenarioRow:
    cfg = report.config
    row = ScenarioRow("soak", f"{cfg.calls:,} calls: {cfg.drop:.0%} drop, "
                              f"{cfg.duplicate:.0%} duplicate, {cfg.delay_probability:.0%} "
                              f"delayed, kill -9 rank 1 + restart", detection="engine death")
    row.sent, row.outcomes, row.unexpected = report.sent, report.outcomes, report.unexpected
    row.samples, row.lost, row.leaked = report.samples, report.lost, report.leaked
    row.detection_s, row.rejoin_s = report.kill_detection_s, report.rejoin_s
    row.wall_s, row.calls_per_s = report.wall_s, report.calls_per_s
    row.late, row.duplicate, row.stale = report.late, report.duplicate, report.stale
    row.injected = {a: sum(n for k, n in report.faults.items() if k.startswith(a + "."))
                    for a in ("drop", "duplicate", "delay")}
    row.injected["undeliverable"] = sum(n for k, n in report.faults.items()
                                        if k.startswith("lost."))
    return row


async def _matrix(address: str, fleet: EngineFleet, quick: bool,
                  progress: Callable[[ScenarioRow], None] | None) -> list[ScenarioRow]:
    calls = 2_000 if quick else 20_000
    seed = 1

    def work(timeout: float = 1.0) -> Workload:
        return Workload(calls, WORKERS, timeout, fail_every=100, fan_out_every=500)

    scenarios: list[tuple[ScenarioRow, FaultPlan | None, Workload, Event | None]] = [
        (ScenarioRow("baseline", "no faults"), None, work(), None),
        (ScenarioRow("drop 1%", "1% of frames lost, both ways, heartbeats too"),
         FaultPlan(seed=seed, faults=(Fault.drop(0.01),)), work(), None),
        (ScenarioRow("duplicate 1%", "1% of frames delivered twice, both ways"),
         FaultPlan(seed=seed, faults=(Fault.duplicate(0.01),)), work(), None),
        (ScenarioRow("delay+reorder", "10% of frames delayed 1-50 ms, 5% overtaken"),
         FaultPlan(seed=seed, faults=(Fault.delay(0.001, 0.05, probability=0.1),
                                      Fault.reorder(0.05, hold=0.01))), work(), None),
        (ScenarioRow("partition", f"rank {PARTITION_RANK} cut off both ways for "
                                  f"{PARTITION_SECONDS:g} s, then healed",
                     detection="partition"),
         FaultPlan(seed=seed), work(3.0), _partition),
        (ScenarioRow("kill -9", f"rank {KILL_RANK} killed (SIGKILL), then restarted",
                     detection="engine death"),
         None, work(3.0), _kill(fleet)),
        (ScenarioRow("hostile", "flood, spoofed identities, forged replies, rank "
                                f"{THAW_RANK} frozen, replaced and thawed", hostile=True),
         None, work(3.0), _hostile(fleet, address)),
    ]
    rows = []
    for row, plan, w, event in scenarios:
        rows.append(await _scenario(address, row, plan, w, event))
        # every engine process still runs (a scenario's own kills are restarted)
        rows[-1].crashed = sum(1 for e in fleet.engines.values() if not e.alive)
        if progress is not None:
            progress(rows[-1])
    soak = await soak_on(address, fleet, SoakConfig.quick() if quick else SoakConfig())
    rows.append(_soak_row(soak))
    if progress is not None:
        progress(rows[-1])
    return rows


def run_reliability(quick: bool = True, *, backend: str = "asyncio",
                    progress: Callable[[ScenarioRow], None] | None = None
                    ) -> ReliabilityReport:
    """Run the fault matrix against 4 fresh engine processes; see the module docstring."""
    report = ReliabilityReport(quick)
    start = time.perf_counter()
    with private_dir("ctlwire-reliability-") as d:
        address = f"ipc://{d}/control.sock"
        with fleet_for(address, ENGINES) as fleet:
            report.rows = anyio.run(_matrix, address, fleet, quick, progress, backend=backend)
    report.wall_s = time.perf_counter() - start
    return report


_COLUMNS = ("ok", "RemoteError", "RequestTimedOut", "EngineDead", "FanOutFailed")
_SHORT = {"RemoteError": "Remote", "RequestTimedOut": "TimedOut", "EngineDead": "Dead",
          "FanOutFailed": "FanOutF"}


def _secs(v: float | None, wanted: bool) -> str:
    if not wanted:
        return "-"
    return "never" if v is None else f"{v:.3f}"


def format_report(report: ReliabilityReport) -> str:
    """The matrix as a text table, then what was injected and counted per scenario."""
    head = (f"{'scenario':<14} {'sent':>7} " + " ".join(f"{_SHORT.get(c, c):>8}" for c in _COLUMNS)
            + f" {'unexp':>5} {'lost':>4} {'leaked':>6} {'detect s':>8} {'rejoin s':>8}"
            f" {'calls/s':>8}")
    lines = [f"ctlwire reliability matrix ({'quick' if report.quick else 'full'}): "
             f"{ENGINES} engine processes over ZeroMQ ipc, {WORKERS} concurrent callers, "
             f"Python {report.python}", head, "-" * len(head)]
    for r in report.rows:
        lines.append(
            f"{r.scenario:<14} {r.sent:>7} "
            + " ".join(f"{r.outcomes.get(c, 0):>8}" for c in _COLUMNS)
            + f" {sum(r.unexpected.values()):>5} {r.lost:>4} {r.leaked:>6}"
            f" {_secs(r.detection_s, bool(r.detection)):>8}"
            f" {_secs(r.rejoin_s, bool(r.detection)):>8} {r.calls_per_s:>8,.0f}")
    lines.append("")
    lines.append("scenario       what was injected / what the client counted")
    for r in report.rows:
        inj = ", ".join(f"{k} {v}" for k, v in r.injected.items() if v) or "nothing"
        det = f"; {r.detection} detected" if r.detection else ""
        lines.append(f"{r.scenario:<14} {r.description}: injected {inj}; replies late {r.late},"
                     f" duplicate {r.duplicate}, stale {r.stale}{det}")
        if r.hostile:
            dropped = ", ".join(f"{k} {v}" for k, v in r.dropped.items() if v)
            lines.append(f"{'':<14} forged results accepted {r.forged_accepted}, lost {r.lost},"
                         f" leaked {r.leaked}, processes crashed {r.crashed}, old incarnation "
                         f"re-admitted {r.readmitted}; "
                         f"dropped and counted: {dropped}")
    problems = report.problems()
    lines.append("")
    lines.append(f"total: {sum(r.sent for r in report.rows):,} requests, lost {report.lost}, "
                 f"leaked {report.leaked}, in {report.wall_s:.1f} s — "
                 + ("OK" if not problems else "PROBLEMS:\n  " + "\n  ".join(problems)))
    return "\n".join(lines)


def to_json(report: ReliabilityReport) -> dict[str, Any]:
    """The report as plain data (``json.dump``-able)."""
    data = asdict(report)
    data["lost"] = report.lost
    data["leaked"] = report.leaked
    data["problems"] = report.problems()
    return data


def main(quick: bool = True, json_path: str | None = None) -> int:
    """Run the matrix, print it, write JSON to ``json_path``; 1 if anything was
    lost, leaked, unexpected or undetected, else 0."""

    def progress(row: ScenarioRow) -> None:
        print(f"  ... {row.scenario}: {row.sent} sent, lost {row.lost}, leaked {row.leaked}",
              file=sys.stderr, flush=True)

    report = run_reliability(quick, progress=progress)
    print(format_report(report), flush=True)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(to_json(report), f, indent=2)
    return 1 if report.problems() else 0


def _cli(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m ctlwire.benchmarks.reliability",
                                description="Print ctlwire's fault matrix.")
    p.add_argument("--quick", action="store_true", help="2,000 calls a scenario, 5,000 soak")
    p.add_argument("--json", help="also write the report to this file")
    args = p.parse_args(argv)
    return main(args.quick, args.json)


if __name__ == "__main__":
    sys.exit(_cli())
