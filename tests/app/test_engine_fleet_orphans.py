"""Engines started by an ``EngineFleet`` stop by themselves when the process that
started them dies without stopping them (kill -9 of the launcher)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

LAUNCHER = """
import sys, time
from ctlwire.app.engine_fleet import EngineFleet
fleet = EngineFleet([0, 1], lambda r: ["--connect", sys.argv[1], "--mode", sys.argv[2]])
fleet.start()
print(" ".join(str(e.proc.pid) for e in fleet.engines.values()), flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("mode", ["poll", "serve"])
def test_engines_stop_when_their_launcher_is_killed(tmp_path: Path, mode: str) -> None:
    pids: list[int] = []
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, f"ipc://{tmp_path}/nobody.sock", mode],
        stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        pids += [int(p) for p in launcher.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        launcher.send_signal(signal.SIGKILL)  # no chance to stop its engines
        launcher.wait()
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in pids), "engines outlived their launcher"
    finally:
        launcher.kill()
        launcher.wait()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
