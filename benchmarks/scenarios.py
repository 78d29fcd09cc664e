"""The measured scenarios of ``ctlwire bench``; each returns raw numbers.

Every comparison with a peer is made of alternating runs, ctlwire then the peer
(:func:`~ctlwire.benchmarks.paired_runs.alternate_runs`), each a fresh client in
a fresh event loop, alone in this process, so that both sides see the same
machine at nearly the same time and the CPU read for a run is its own side's:
each run reports its latencies or rate and the CPU per call of this process and
of the engine processes (every thread). Both sides send the same payload,
encoded with msgspec msgpack, over ipc to engine processes that decode, dispatch
and encode it.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.abc import TaskGroup

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.errors import CtlwireError, RemoteError, RequestTimedOut
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

from .baseline_lock_fanout import LockFanOutCommunicator
from .baseline_pyzmq import PyzmqUtilityClient
from .libzmq_floor import FloorPinger
from .paired_runs import Cpu, CpuMeter, alternate_runs
from .stats import median, percentile, rss_bytes

__all__ = [
    "PAYLOAD",
    "BackendRound",
    "EngineRun",
    "FanOutResult",
    "FanOutRun",
    "LiveResult",
    "MemoryResult",
    "Params",
    "SingleEngineResult",
    "backend_round",
    "base_echo",
    "base_fan_out",
    "burst_rate",
    "ctl_echo",
    "ctl_fan_out",
    "engine_run",
    "fan_out",
    "fan_out_calls",
    "fan_out_run",
    "live_requests",
    "memory",
    "single_engine",
    "single_engine_calls",
]

PAYLOAD: dict[str, Any] = {"step": 123_456, "paused": False, "weights_version": 7,
                           "note": "get_server_info"}
"""What every call sends (and ``echo`` returns): a small control payload."""

CallFn = Callable[[], Awaitable[Any]]


@dataclass(frozen=True)
class Params:
    """Sizes of one bench run (``quick`` shrinks them). ``runs``: the alternating runs of
    each side in a comparison with a peer (default 5, 2 with ``quick``)."""

    quick: bool
    runs_override: int | None = None

    @property
    def runs(self) -> int:
        if self.runs_override is not None:
            return self.runs_override
        return 2 if self.quick else 5

    @property
    def warmup(self) -> int:
        """Sequential calls each run makes before it measures."""
        return 100 if self.quick else 300

    @property
    def seq_block(self) -> int:
        """Sequential calls a run measures."""
        return 300 if self.quick else 2_000

    @property
    def tput_block(self) -> int:
        """Calls by concurrent callers a run measures."""
        return 2_560 if self.quick else 12_800

    @property
    def fan_block(self) -> int:
        """Fan-outs a run measures at each number of callers (at least one burst)."""
        return 64 if self.quick else 400

    @property
    def fan_callers(self) -> tuple[int, ...]:
        """Callers queued at once on one fan-out mailbox."""
        return (100, 500) if self.quick else (100, 1_000, 4_000)

    @property
    def floor_calls(self) -> int:
        return 1_000 if self.quick else 5_000

    @property
    def live_levels(self) -> tuple[int, ...]:
        return (10, 10_000) if self.quick else (10, 100, 1_000, 10_000)

    @property
    def live_calls(self) -> int:
        return 200 if self.quick else 2_000

    @property
    def memory_calls(self) -> int:
        return 10_000 if self.quick else 100_000

    @property
    def memory_warmup(self) -> int:
        return 3_000 if self.quick else 12_000


# -- measuring primitives -------------------------------------------------------------
async def sequential(call: CallFn, n: int) -> list[float]:
    """``n`` calls one after the other; each one's round trip in µs."""
    clock = time.perf_counter_ns
    samples: list[float] = []
    append = samples.append
    for _ in range(n):
        t0 = clock()
        await call()
        append((clock() - t0) / 1000.0)
    return samples


