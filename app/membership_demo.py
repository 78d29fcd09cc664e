"""``ctlwire demo --membership etcd``: ranks that come and go while the
weight-update cycle runs, discovered through a real etcd.

Starts a local etcd on free loopback ports (its data in a folder of its own,
removed at the end) and N engine processes, each registering its rank in etcd
under a lease (``engine_process --etcd``). The client is built with no ranks;
its ranks follow the etcd prefix (:class:`EtcdMembership`). It then runs K
``pause → update_weights(v) → resume`` cycles, each one operation on the
admissible ranks, while:

* a rank **joins**: a new engine process registers; it is present but not
  admissible until an operation naming it has brought it to the fleet's weight
  version, then :meth:`ControlClient.admit` makes it routable;
* a rank **leaves**: its process is stopped, which deregisters it (deletes its
  key while its lease lives); the watch removes it from the client.

etcd may be frozen (``kill -STOP`` the pid it prints) and thawed (``kill
-CONT``) at any point: the leases expire at the thaw, the engines register again
under the same incarnation, and no rank leaves — the store says who should be
there, heartbeats who is alive. The summary says how many registrations were lost
and restored.

Exits 0 (printing ``OK``) only when every cycle committed on every admissible
rank, a rank joined and one left, and every admissible rank ends on the last
cycle's weight version, not paused.
"""

from __future__ import annotations

import shutil
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

import anyio
from anyio.abc import TaskGroup

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.app.operation_engine import weight_update_plan
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.errors import CtlwireError
from ctlwire.kernel.membership.etcd_membership import EtcdError, EtcdGateway, EtcdMembership
from ctlwire.kernel.operations.runner import OperationRunner
from ctlwire.testing.etcd_server import EtcdServer, memory_dir
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

__all__ = ["MembershipDemoConfig", "MembershipDemoReport", "main", "run_membership_demo"]


