"""`ctlwire demo --membership etcd` end to end, run as a user runs it: a real etcd, real
engine processes registering in it, a rank joining and one leaving while the cycles
run — and its etcd frozen (``kill -STOP``) past the leases' TTL mid-run, then thawed
(``kill -CONT``): every cycle still commits, no rank is lost."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

pytestmark = pytest.mark.timeout(120)


def run_demo_freezing_its_etcd(backend: str, freeze: float) -> tuple[int, str]:
    """Run the demo; once its first cycle is reported, SIGSTOP its etcd for ``freeze``
    seconds. Its exit code and output."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ctlwire.app.cli", "demo", "--membership", "etcd",
         "--engines", "3", "--cycles", "4", "--etcd-ttl", "1", "--backend", backend],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.stdout is not None
    lines: list[str] = []
    pid = 0
    try:
        for line in proc.stdout:
            lines.append(line)
            if m := re.match(r"etcd at \S+ \(pid (\d+),", line):
                pid = int(m.group(1))
            if line.startswith("cycle  1/4:") and pid:
                os.kill(pid, signal.SIGSTOP)
                thaw = threading.Timer(freeze, os.kill, (pid, signal.SIGCONT))
                thaw.start()
                lines.append(f"(test: etcd frozen at {time.monotonic():.1f})\n")
        return proc.wait(timeout=60), "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(shutil.which("etcd") is None,
                    reason="the etcd binary is not installed (Debian: apt-get install etcd-server)")
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_membership_demo_commits_every_cycle_while_a_rank_joins_one_leaves_and_etcd_freezes(
        backend: str) -> None:
    code, text = run_demo_freezing_its_etcd(backend, freeze=2.0)
    assert code == 0, text
    assert "test: etcd frozen" in text, text
    assert re.search(r"rank 3 joined .*admissible \[0, 1, 2\] \(left out 3: not admitted\)",
                     text), text
    assert "rank 3 brought to weight version 1 and admitted" in text, text
    assert re.search(r"rank 0 left .*present \[1, 2, 3\]", text), text
    assert len(re.findall(r"-> weight version \d committed on", text)) == 4, text
    assert "joined [3], left [0]; 4/4 cycles committed" in text, text
    assert "{1: 4, 2: 4, 3: 4}" in text and text.rstrip().endswith("OK"), text
    # the leases expired at the thaw: the live ranks registered again, none was removed
    # but the one that left
    m = re.search(r"registrations lost (\d+) and restored (\d+); ranks removed (\d+) "
                  r"\(dead (\d+)\)", text)
    assert m is not None, text
    lost, restored, removed, dead = map(int, m.groups())
    assert lost >= 3 and restored == lost and (removed, dead) == (1, 0), text
