"""What ``import ctlwire.kernel`` costs a fresh process: ``ctlwire bench --only import_time``.

``python -X importtime -c "import ctlwire.kernel"`` in fresh interpreters, the
cumulative time of the top-level ``ctlwire`` imports it reports (the
interpreter's own start-up excluded), median of the runs. The baseline, run
alternately with it: the same import followed by reading ``__version__``, which
reads the installed distribution's metadata (``importlib.metadata``) -- what
importing the kernel did when it set ``__version__`` at import. The row also
says whether the plain import loaded ``importlib.metadata`` at all.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass

from .report import Row, Target
from .stats import median

__all__ = ["GROUPS", "ImportTimes", "measure", "rows"]

GROUPS = ("import_time",)
PLAIN = "import ctlwire.kernel"
WITH_VERSION = "import ctlwire.kernel; ctlwire.kernel.__version__"
# "import time:  self |  cumulative | name", the name indented by nesting depth
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)$")


@dataclass
class ImportTimes:
    """Microseconds per run of each command, and whether the plain import loaded
    ``importlib.metadata``."""

    plain_us: list[float]
    with_version_us: list[float]
    plain_reads_metadata: bool


def _run(code: str) -> tuple[float, set[str]]:
    """One fresh interpreter: the cumulative µs of its top-level ctlwire imports,
    and every module it imported."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code],
                          capture_output=True, text=True, timeout=60, check=True)
    total = 0.0
    names: set[str] = set()
    for line in done.stderr.splitlines():
        m = _LINE.match(line)
        if m is None:
            continue
        names.add(m.group(4))
        if m.group(3) == " " and m.group(4).startswith("ctlwire"):  # top level
            total += int(m.group(2))
    return total, names


def measure(runs: int) -> ImportTimes:
    """``runs`` of each command, alternately (a load on the machine hits both)."""
    plain: list[float] = []
    with_version: list[float] = []
    reads = False
    _run(PLAIN)  # bytecode written, files in the page cache
    for _ in range(runs):
        us, names = _run(PLAIN)
        plain.append(us)
        reads = reads or "importlib.metadata" in names
        with_version.append(_run(WITH_VERSION)[0])
    return ImportTimes(plain, with_version, reads)


def rows(quick: bool) -> list[Row]:
    times = measure(7 if quick else 21)
    ctl, base = median(times.plain_us), median(times.with_version_us)
    return [Row("import_time", "import ctlwire.kernel, fresh process (-X importtime)", "µs",
                ctl, base, "the same import, then __version__ (reads the package metadata, "
                "as the import itself once did)", ctl / base,
                "import / import + metadata (lower is better)", Target("<=", 0.5, "<= 0.5x"),
                {"runs": len(times.plain_us), "plain_us": times.plain_us,
                 "with_version_us": times.with_version_us,
                 "import_reads_metadata": times.plain_reads_metadata})]