@dataclass
class MembershipDemoConfig:
    engines: int = 4
    cycles: int = 20
    backend: str = "asyncio"
    #: seconds each engine's lease lives without a keep-alive
    ttl: float = 5.0
    #: bound on each step, each wait for a membership change and each engine start
    timeout: float = 30.0

    @property
    def join_at(self) -> int:
        """The cycle before which a new rank joins."""
        return max(2, self.cycles // 3)

    @property
    def leave_at(self) -> int:
        """The cycle before which a rank leaves (after the join)."""
        return max(self.join_at + 1, 2 * self.cycles // 3)


@dataclass
class MembershipDemoReport:
    joined: list[int] = field(default_factory=list)
    left: list[int] = field(default_factory=list)
    #: the client's membership counters at the end
    membership: dict[str, int] = field(default_factory=dict)
    committed: list[int] = field(default_factory=list)  # the cycles that committed everywhere
    final_versions: dict[int, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def verdict(self, cfg: MembershipDemoConfig) -> list[str]:
        """Every invariant that did not hold (empty: the demo succeeded)."""
        out = list(self.problems)
        if not self.joined:
            out.append("no rank joined")
        if not self.left:
            out.append("no rank left")
        if len(self.committed) != cfg.cycles:
            missing = sorted(set(range(1, cfg.cycles + 1)) - set(self.committed))
            out.append(f"cycles {missing} did not commit on every admissible rank")
        if not self.final_versions or any(v != cfg.cycles for v in self.final_versions.values()):
            out.append(f"final weight versions {self.final_versions}, expected {cfg.cycles}")
        return out


class _Timeout(CtlwireError):
    """A membership change or an engine did not show up in time."""


async def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    with anyio.move_on_after(timeout):
        while not condition():
            await anyio.sleep(0.02)
        return
    raise _Timeout(f"{what}: not within {timeout:g} s")


def _ranks(ranks: tuple[int, ...] | list[int]) -> str:
    return "[" + ", ".join(map(str, ranks)) + "]"


def _view(client: ControlClient) -> str:
    routable, left_out = client.routable_ranks()
    why = "; ".join(f"{r}: {reason}" for r, reason in sorted(left_out.items()))
    return (f"present {_ranks(client.ranks)}, admissible {_ranks(routable)}"
            + (f" (left out {why})" if why else ""))


async def run_membership_demo(cfg: MembershipDemoConfig,
                              out: TextIO = sys.stdout) -> MembershipDemoReport:
    """Run the demo; returns its report (see :meth:`MembershipDemoReport.verdict`)."""
    report = MembershipDemoReport()
    data = memory_dir("ctlwire-demo-etcd-")
    # a single member: a short election timeout only makes it start sooner, and lets a
    # lease live as little as 1 s
    etcd = EtcdServer(data, extra_args=["--heartbeat-interval", "50",
                                        "--election-timeout", "500"])
    fleets: list[EngineFleet] = []
    try:
        await anyio.to_thread.run_sync(etcd.start)
        out.write(f"etcd at {etcd.endpoint} (pid {etcd.pid}, data in {data}), engines "
                  f"register under a prefix with {cfg.ttl:g} s leases\n")
        router = ZmqRouterClientTransport()
        client = ControlClient(router, ranks=(), default_timeout=cfg.timeout)
        async with client, anyio.create_task_group() as tg:
            try:
                await _scenario(cfg, client, router.address, etcd.endpoint, tg, fleets,
                                report, out)
            except (_Timeout, CtlwireError, EtcdError) as exc:
                report.problems.append(f"{type(exc).__name__}: {exc}")
            tg.cancel_scope.cancel()
    except RuntimeError as exc:  # etcd did not start
        report.problems.append(f"{type(exc).__name__}: {exc}")
    finally:
        # engines stop after the client has closed: nobody is left to report them lost
        for fleet in fleets:
            await anyio.to_thread.run_sync(fleet.stop)
        await anyio.to_thread.run_sync(etcd.stop)
        shutil.rmtree(data, ignore_errors=True)
    return report


async def _scenario(cfg: MembershipDemoConfig, client: ControlClient, address: str,
                    endpoint: str, tg: TaskGroup, fleets: list[EngineFleet],
                    report: MembershipDemoReport, out: TextIO) -> None:
    prefix = f"/ctlwire/demo-{uuid.uuid4().hex[:8]}/"

    def args_for(rank: int) -> list[str]:
        return ["--connect", address,
                "--methods", "ctlwire.app.operation_engine:register",
                "--etcd", endpoint, "--etcd-prefix", prefix,
                "--etcd-ttl", f"{cfg.ttl:g}", "--backend", cfg.backend]

    await tg.start(EtcdMembership(client, EtcdGateway(endpoint, timeout=1.0), prefix,
                                  watch_round=1.0, retry_interval=0.2,
                                  start_timeout=cfg.timeout).run)
    fleet = EngineFleet(cfg.engines, args_for, ready_timeout=cfg.timeout)
    fleets.append(fleet)
    out.write(f"starting {cfg.engines} engine processes over {address} ...\n")
    await anyio.to_thread.run_sync(fleet.start)
    first = tuple(range(cfg.engines))
    await _wait_until(lambda: client.ranks == first, cfg.timeout,
                      f"ranks {_ranks(first)} registering in etcd")
    await client.wait_ready(timeout=cfg.timeout)
    for rank in first:  # fresh engines are on the fleet's weight version, 0
        client.admit(rank)
    out.write(f"ranks {_ranks(first)} joined through etcd, admitted at weight version 0\n")
    await _cycles(cfg, client, fleet, report, out)
    routable, _ = client.routable_ranks()
    if set(routable) != set(client.ranks):
        report.problems.append(f"present ranks not admissible at the end: {_view(client)}")
    infos = await client.fan_out("get_server_info", -1, ranks=routable, mode="concurrent")
    report.final_versions = {r: int(v["version"]) for r, v in infos.results.items()}
    for rank, err in infos.errors.items():
        report.problems.append(f"rank {rank} did not report its version: {err!r}")
    paused = sorted(r for r, v in infos.results.items() if v["paused"])
    if paused:
        report.problems.append(f"ranks {paused} left paused")
    report.membership = dict(client.membership.counters)


async def _join(cfg: MembershipDemoConfig, client: ControlClient, fleet: EngineFleet,
                runner: OperationRunner, version: int, head: str, out: TextIO) -> str | None:
    """Start a new engine process; once it has registered, bring it to ``version``
    by an operation naming it, then admit it. None, or why it could not join."""
    rank = max(fleet.engines) + 1
    engine = await anyio.to_thread.run_sync(fleet.restart, rank)  # a new process
    await _wait_until(lambda: rank in client.ranks, cfg.timeout,
                      f"rank {rank} registering in etcd")
    member = client.membership.get(rank)
    out.write(f"{head} rank {rank} joined (pid {engine.pid}, incarnation "
              f"{member.incarnation if member else '?'}): {_view(client)}\n")
    await client.wait_ready([rank], timeout=cfg.timeout)
    if version:
        result = await runner.run(weight_update_plan(version, 0, timeout=cfg.timeout),
                                  ranks=[rank])
        if not result.ok:
            return f"rank {rank} not brought to weight version {version}: {result.summary()}"
    client.admit(rank)
    out.write(f"{head} rank {rank} brought to weight version {version} and admitted: "
              f"{_view(client)}\n")
    return None


async def _leave(cfg: MembershipDemoConfig, client: ControlClient, fleet: EngineFleet,
                 head: str, out: TextIO) -> int:
    """Stop the lowest live rank's process (it deregisters); wait until the watch
    has removed it. Returns the rank."""
    rank = min(r for r, engine in fleet.engines.items() if engine.alive)
    await anyio.to_thread.run_sync(fleet.kill, rank, signal.SIGTERM)
    await _wait_until(lambda: rank not in client.ranks, cfg.timeout,
                      f"rank {rank} leaving the membership")
    out.write(f"{head} rank {rank} left (process stopped, deregistered): {_view(client)}\n")
    return rank


async def _cycles(cfg: MembershipDemoConfig, client: ControlClient, fleet: EngineFleet,
                  report: MembershipDemoReport, out: TextIO) -> None:
    runner = OperationRunner(client)
    version = 0
    for k in range(1, cfg.cycles + 1):
        head = f"cycle {k:>2}/{cfg.cycles}:"
        if k == cfg.join_at:
            failed = await _join(cfg, client, fleet, runner, version, head, out)
            if failed is not None:
                report.problems.append(failed)
                return
            report.joined.append(max(fleet.engines))
        if k == cfg.leave_at:
            report.left.append(await _leave(cfg, client, fleet, head, out))
        targets, _ = client.routable_ranks()
        t = time.perf_counter()
        result = await runner.run(weight_update_plan(k, version, timeout=cfg.timeout),
                                  ranks=targets)
        ms = (time.perf_counter() - t) * 1e3
        if result.ok and sorted(result.committed) == sorted(targets):
            version = k
            report.committed.append(k)
            out.write(f"{head} {_view(client)} -> weight version {k} committed on "
                      f"{_ranks(result.committed)} in {ms:.0f} ms\n")
        else:
            report.problems.append(f"cycle {k}: {result.summary()}")
            out.write(f"{head} {_view(client)} -> NOT committed: {result.summary()}\n")


def main(cfg: MembershipDemoConfig, out: TextIO | None = None) -> int:
    """Run the demo on ``cfg.backend``, print its summary (to ``out``, default
    stdout); 0 when every invariant held, else 1."""
    out = sys.stdout if out is None else out
    report = anyio.run(run_membership_demo, cfg, out, backend=cfg.backend)
    problems = report.verdict(cfg)
    m = report.membership
    if m:
        out.write(f"membership: registrations lost {m['registration_lost']} and restored "
                  f"{m['restored']}; ranks removed {m['removed']} (dead {m['died']})\n")
    out.write(f"joined {_ranks(report.joined)}, left {_ranks(report.left)}; "
              f"{len(report.committed)}/{cfg.cycles} cycles committed on every admissible "
              f"rank; weight versions at the end {dict(sorted(report.final_versions.items()))}\n")
    if problems:
        out.write("FAILED:\n" + "".join(f"  - {p}\n" for p in problems))
        return 1
    out.write("OK\n")
    return 0