async def concurrent_rate(call: CallFn, total: int, callers: int) -> float:
    """``callers`` tasks sharing ``total`` calls; completed calls per second."""
    per = max(1, total // callers)

    async def worker() -> None:
        for _ in range(per):
            await call()

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(callers):
            tg.start_soon(worker)
    return per * callers / (time.perf_counter() - t0)


def _ctl_client(address: str, ranks: int, timeout: float = 30.0, **kwargs: Any
                ) -> ControlClient:
    return ControlClient(ZmqRouterClientTransport(address), ranks=ranks,
                         default_timeout=timeout, **kwargs)


def _check(value: Any, expected: Any, what: str) -> None:
    if value != expected:
        raise AssertionError(f"{what}: unexpected answer {value!r}")


# -- single engine: sequential latency, throughput, libzmq floor ----------------------
@contextlib.asynccontextmanager
async def ctl_echo(address: str) -> AsyncIterator[tuple[ControlClient, CallFn]]:
    """A ControlClient to one engine, ready and checked, and its ``echo`` call."""
    async with _ctl_client(address, 1) as ctl:
        await ctl.wait_ready(timeout=20)

        async def call() -> Any:
            return await ctl.call("echo", PAYLOAD, rank=0)

        _check(await call(), PAYLOAD, "ctlwire echo")
        yield ctl, call


@contextlib.asynccontextmanager
async def base_echo(address: str) -> AsyncIterator[CallFn]:
    """The raw pyzmq baseline client to one bare engine, ready and checked, and its
    ``echo`` call."""
    async with PyzmqUtilityClient(address) as base:
        await base.wait_ready([0], timeout=20)

        async def call() -> Any:
            return await base.call(0, "echo", PAYLOAD)

        _check(await call(), PAYLOAD, "baseline echo")
        yield call


@contextlib.asynccontextmanager
async def single_engine_calls(ctl_address: str, base_address: str
                              ) -> AsyncIterator[tuple[ControlClient, CallFn, CallFn]]:
    """Both stacks' clients to one engine each, ready: the ctlwire client and the
    ``echo`` call of each side (ctlwire, raw pyzmq baseline)."""
    async with ctl_echo(ctl_address) as (ctl, ctl_call), base_echo(base_address) as base_call:
        yield ctl, ctl_call, base_call


@dataclass
class EngineRun:
    """One side's run against one engine: sequential round trips (µs) and their CPU
    per call; the rate of concurrent callers and its CPU per call."""

    seq_us: list[float] = field(default_factory=list)
    seq_cpu: Cpu | None = None
    rate: float = 0.0
    rate_cpu: Cpu | None = None


async def engine_run(call: CallFn, engine_pids: Sequence[int], p: Params, *,
                     latency: bool, throughput: bool, callers: int = 64) -> EngineRun:
    """One run of ``call`` (a client already open and checked): a warm-up, then
    ``p.seq_block`` sequential calls and ``p.tput_block`` calls by ``callers`` tasks,
    each with the CPU per call of this process and of ``engine_pids``."""
    meter = CpuMeter(engine_pids)
    run = EngineRun()
    await sequential(call, p.warmup)
    if latency:
        gc.collect()
        meter.start()
        run.seq_us = await sequential(call, p.seq_block)
        run.seq_cpu = meter.per_op(p.seq_block)
    if throughput:
        await concurrent_rate(call, p.tput_block // 8, callers)
        gc.collect()
        meter.start()
        run.rate = await concurrent_rate(call, p.tput_block, callers)
        run.rate_cpu = meter.per_op(p.tput_block // callers * callers)
    return run


@dataclass
class SingleEngineResult:
    """Each run of each side (in run order): ctlwire, the baseline, the libzmq floor."""

    ctl: list[EngineRun] = field(default_factory=list)
    base: list[EngineRun] = field(default_factory=list)
    floor_us: list[list[float]] = field(default_factory=list)
    callers: int = 64


def single_engine(ctl_address: str, base_address: str, floor_address: str | None,
                  p: Params, *, latency: bool, throughput: bool, backend: str = "asyncio",
                  ctl_pids: Sequence[int] = (), base_pids: Sequence[int] = ()
                  ) -> SingleEngineResult:
    """ctlwire vs the raw pyzmq baseline against one engine process each (``ctl_pids``,
    ``base_pids``: the engines whose CPU is read), both clients on ``backend``, in
    ``p.runs`` alternating runs (ctlwire, baseline, floor), each a fresh client."""
    result = SingleEngineResult()

    async def ctl_run() -> EngineRun:
        async with ctl_echo(ctl_address) as (ctl, call):
            run = await engine_run(call, ctl_pids, p, latency=latency,
                                   throughput=throughput, callers=result.callers)
            assert ctl.registry.live_count == 0
            return run

    async def base_run() -> EngineRun:
        async with base_echo(base_address) as call:
            return await engine_run(call, base_pids, p, latency=latency,
                                    throughput=throughput, callers=result.callers)

    floor = FloorPinger(floor_address) if floor_address is not None and latency else None
    sides: dict[str, Callable[[], Any]] = {
        "ctl": lambda: anyio.run(ctl_run, backend=backend),
        "base": lambda: anyio.run(base_run, backend=backend)}
    try:
        if floor is not None:
            pinger = floor
            pinger.block(200)
            floor_n = max(50, p.floor_calls // p.runs)
            sides["floor"] = lambda: pinger.block(floor_n)
        runs = alternate_runs(sides, p.runs)
    finally:
        if floor is not None:
            floor.close()
    result.ctl, result.base = runs["ctl"], runs["base"]
    result.floor_us = runs.get("floor", [])
    return result


# -- fan-out to 8 engines, many callers queued at once, on each backend -------------------
@dataclass
class FanOutRun:
    """One side's run: fan-outs per second and CPU per fan-out, by callers queued at once."""

    rate: dict[int, float] = field(default_factory=dict)
    cpu: dict[int, Cpu] = field(default_factory=dict)


@dataclass
class FanOutResult:
    """Each run of each side (in run order), on one backend."""

    backend: str
    engines: int
    ctl: list[FanOutRun] = field(default_factory=list)
    base: list[FanOutRun] = field(default_factory=list)


async def burst_rate(one: CallFn, callers: int) -> float:
    """``callers`` tasks started at once, one call each; completed calls per second."""
    async def run_one() -> None:
        await one()

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(callers):
            tg.start_soon(run_one)
    return callers / (time.perf_counter() - t0)


@contextlib.asynccontextmanager
async def ctl_fan_out(address: str, engines: int
                      ) -> AsyncIterator[tuple[ControlClient, CallFn]]:
    """ctlwire's queueing fan-out to ``engines`` ranks, ready and checked."""
    # the last of 4,000 queued callers waits for the 3,999 before it: a timeout that
    # bounds the whole queue, not one fan-out
    async with _ctl_client(address, engines, timeout=600.0) as ctl:
        await ctl.wait_ready(timeout=20)

        async def call() -> Any:
            return await ctl.fan_out("echo", PAYLOAD, mode="queueing")

        _check((await call()).results, dict.fromkeys(range(engines), PAYLOAD),
               "ctlwire fan-out")
        yield ctl, call


@contextlib.asynccontextmanager
async def base_fan_out(address: str, engines: int) -> AsyncIterator[CallFn]:
    """The anyio Lock + Event communicator over bare pyzmq engines, ready and checked."""
    async with PyzmqUtilityClient(address) as base:
        await base.wait_ready(range(engines), timeout=20)
        comm = LockFanOutCommunicator(base, "echo", range(engines))

        async def call() -> Any:
            return await comm(PAYLOAD)

        _check(await call(), dict.fromkeys(range(engines), PAYLOAD), "baseline fan-out")
        yield call


@contextlib.asynccontextmanager
async def fan_out_calls(ctl_address: str, base_address: str, engines: int
                        ) -> AsyncIterator[tuple[ControlClient, CallFn, CallFn]]:
    """Both sides' queueing fan-out to ``engines`` ranks, ready and checked: ctlwire's
    FIFO mailbox and the anyio Lock + Event communicator over bare pyzmq engines."""
    async with (ctl_fan_out(ctl_address, engines) as (ctl, ctl_call),
                base_fan_out(base_address, engines) as base_call):
        yield ctl, ctl_call, base_call


async def fan_out_run(call: CallFn, engine_pids: Sequence[int], p: Params,
                      sizes: Sequence[int] = ()) -> FanOutRun:
    """One run of ``call`` (a fan-out, its client open and checked): a warm-up burst,
    then for each size in ``sizes`` (default ``p.fan_callers``) that many callers
    queued at once, as many bursts as make ``p.fan_block`` fan-outs (at least one),
    with the CPU per fan-out of this process and of ``engine_pids``."""
    sizes = sizes or p.fan_callers
    meter = CpuMeter(engine_pids)
    run = FanOutRun()
    await burst_rate(call, min(sizes))
    for callers in sizes:
        bursts = max(1, p.fan_block // callers)
        gc.collect()
        meter.start()
        t0 = time.perf_counter()
        for _ in range(bursts):
            await burst_rate(call, callers)
        run.rate[callers] = bursts * callers / (time.perf_counter() - t0)
        run.cpu[callers] = meter.per_op(bursts * callers)
    return run


def fan_out(ctl_address: str, base_address: str, engines: int, p: Params,
            backend: str, ctl_pids: Sequence[int] = (), base_pids: Sequence[int] = ()
            ) -> FanOutResult:
    """Queueing fan-outs by callers queued at once (one task each, for each size in
    ``p.fan_callers``), ctlwire vs the anyio Lock + Event communicator, both on
    ``backend``, each to its own ``engines`` processes (``ctl_pids``, ``base_pids``:
    whose CPU is read), in ``p.runs`` alternating runs, each a fresh client."""
    result = FanOutResult(backend, engines)

    async def ctl_run() -> FanOutRun:
        async with ctl_fan_out(ctl_address, engines) as (ctl, call):
            run = await fan_out_run(call, ctl_pids, p)
            assert ctl.registry.live_count == 0
            return run

    async def base_run() -> FanOutRun:
        async with base_fan_out(base_address, engines) as call:
            return await fan_out_run(call, base_pids, p)

    runs = alternate_runs({"ctl": lambda: anyio.run(ctl_run, backend=backend),
                           "base": lambda: anyio.run(base_run, backend=backend)}, p.runs)
    result.ctl, result.base = runs["ctl"], runs["base"]
    return result


# -- trio vs asyncio ------------------------------------------------------------------------
@dataclass
class BackendRound:
    """One round of :func:`backend_round`: sequential round trips (µs), the rate of 64
    concurrent callers, the queueing fan-out rate (0.0 without engines to fan out to),
    and the client thread's CPU per concurrent call and per fan-out (µs)."""

    seq_us: list[float]
    rate: float
    fan_rate: float
    cpu_per_call_us: float
    cpu_per_fan_out_us: float


def backend_round(one_address: str, fan_address: str | None, fan_engines: int,
                  p: Params, backend: str) -> BackendRound:
    """One ``anyio.run`` on ``backend``: fresh clients bound at the addresses (the
    engines reconnect), warm-up, then the sequential, 64-concurrent and queueing
    fan-out scenarios (the rounds of ``python -m ctlwire.benchmarks.backend_pairs``)."""
    seq_n = p.seq_block
    tput_n = p.tput_block // 2
    fan_n = p.fan_block

    async def round_() -> BackendRound:
        async with contextlib.AsyncExitStack() as stack:
            one = await stack.enter_async_context(_ctl_client(one_address, 1))
            fan = (await stack.enter_async_context(_ctl_client(fan_address, fan_engines))
                   if fan_address is not None else None)
            await one.wait_ready(timeout=20)
            if fan is not None:
                await fan.wait_ready(timeout=20)

            async def call() -> Any:
                return await one.call("echo", PAYLOAD, rank=0)

            _check(await call(), PAYLOAD, f"ctlwire echo on {backend}")
            await sequential(call, 200)
            seq = await sequential(call, seq_n)
            cpu0 = time.thread_time()
            rate = await concurrent_rate(call, tput_n, 64)
            cpu_call = (time.thread_time() - cpu0) / tput_n * 1e6
            fan_rate = cpu_fan = 0.0
            if fan is not None:
                fan_client = fan

                async def fan_call() -> Any:
                    return await fan_client.fan_out("echo", PAYLOAD, mode="queueing")

                await concurrent_rate(fan_call, fan_n // 4, 8)
                cpu0 = time.thread_time()
                fan_rate = await concurrent_rate(fan_call, fan_n, 8)
                cpu_fan = (time.thread_time() - cpu0) / fan_n * 1e6
            return BackendRound(seq, rate, fan_rate, cpu_call, cpu_fan)

    return anyio.run(round_, backend=backend)


# -- cost per request as live requests grow -------------------------------------------------
@dataclass
class LiveResult:
    levels: list[int] = field(default_factory=list)
    p50_us: dict[int, float] = field(default_factory=dict)
    p50_first_base: float = 0.0
    p50_last_base: float = 0.0
    live_seen: dict[int, int] = field(default_factory=dict)
    leftover: int = -1


def live_requests(address: str, p: Params) -> LiveResult:
    """Keep N calls pending at rank 1 (an engine stuck in ``hang``, heartbeating from
    its own task) and time sequential ``echo`` calls to rank 0 at each N; measure the
    smallest N again at the end (A ... B ... A) so drift shows."""
    result = LiveResult(levels=list(p.live_levels))
    levels = p.live_levels
    n = p.live_calls

    async def run() -> None:
        async with _ctl_client(address, 2) as ctl:
            await ctl.wait_ready(timeout=20)
            registry = ctl.registry

            async def call() -> Any:
                return await ctl.call("echo", PAYLOAD, rank=0)

            async def pending() -> None:
                with contextlib.suppress(CtlwireError):
                    await ctl.call("hang", rank=1, timeout=600.0)

            async def grow(tg: TaskGroup, to: int) -> None:
                for _ in range(to - registry.live_count):
                    tg.start_soon(pending)
                with anyio.fail_after(60):
                    while registry.live_count < to:
                        await anyio.sleep(0.01)
                await anyio.sleep(0.05)

            _check(await call(), PAYLOAD, "ctlwire echo")
            await sequential(call, 200)
            async with anyio.create_task_group() as base_tg:
                await grow(base_tg, levels[0])
                result.live_seen[levels[0]] = registry.live_count
                result.p50_first_base = percentile(await sequential(call, n), 50)
                async with anyio.create_task_group() as extra_tg:
                    for level in levels[1:]:
                        await grow(extra_tg, level)
                        result.live_seen[level] = registry.live_count
                        result.p50_us[level] = percentile(await sequential(call, n), 50)
                    extra_tg.cancel_scope.cancel()
                with anyio.fail_after(30):
                    while registry.live_count > levels[0]:
                        await anyio.sleep(0.01)
                await sequential(call, 100)
                result.p50_last_base = percentile(await sequential(call, n), 50)
                base_tg.cancel_scope.cancel()
            result.leftover = registry.live_count
            result.p50_us[levels[0]] = median([result.p50_first_base, result.p50_last_base])

    anyio.run(run, backend="asyncio")
    return result


# -- memory after many calls with 10 % timeouts ------------------------------------------------
@dataclass
class MemoryResult:
    calls: int = 0
    warmup: int = 0
    timeouts: int = 0
    ok: int = 0
    other_errors: int = 0
    live_after: int = -1
    tombstones: int = 0
    tombstone_bound: int = 0
    late: int = 0
    duplicate: int = 0
    rss_before: int = 0
    rss_after: int = 0
    seconds: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)


def memory(address: str, p: Params, *, slow_every: int = 10, slow_seconds: float = 0.002,
           slow_timeout: float = 0.001, callers: int = 64) -> MemoryResult:
    """``calls`` calls by ``callers`` tasks; every ``slow_every``-th one asks the engine
    to ``sleep`` longer than its own timeout (the reply, if any, arrives late). RSS is
    taken after a warm-up of the same mix (which fills the tombstone set to its bound)
    and after the measured calls, each time after a full garbage collection."""
    result = MemoryResult(calls=p.memory_calls, warmup=p.memory_warmup)

    async def run() -> None:
        async with _ctl_client(address, 1) as ctl:
            await ctl.wait_ready(timeout=20)
            registry = ctl.registry
            result.tombstone_bound = registry.max_tombstones

            async def mix(total: int) -> tuple[int, int, int]:
                counts = [0, 0, 0]  # ok, timeouts, other errors
                per = total // callers

                async def worker(w: int) -> None:
                    for i in range(per):
                        try:
                            if (w * per + i) % slow_every == 0:
                                await ctl.call("sleep", slow_seconds, rank=0,
                                               timeout=slow_timeout)
                            else:
                                await ctl.call("echo", PAYLOAD, rank=0, timeout=10.0)
                            counts[0] += 1
                        except RequestTimedOut:
                            counts[1] += 1
                        except RemoteError as exc:  # expired at the engine: also a timeout
                            counts[1 if exc.type_name == "DeadlineExpired" else 2] += 1

                async with anyio.create_task_group() as tg:
                    for w in range(callers):
                        tg.start_soon(worker, w)
                return counts[0], counts[1], counts[2]

            async def settle() -> None:
                # let the late replies of the timed-out calls arrive
                last, quiet = -1, 0
                with anyio.move_on_after(5):
                    while quiet < 3:
                        await anyio.sleep(0.05)
                        now = registry.stats.late
                        quiet = quiet + 1 if now == last else 0
                        last = now

            await mix(result.warmup)
            await settle()
            gc.collect()
            result.rss_before = rss_bytes()
            t0 = time.perf_counter()
            result.ok, result.timeouts, result.other_errors = await mix(result.calls)
            result.seconds = time.perf_counter() - t0
            late0 = registry.stats.late
            await settle()
            gc.collect()
            result.rss_after = rss_bytes()
            result.live_after = registry.live_count
            result.tombstones = registry.tombstone_count
            result.late = registry.stats.late - late0
            result.duplicate = registry.stats.duplicate
            snap = registry.stats.snapshot()
            result.stats = {"registered": snap["registered"], "cleaned": snap["cleaned"],
                            "outcomes": snap["outcomes"]}

    anyio.run(run, backend="asyncio")
    return result
