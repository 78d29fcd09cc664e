"""Ordered pipelining's fan-out rate: ``ctlwire bench --only fanout_pipeline``.

Two rows, each against the same peer:

* **busy engines**: 8 engine processes that answer at once (ctlwire's in ``poll``
  mode, one request at a time in arrival order; the peer's a blocking receive),
  where the client and the engines together keep the cores busy, so the rate is
  bounded by the CPU a fan-out costs;
* **stepping engines** (:mod:`ctlwire.benchmarks.stepping_engines`): 8 engine
  processes that each sleep a step, as a scheduler waits for its device, then
  answer every request that has arrived, where the cores idle between round
  trips, so the rate is bounded by how many fan-outs a step answers.

In both, a queueing fan-out mailbox with a pipeline depth of 4
(``ControlClient(pipeline={"echo": 4})``: up to 4 fan-outs of the method in flight,
sent to every rank and completed in admission order) against the anyio Lock +
Event communicator, which by design has one fan-out in flight
(:mod:`ctlwire.benchmarks.baseline_lock_fanout`), with 1,000 callers queued at
once, one task each, on asyncio and on trio. Runs alternate, each a fresh client
(:mod:`ctlwire.benchmarks.paired_runs`); the rows are the medians of the runs'
rates and ratios with their spread, and beside them the CPU per fan-out of the
client, the engines and both together; the stepping row's details hold the steps
each engine took by the end.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio

from ctlwire.kernel import ControlClient

from . import stepping_engines
from .baseline_pyzmq import PyzmqUtilityClient
from .fleets import FleetPool
from .paired_runs import alternate_runs, compared_row, cpu_rows
from .report import Row, Target
from .scenarios import PAYLOAD, CallFn, FanOutRun, Params, _ctl_client, base_fan_out, fan_out_run

__all__ = ["CALLERS", "DEPTH", "GROUPS", "run_group"]

GROUPS = ("fanout_pipeline",)
ENGINES = 8
DEPTH = 4
CALLERS = 1_000
_PEER = ("anyio Lock + Event fan-out communicator (fixed SGLang design, one fan-out in "
         "flight), FD-technique receive over bare sync pyzmq engines")


@contextlib.asynccontextmanager
async def ctl_pipelined(address: str, engines: int, depth: int = DEPTH
                        ) -> AsyncIterator[tuple[ControlClient, CallFn]]:
    """ctlwire's queueing fan-out to ``engines`` ranks with ``depth`` in flight, ready
    and checked."""
    async with _ctl_client(address, engines, timeout=600.0,
                           pipeline={"echo": depth}) as ctl:
        await ctl.wait_ready(timeout=20)

        async def call() -> object:
            return await ctl.fan_out("echo", PAYLOAD, mode="queueing")

        first = await ctl.fan_out("echo", PAYLOAD, mode="queueing")
        if first.results != dict.fromkeys(range(engines), PAYLOAD):
            raise AssertionError(f"ctlwire pipelined fan-out: unexpected answer {first!r}")
        yield ctl, call


def _rows(backend: str, engines_kind: str, ctl: Sequence[FanOutRun],
          base: Sequence[FanOutRun], details: dict[str, Any]) -> list[Row]:
    scenario = (f"pipelined fan-out (depth {DEPTH}), {ENGINES} {engines_kind}, {CALLERS:,} "
                f"callers at once, {backend}")
    peer = f"{_PEER}, on {backend}"
    return [compared_row("fanout_pipeline", scenario, "fan-outs/s",
                         [r.rate[CALLERS] for r in ctl], [r.rate[CALLERS] for r in base], peer,
                         "ctlwire / baseline (higher is better)", Target(">=", 2.0, ">= 2.0x"),
                         details),
            *cpu_rows("fanout_pipeline", scenario, [r.cpu[CALLERS] for r in ctl],
                      [r.cpu[CALLERS] for r in base], peer, per="fan-out", engines=ENGINES)]


def _compare(ctl_address: str, ctl_pids: Sequence[int], base_address: str,
             base_pids: Sequence[int], p: Params, backend: str
             ) -> tuple[list[FanOutRun], list[FanOutRun]]:
    """ctlwire's and the peer's runs on ``backend``, alternating."""
    async def ctl_run() -> FanOutRun:
        async with ctl_pipelined(ctl_address, ENGINES) as (ctl, call):
            run = await fan_out_run(call, ctl_pids, p, (CALLERS,))
            assert ctl.registry.live_count == 0
            return run

    async def base_run() -> FanOutRun:
        async with base_fan_out(base_address, ENGINES) as call:
            return await fan_out_run(call, base_pids, p, (CALLERS,))

    runs = alternate_runs(
        {"ctl": functools.partial(anyio.run, ctl_run, backend=backend),
         "base": functools.partial(anyio.run, base_run, backend=backend)}, p.runs)
    return runs["ctl"], runs["base"]


def _steps_taken(ctl_address: str, base_address: str) -> dict[str, list[int]]:
    """The steps each stepping engine of both fleets has taken, by rank."""
    async def read() -> dict[str, list[int]]:
        async with _ctl_client(ctl_address, ENGINES) as ctl:
            await ctl.wait_ready(timeout=20)
            ctl_steps = (await ctl.fan_out("steps")).results
        async with PyzmqUtilityClient(base_address) as base:
            await base.wait_ready(range(ENGINES), timeout=20)
            base_steps = [await base.call(rank, "steps") for rank in range(ENGINES)]
        return {"ctlwire_engine_steps": [ctl_steps[rank] for rank in range(ENGINES)],
                "baseline_engine_steps": base_steps}

    return anyio.run(read)


def run_group(pool: FleetPool, p: Params) -> list[Row]:
    """The rows of the ``fanout_pipeline`` group, with engine processes from ``pool``:
    the busy engines' rows, then (those fleets stopped) the stepping engines'."""
    out: list[Row] = []
    fleets = [("pipe-ctl8", "pipe-base8", "engines", False),
              ("pipe-ctl8-step", "pipe-base8-step",
               f"stepping engines ({stepping_engines.STEP_SECONDS * 1e3:g} ms steps)", True)]
    for ctl_name, base_name, engines_kind, stepping in fleets:
        if not stepping:
            pool.ctlwire(ctl_name, ENGINES)
            pool.baseline(base_name, ENGINES)
        else:
            pool.custom(ctl_name, lambda a: stepping_engines.ctlwire_fleet(a, ENGINES))
            pool.custom(base_name, lambda a: stepping_engines.peer_fleet(a, ENGINES))
        try:
            pool.start(ctl_name, base_name)
            ctl_address, base_address = pool.address(ctl_name), pool.address(base_name)
            ctl_pids, base_pids = pool.pids(ctl_name), pool.pids(base_name)
            for backend in ("asyncio", "trio"):
                ctl_runs, base_runs = _compare(ctl_address, ctl_pids, base_address,
                                               base_pids, p, backend)
                details = (_steps_taken(ctl_address, base_address) if stepping else {})
                out += _rows(backend, engines_kind, ctl_runs, base_runs, details)
        finally:
            pool.stop(ctl_name)
            pool.stop(base_name)
    return out
