"""``python -m ctlwire.benchmarks.engine_cpu`` runs: every variant serves the load
process's requests to the end and gets its line (a variant that dies leaves the
load waiting for replies, and this test to its timeout). Run as the command a
user types: its spawned load process and their resource tracker end with it."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from ctlwire.benchmarks.engine_cpu import VARIANTS

pytestmark = pytest.mark.timeout(120)


def test_every_variant_serves_the_whole_load_and_reports_its_cpu_per_request() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ctlwire.benchmarks.engine_cpu", "--n", "300", "--window", "4",
         "--repeat", "1"], capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^(\S+)\s+([\d.]+) µs CPU/request", done.stdout, re.M)}
    assert sorted(lines) == sorted(VARIANTS), done.stdout
    assert all(us > 0 for us in lines.values()), lines
