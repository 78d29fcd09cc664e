"""What one call costs in CPU, client and engine: ``ctlwire bench --only cpu``.

Rates say how fast; CPU per call says what each side pays for one call, and a
loaded machine disturbs it far less. On each backend, ctlwire against the
baselines of the rate rows, measured in the same run, the two sides alternating:

* **client**: the client thread's CPU (``time.thread_time``: not libzmq's IO
  thread) per call, sequential and with 64 concurrent callers to one engine
  (the FD-loop client to the bare engine), and per rank of a queueing fan-out to
  8 engines (the ``anyio.Lock`` + ``Event`` communicator to bare engines);
* **engine**: the engine processes' CPU (every thread, from ``/proc``: the
  event loop's or poll loop's and libzmq's) per request they served in those
  same runs, a ctlwire engine in poll mode against the bare baseline engine.

Ratios are ctlwire / baseline (lower is better); the rows are reported, not
judged: the targets are on the rates.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

from .baseline_lock_fanout import LockFanOutCommunicator
from .baseline_pyzmq import PyzmqUtilityClient
from .fleets import FleetPool
from .report import Row, Target
from .scenarios import PAYLOAD, Params
from .stats import median

__all__ = ["GROUPS", "run_group"]

GROUPS = ("cpu",)
FAN_ENGINES = 8
CALLERS = 64
_TICK = os.sysconf("SC_CLK_TCK")
#: (kind, scenario text, ops per measurement in a full run)
KINDS = (("seq", "sequential calls, 1 engine", 5_000),
         ("conc", f"{CALLERS} concurrent callers, 1 engine", 25_600),
         ("fanout", f"queueing fan-out to {FAN_ENGINES} engines, per rank", 2_000))
Op = Callable[[], Awaitable[Any]]


def _process_cpu(pids: Sequence[int]) -> float:
    """CPU seconds the processes ``pids`` used so far, every thread (``/proc``)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / _TICK


async def _measure(op: Op, n: int, callers: int, engines: Sequence[int]
                   ) -> tuple[float, float]:
    """(client thread CPU, engine processes' CPU) in µs per op, ``n`` ops by ``callers``
    (the engines' at the resolution of ``/proc``: a clock tick over the ops)."""
    per = max(1, n // callers)

    async def worker() -> None:
        for _ in range(per):
            await op()

    engine0, client0 = _process_cpu(engines), time.thread_time()
    async with anyio.create_task_group() as tg:
        for _ in range(callers):
            tg.start_soon(worker)
    client, engine = time.thread_time() - client0, _process_cpu(engines) - engine0
    ops = per * callers
    return client / ops * 1e6, engine / ops * 1e6


async def _sides(kind: str, addresses: dict[str, str], pids: dict[str, list[int]], n: int,
                 rounds: int) -> dict[str, list[tuple[float, float]]]:
    fan = kind == "fanout"
    ranks = FAN_ENGINES if fan else 1
    ctl_at, base_at = ("ctl8", "base8") if fan else ("ctl1", "base1")
    async with (ControlClient(ZmqRouterClientTransport(addresses[ctl_at]), ranks=ranks,
                              default_timeout=30.0) as ctl,
                PyzmqUtilityClient(addresses[base_at]) as base):
        await ctl.wait_ready(timeout=30)
        await base.wait_ready(range(ranks))
        ctl_op: Op
        base_op: Op
        if fan:
            comm = LockFanOutCommunicator(base, "echo", range(ranks))

            def ctl_op() -> Awaitable[Any]:
                return ctl.fan_out("echo", PAYLOAD, mode="queueing")

            def base_op() -> Awaitable[Any]:
                return comm(PAYLOAD)
        else:
            def ctl_op() -> Awaitable[Any]:
                return ctl.call("echo", PAYLOAD, rank=0)

            def base_op() -> Awaitable[Any]:
                return base.call(0, "echo", PAYLOAD)
        callers = CALLERS if kind == "conc" else 1
        out: dict[str, list[tuple[float, float]]] = {"ctl": [], "base": []}
        for op, at in ((ctl_op, ctl_at), (base_op, base_at)):
            await _measure(op, max(callers, n // 10), callers, pids[at])  # warm-up
        for _ in range(rounds):
            out["base"].append(await _measure(base_op, n, callers, pids[base_at]))
            out["ctl"].append(await _measure(ctl_op, n, callers, pids[ctl_at]))
        return out


def run_group(pool: FleetPool, p: Params) -> list[Row]:
    """The rows of the ``cpu`` group, with engine fleets from ``pool``."""
    fleets = {"ctl1": pool.ctlwire("cpu-ctl1", 1), "base1": pool.baseline("cpu-base1", 1),
              "ctl8": pool.ctlwire("cpu-ctl8", FAN_ENGINES),
              "base8": pool.baseline("cpu-base8", FAN_ENGINES)}
    names = {key: f"cpu-{key}" for key in fleets}
    pool.start(*names.values())
    addresses = {key: pool.address(name) for key, name in names.items()}
    pids = {key: list(fleet.pids().values()) for key, fleet in fleets.items()}
    rows: list[Row] = []
    try:
        for backend in ("asyncio", "trio"):
            for kind, text, full_n in KINDS:
                n = max(CALLERS, full_n // 5) if p.quick else full_n
                got = anyio.run(_sides, kind, addresses, pids, n, 1 if p.quick else 3,
                                backend=backend)
                per = FAN_ENGINES if kind == "fanout" else 1
                for which, index, who in (("client", 0, "client thread"),
                                          ("engine", 1, "engine processes")):
                    ctl = median([m[index] for m in got["ctl"]]) / per
                    base = median([m[index] for m in got["base"]]) / per
                    # below one clock tick over the run, a side reads as that tick
                    callers = CALLERS if kind == "conc" else 1
                    floor = 1e6 / _TICK / (n // callers * callers) / per
                    rows.append(Row(
                        "cpu", f"{which} CPU per call, {text}, {backend}", "µs", ctl, base,
                        f"{who}: the baseline of the rate rows, on {backend}",
                        max(ctl, floor) / max(base, floor),
                        "ctlwire / baseline (lower is better)", Target("info"),
                        {"ctlwire_runs_us": [round(m[index] / per, 2) for m in got["ctl"]],
                         "baseline_runs_us": [round(m[index] / per, 2) for m in got["base"]]}))
    finally:
        for name in names.values():
            pool.stop(name)
    return rows
