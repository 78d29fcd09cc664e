"""The pieces every comparison with a peer is made of: the schedstat reader, the
alternating runs and the rows they give, and the protocol loop that is the engine
CPU rows' peer (a real process, driven by a real ControlClient)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import anyio
import pytest

from ctlwire.benchmarks import schedstat
from ctlwire.benchmarks.fleets import FleetPool
from ctlwire.benchmarks.paired_runs import Cpu, CpuMeter, alternate_runs, compared_row, cpu_rows
from ctlwire.benchmarks.report import Report, Target
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.errors import RemoteError
from ctlwire.transports.zmq_client import ZmqRouterClientTransport


def _spin(seconds: float) -> None:
    """Run on this thread's CPU for ``seconds`` of its own CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_schedstat_counts_a_threads_cpu_as_the_thread_itself_does() -> None:
    pid = os.getpid()
    before, cpu0 = schedstat.read([pid]), time.thread_time()
    _spin(0.05)
    used = time.thread_time() - cpu0
    delta = schedstat.cpu_ns(before, schedstat.read([pid]))
    # the same clock (the scheduler's sum) read from /proc: what the thread saw itself
    # between two later readings of its own (a kernel may lag by a scheduler tick)
    assert delta.main_ns >= used * 1e9 * 0.9
    assert delta.total_ns >= delta.main_ns
    assert delta.threads_ended == 0


def test_schedstat_counts_a_new_thread_from_zero_and_an_ended_one_as_ended() -> None:
    pid = os.getpid()
    release = threading.Event()
    worker = threading.Thread(target=lambda: (_spin(0.05), release.wait(10)))
    before = schedstat.read([pid])
    worker.start()
    give_up = time.monotonic() + 20
    mid = schedstat.read([pid])
    while schedstat.cpu_ns(before, mid).other_ns < 0.04e9 and time.monotonic() < give_up:
        time.sleep(0.01)  # until the worker's spin is in: a thread started after `before`
        mid = schedstat.read([pid])
    release.set()
    worker.join(10)
    # the OS thread is reaped a little after join() returns
    while os.path.exists(f"/proc/{pid}/task/{worker.native_id}") and time.monotonic() < give_up:
        time.sleep(0.01)
    assert schedstat.cpu_ns(before, mid).other_ns >= 0.04e9
    assert schedstat.cpu_ns(mid, schedstat.read([pid])).threads_ended == 1


def test_schedstat_reads_nothing_of_a_process_that_is_gone() -> None:
    assert schedstat.read([2 ** 22 + 12345]).threads == {}


def test_cpu_meter_splits_this_process_from_the_engines() -> None:
    meter = CpuMeter([])  # no engines: only this process
    meter.start()
    _spin(0.02)
    cpu = meter.per_op(10)
    assert cpu.client_us >= 0.02 / 10 * 1e6 * 0.95
    assert cpu.engine_us == cpu.engine_main_us == 0
    assert cpu.total_us == cpu.client_us


def test_runs_alternate_a_b_a_b() -> None:
    order: list[str] = []
    runs = alternate_runs({"ctl": lambda: order.append("ctl") or len(order),
                           "base": lambda: order.append("base") or len(order)}, 3)
    assert order == ["ctl", "base"] * 3
    assert runs == {"ctl": [1, 3, 5], "base": [2, 4, 6]}


def test_a_compared_row_is_the_median_of_the_runs_with_the_ratios_spread() -> None:
    row = compared_row("g", "s", "µs", [10, 30, 12], [10, 10, 10], "peer", "ctl / peer",
                       Target("<=", 1.3))
    assert (row.ctlwire, row.baseline, row.ratio) == (12, 10, 1.2)  # medians
    assert row.spread == (1.0, 3.0)
    assert row.passed is True  # the median, not the worst run, is judged
    assert row.details["ratios"] == [1.0, 3.0, 1.2]
    table = Report(quick=True, rows=[row]).table()
    assert "1.00-3.00" in table and "runs' ratios" in table


def test_cpu_rows_give_client_engine_and_for_a_fan_out_their_total() -> None:
    ctl = [Cpu(100.0, 300.0, 200.0), Cpu(110.0, 330.0, 210.0)]
    base = [Cpu(50.0, 150.0, 100.0), Cpu(50.0, 150.0, 100.0)]
    rows = cpu_rows("fanout", "fan", ctl, base, "peer", per="fan-out", engines=3,
                    total_target=Target("<=", 1.25))
    assert [r.scenario for r in rows] == [
        "fan: client CPU per fan-out (all threads)",
        "fan: engine CPU per fan-out (3 engines, all threads)",
        "fan: total CPU per fan-out (client + 3 engines)"]
    client, engine, total = rows
    assert client.ratio == pytest.approx(2.1) and engine.ratio == pytest.approx(2.1)
    assert total.ctlwire == pytest.approx(420.0) and total.passed is False
    assert engine.details["ctlwire_per_request_runs_us"] == [100.0, 110.0]
    assert engine.details["baseline_main_threads_runs_us"] == [100.0, 100.0]
    assert len(cpu_rows("latency", "seq", ctl, base, "peer")) == 2  # no total asked


@pytest.fixture(scope="module")
def protocol_engine() -> Iterator[tuple[str, int]]:
    with FleetPool() as pool:
        pool.module("peer", "ctlwire.benchmarks.protocol_engine",
                    lambda rank: ["--connect", pool.address("peer")])
        pool.start("peer")
        yield pool.address("peer"), pool.pids("peer")[0]


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_the_protocol_loop_answers_a_control_client_and_its_cpu_is_read(
        protocol_engine: tuple[str, int]) -> None:
    address, pid = protocol_engine
    async with ControlClient(ZmqRouterClientTransport(address), ranks=1,
                             default_timeout=10.0) as ctl:
        await ctl.wait_ready(timeout=20)
        meter = CpuMeter([pid])
        meter.start()
        for i in range(50):
            assert await ctl.call("echo", {"i": i}, rank=0) == {"i": i}
        cpu = meter.per_op(50)
        assert cpu.engine_us > 0 and cpu.engine_main_us > 0
        with pytest.raises(RemoteError) as err:
            await ctl.call("no_such_method", rank=0)
        assert err.value.type_name == "UnknownMethod"
        # it keeps the rank by its heartbeats: still answering after several intervals
        await anyio.sleep(1.5)
        assert await ctl.call("echo", 1, rank=0) == 1
