"""``python -m ctlwire.benchmarks.placement``: pinning reaches every thread of a
process, each layout is measured on both stacks, a layout the machine cannot
have is a usage error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ctlwire.benchmarks import placement

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

_THREADS = """
import threading, time
for _ in range(3):
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
print("up", flush=True)
time.sleep(30)
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs to tell pinning apart")
def test_pin_process_pins_every_thread_of_the_process() -> None:
    proc = subprocess.Popen([sys.executable, "-c", _THREADS], stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task")]
        assert len(tids) >= 4
        placement.pin_process(proc.pid, {0})
        placement.pin_process(proc.pid, {1})
        assert {t: os.sched_getaffinity(t) for t in tids} == {t: {1} for t in tids}
    finally:
        proc.kill()
        proc.wait()


def test_measure_runs_both_stacks_under_each_layout() -> None:
    before = os.sched_getaffinity(0)
    results = placement.measure(["all/all", "0/0"], blocks=2, calls=20, warmup=5)
    assert [r.layout for r in results] == ["all/all", "0/0"]
    for r in results:
        assert len(r.ctl) == len(r.base) == 2
        assert all(0 < x < 1e6 for x in r.ctl + r.base)
        assert r.layout in r.line() and "ratio" in r.line()
    # this process's threads have their affinity back (the layouts pinned them)
    assert {int(t): os.sched_getaffinity(int(t)) for t in os.listdir("/proc/self/task")
            if _alive(int(t))} == {int(t): before for t in os.listdir("/proc/self/task")
                                   if _alive(int(t))}


def _alive(tid: int) -> bool:
    try:
        os.sched_getaffinity(tid)
    except ProcessLookupError:
        return False
    return True


def test_a_layout_beyond_the_machine_is_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        placement.main(["0/99"])
    assert info.value.code == 2
    assert "CPU(s)" in capsys.readouterr().err
