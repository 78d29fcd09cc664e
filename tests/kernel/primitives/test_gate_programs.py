"""The primitives page's asyncio and trio programs use the admission gate in under ten
lines, and run (each on its own backend), admitting every caller."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[3] / "docs" / "primitives.md"


def program(title: str) -> str:
    match = re.search(rf'```python title="{title}"\n(.*?)^```', PAGE.read_text(), re.S | re.M)
    assert match is not None, title
    return match.group(1)


def code_lines(source: str) -> list[str]:
    """The lines that do something: no blank line, comment or import."""
    return [line for line in source.splitlines()
            if line.strip() and not line.lstrip().startswith(("#", "import ", "from "))]


@pytest.mark.parametrize("title", ["asyncio program", "trio program"])
def test_the_program_uses_the_gate_in_under_ten_lines_and_runs(title: str,
                                                                tmp_path: Path) -> None:
    source = program(title)
    assert len(code_lines(source)) < 10, code_lines(source)
    assert "AdmissionGate()" in source and "gate.admit(" in source
    script = tmp_path / "program.py"
    script.write_text(source + "\nassert gate.queue.admitted_total == 3 and not gate.busy\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
