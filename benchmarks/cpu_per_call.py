"""What a ctlwire engine costs per plain request: ``ctlwire bench --only cpu``.

A user's engine is driven by ctlwire's client, so both engines here are: the same
:class:`~ctlwire.kernel.client.control_client.ControlClient` code (one engine, on
asyncio) drives a ctlwire engine process (``engine_process --mode poll``, the
bench's engines) and, alternately, the smallest pyzmq loop that speaks the same
protocol (:mod:`ctlwire.benchmarks.protocol_engine`: decode the envelope, call the
handler, encode the reply), with sequential calls and with 64 concurrent callers.
The engine's CPU per request is every thread of its process (its loop, libzmq's
I/O thread, the beacon), from ``/proc/<pid>/task/*/schedstat``; the details add
the main thread alone. The client's CPU per call is shown too: it is the same
code on both sides, so it should read about 1.0x, and it shows that the two
engines were driven alike.

How fast requests come decides much of what each one costs an engine: a request
that finds the engine's thread asleep pays for waking it (and for caches that
other processes cooled meanwhile), a burst shares one wake-up among several.
Hence the same driver for both sides, and the sequential and concurrent rows
(``docs/benchmarks.md``, "Engine CPU per request: which measure").
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from .fleets import FleetPool
from .paired_runs import INFO, LOWER, Cpu, alternate_runs, compared_row
from .report import Row, Target
from .scenarios import EngineRun, Params, ctl_echo, engine_run
from .stats import percentile

__all__ = ["GROUPS", "PEER", "run_group"]

GROUPS = ("cpu",)
PEER = ("the smallest pyzmq loop speaking the protocol (blocking receive, decode the "
        "envelope, call the handler, encode the reply), driven by the same ControlClient")
CALLERS = 64
_TARGET = Target("<=", 1.3, "<= 1.3x")


def _runs(address: str, pids: Sequence[int], p: Params) -> EngineRun:
    async def run() -> EngineRun:
        async with ctl_echo(address) as (ctl, call):
            result = await engine_run(call, pids, p, latency=True, throughput=True,
                                      callers=CALLERS)
            assert ctl.registry.live_count == 0
            return result

    return anyio.run(run, backend="asyncio")


def rows(ctl: Sequence[EngineRun], peer: Sequence[EngineRun]) -> list[Row]:
    """The group's rows from each side's runs (run *i* against run *i*)."""
    out: list[Row] = []
    for label, which in (("sequential calls", "seq_cpu"),
                         (f"{CALLERS} concurrent callers", "rate_cpu")):
        c: list[Cpu] = [getattr(r, which) for r in ctl]
        b: list[Cpu] = [getattr(r, which) for r in peer]
        assert all(x is not None for x in (*c, *b))
        out.append(compared_row(
            "cpu", f"engine CPU per plain request, {label}, driven by ControlClient", "µs",
            [x.engine_us for x in c], [x.engine_us for x in b], PEER, LOWER, _TARGET,
            {"ctlwire_main_thread_runs_us": [round(x.engine_main_us, 2) for x in c],
             "peer_main_thread_runs_us": [round(x.engine_main_us, 2) for x in b]}))
        out.append(compared_row(
            "cpu", f"engine main thread CPU per plain request, {label}", "µs",
            [x.engine_main_us for x in c], [x.engine_main_us for x in b], PEER, LOWER, INFO))
        out.append(compared_row(
            "cpu", f"client CPU per call, {label} (the same ControlClient on both sides)",
            "µs", [x.client_us for x in c], [x.client_us for x in b], PEER, LOWER, INFO))
    out.append(compared_row(
        "cpu", "sequential call p50 through ControlClient", "µs",
        [percentile(r.seq_us, 50) for r in ctl], [percentile(r.seq_us, 50) for r in peer],
        PEER, LOWER, INFO))
    return out


def run_group(pool: FleetPool, p: Params) -> list[Row]:
    """The rows of the ``cpu`` group, with engine processes from ``pool``."""
    pool.ctlwire("cpu-ctl1", 1)
    pool.module("cpu-peer1", "ctlwire.benchmarks.protocol_engine",
                lambda rank: ["--connect", pool.address("cpu-peer1")])
    try:
        pool.start("cpu-ctl1", "cpu-peer1")
        addresses = {name: pool.address(name) for name in ("cpu-ctl1", "cpu-peer1")}
        pids = {name: pool.pids(name) for name in addresses}
        runs = alternate_runs({
            "ctl": lambda: _runs(addresses["cpu-ctl1"], pids["cpu-ctl1"], p),
            "peer": lambda: _runs(addresses["cpu-peer1"], pids["cpu-peer1"], p)}, p.runs)
        return rows(runs["ctl"], runs["peer"])
    finally:
        pool.stop("cpu-ctl1")
        pool.stop("cpu-peer1")
