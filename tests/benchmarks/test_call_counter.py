"""The call counter of ``fanout_profile``: calls, C calls and task steps, exactly."""

from __future__ import annotations

import anyio
import pytest

from ctlwire.benchmarks.call_counter import CallCounter, Counts


def _leaf() -> int:
    return len("x")


def test_counts_each_python_call_and_c_call() -> None:
    with CallCounter() as counter:
        for _ in range(10):
            _leaf()
    counts = counter.counts
    assert sum(n for name, n in counts.by_function.items() if name.endswith(" _leaf")) == 10
    assert counts.py_calls >= 10
    assert counts.c_calls >= 10  # len() each time
    assert counts.task_steps == 0  # no coroutine ran


@pytest.mark.anyio
async def test_task_steps_are_the_scheduler_resuming_a_task() -> None:
    """Each checkpoint of a task is one step more; awaiting a coroutine inside a
    task is not a step of its own."""
    async def nested() -> None:
        await anyio.sleep(0)

    async def worker() -> None:
        for _ in range(20):
            await nested()

    async with anyio.create_task_group() as tg:
        with CallCounter() as counter:
            tg.start_soon(worker)
            await anyio.wait_all_tasks_blocked()
    steps = counter.counts.task_steps
    assert 20 <= steps <= 30  # one per sleep(0), plus the start and a few of the loop's own


def test_counts_add_up_and_survive_json() -> None:
    a = Counts(3, 4, 1)
    a.by_function["f"] = 3
    b = Counts.from_json((a + a).to_json())
    assert (b.py_calls, b.c_calls, b.task_steps, b.by_function["f"]) == (6, 8, 2, 6)
    c = Counts.from_json((Counts(bytecodes=5) + Counts(bytecodes=7)).to_json())
    assert c.bytecodes == 12


def _loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def test_counts_bytecodes_in_proportion_to_the_work_and_in_running_frames() -> None:
    with CallCounter() as counter:
        _loop(10)
    ten = counter.counts.bytecodes
    with CallCounter() as counter:
        _loop(110)
    assert counter.counts.bytecodes - ten >= 100 * 4  # at least FOR_ITER, STORE, LOAD, ADD a round
    # the frame that started the count is counted from there on, and stops with it
    with CallCounter() as counter:
        x = 0
        for i in range(50):
            x += i
    assert counter.counts.bytecodes >= 50 * 4
    assert counter.counts.py_calls <= 2  # stop() itself, nothing else called


def test_counting_stops_with_stop() -> None:
    counter = CallCounter()
    counter.start()
    counter.stop()
    before = counter.counts.bytecodes
    _loop(100)
    assert counter.counts.bytecodes == before
