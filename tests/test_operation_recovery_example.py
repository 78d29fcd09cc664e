"""examples/operation_recovery.py runs: a controller dies mid-operation, its successor
finishes it (real engine processes, both backends)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "operation_recovery.py"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_operation_recovery_example(backend: str) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLE), "--engines", "3", "--backend", backend],
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "controller died after the update" in out.stdout
    assert "roll_forward" in out.stdout and " committed:" in out.stdout
    assert out.stdout.rstrip().endswith("OK")
