"""CPU time the hypervisor took from this machine while the bench ran.

A virtual machine's vCPUs are threads on a host; when the host is busy, a vCPU
that wants to run waits, and Linux counts that wait as *steal* (``/proc/stat``,
the eighth value of the ``cpu`` line). The load average does not show it: a
2-core guest with load 2 can be getting half its CPU or all of it. Every ratio
of ``ctlwire bench`` compares two sides measured alternately in the same run,
but a round trip between processes on a host that comes and goes is a
different measurement from one on a quiet machine (the two sides' ratio moved
by 0.3-3x between paired rounds at 25-40 % steal), so the report states the
steal during each group and the whole run: a ratio measured at 30 % steal is
not a quiet-machine figure.

Steal is reported as a share of the CPU time that passed (all cores), in
percent; None where ``/proc/stat`` does not exist or has no steal column.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["CpuTimes", "parse_proc_stat", "read_cpu_times", "steal_percent"]

_PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class CpuTimes:
    """The machine-wide CPU counters (clock ticks, all cores): every state's
    total and the part of it that was steal."""

    total: int
    steal: int


def parse_proc_stat(text: str) -> CpuTimes | None:
    """The ``cpu`` (all cores) line of ``/proc/stat``'s text; None without one
    that has a steal column (kernels before 2.6.11)."""
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0] != "cpu":
            continue
        try:
            values = [int(v) for v in fields[1:]]
        except ValueError:
            return None
        if len(values) < 8:
            return None
        # user nice system idle iowait irq softirq steal [guest guest_nice]: guest
        # time is already counted in user and nice, so it is not added again
        return CpuTimes(total=sum(values[:8]), steal=values[7])
    return None


def read_cpu_times() -> CpuTimes | None:
    """This machine's counters now (None where ``/proc/stat`` cannot be read)."""
    try:
        return parse_proc_stat(_PROC_STAT.read_text())
    except OSError:
        return None


def steal_percent(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """Steal between two readings, in percent of the CPU time between them; None
    when either reading is missing or no time passed."""
    if before is None or after is None:
        return None
    elapsed = after.total - before.total
    if elapsed <= 0:
        return None
    return 100.0 * max(0, after.steal - before.steal) / elapsed
