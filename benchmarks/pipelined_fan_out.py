"""Ordered pipelining's fan-out rate: ``ctlwire bench --only fanout_pipeline``.

A queueing fan-out mailbox with a pipeline depth of 4
(``ControlClient(pipeline={"echo": 4})``: up to 4 fan-outs of the method in flight,
sent to every rank and completed in admission order) against the anyio Lock +
Event communicator, which by design has one fan-out in flight
(:mod:`ctlwire.benchmarks.baseline_lock_fanout`), both over 8 engine processes
(ctlwire's in ``poll`` mode: one request at a time, in arrival order), with 1,000
callers queued at once, one task each, on asyncio and on trio. Runs alternate,
each a fresh client (:mod:`ctlwire.benchmarks.paired_runs`); the rows are the
medians of the runs' rates and ratios with their spread, and beside them the CPU
per fan-out of the client, the engines and both together.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import time
from collections.abc import AsyncIterator, Sequence

import anyio

from ctlwire.kernel import ControlClient

from .fleets import FleetPool
from .paired_runs import CpuMeter, alternate_runs, compared_row, cpu_rows
from .report import Row, Target
from .scenarios import PAYLOAD, CallFn, FanOutRun, Params, _ctl_client, base_fan_out, burst_rate

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


async def _measure(call: CallFn, engine_pids: Sequence[int], p: Params) -> FanOutRun:
    """A warm-up burst, then ``CALLERS`` callers queued at once, as many bursts as make
    ``p.fan_block`` fan-outs (at least one), with the CPU per fan-out."""
    meter = CpuMeter(engine_pids)
    run = FanOutRun()
    await burst_rate(call, 100)
    bursts = max(1, p.fan_block // CALLERS)
    gc.collect()
    meter.start()
    t0 = time.perf_counter()
    for _ in range(bursts):
        await burst_rate(call, CALLERS)
    run.rate[CALLERS] = bursts * CALLERS / (time.perf_counter() - t0)
    run.cpu[CALLERS] = meter.per_op(bursts * CALLERS)
    return run


def _rows(backend: str, ctl: Sequence[FanOutRun], base: Sequence[FanOutRun]) -> list[Row]:
    scenario = (f"pipelined fan-out (depth {DEPTH}), {ENGINES} engines, {CALLERS:,} callers "
                f"at once, {backend}")
    peer = f"{_PEER}, on {backend}"
    return [compared_row("fanout_pipeline", scenario, "fan-outs/s",
                         [r.rate[CALLERS] for r in ctl], [r.rate[CALLERS] for r in base], peer,
                         "ctlwire / baseline (higher is better)", Target(">=", 2.0, ">= 2.0x")),
            *cpu_rows("fanout_pipeline", scenario, [r.cpu[CALLERS] for r in ctl],
                      [r.cpu[CALLERS] for r in base], peer, per="fan-out", engines=ENGINES)]


def run_group(pool: FleetPool, p: Params) -> list[Row]:
    """The rows of the ``fanout_pipeline`` group, with engine processes from ``pool``."""
    pool.ctlwire("pipe-ctl8", ENGINES)
    pool.baseline("pipe-base8", ENGINES)
    try:
        pool.start("pipe-ctl8", "pipe-base8")
        ctl_address, base_address = pool.address("pipe-ctl8"), pool.address("pipe-base8")
        ctl_pids, base_pids = pool.pids("pipe-ctl8"), pool.pids("pipe-base8")
        out: list[Row] = []
        for backend in ("asyncio", "trio"):
            async def ctl_run() -> FanOutRun:
                async with ctl_pipelined(ctl_address, ENGINES) as (ctl, call):
                    run = await _measure(call, ctl_pids, p)
                    assert ctl.registry.live_count == 0
                    return run

            async def base_run() -> FanOutRun:
                async with base_fan_out(base_address, ENGINES) as call:
                    return await _measure(call, base_pids, p)

            runs = alternate_runs(
                {"ctl": functools.partial(anyio.run, ctl_run, backend=backend),
                 "base": functools.partial(anyio.run, base_run, backend=backend)}, p.runs)
            out += _rows(backend, runs["ctl"], runs["base"])
        return out
    finally:
        pool.stop("pipe-ctl8")
        pool.stop("pipe-base8")
