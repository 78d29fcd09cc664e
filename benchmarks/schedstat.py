"""On-CPU time of whole processes, every thread, from ``/proc/<pid>/task/*/schedstat``.

The first field of a thread's ``schedstat`` is the nanoseconds it has run on a
CPU (the scheduler's own sum, the clock behind ``time.thread_time``), read from
outside the thread: a process's event-loop or poll-loop thread, its libzmq I/O
and reaper threads, a beacon thread, all alike. ``/proc/<pid>/stat`` counts in
clock ticks (10 ms), too coarse for a few thousand requests.

:func:`read` takes one reading of some processes; :func:`cpu_ns` says how much
CPU they used between two readings. A thread that started in between counts from
zero; one that ended in between is lost, and :attr:`CpuDelta.threads_ended`
counts such threads, so that a measurement that lost some can say so.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["CpuDelta", "CpuReading", "cpu_ns", "read"]


@dataclass(frozen=True)
class CpuReading:
    """On-CPU nanoseconds so far of every thread of some processes, by ``(pid, tid)``."""

    threads: dict[tuple[int, int], int]


@dataclass(frozen=True)
class CpuDelta:
    """CPU used between two readings: in all, by the processes' main threads (the
    thread whose id is the process's), and how many threads ended in between."""

    total_ns: int
    main_ns: int
    threads_ended: int

    @property
    def other_ns(self) -> int:
        """The threads other than the main ones (libzmq's, a beacon's, ...)."""
        return self.total_ns - self.main_ns


def _thread_ns(pid: int) -> dict[tuple[int, int], int]:
    out: dict[tuple[int, int], int] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:  # the process is gone: nothing of it to read
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as f:
                out[(pid, int(tid))] = int(f.read().split(maxsplit=1)[0])
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return out


def read(pids: Iterable[int]) -> CpuReading:
    """One reading of every thread of the processes ``pids`` (``os.getpid()`` for this one).

    :raises OSError: on a system without ``/proc/<pid>/task/<tid>/schedstat``
        (the kernel's schedstats/sched_info).
    """
    threads: dict[tuple[int, int], int] = {}
    for pid in pids:
        threads.update(_thread_ns(pid))
    return CpuReading(threads)


def cpu_ns(before: CpuReading, after: CpuReading) -> CpuDelta:
    """The CPU the threads in ``after`` used since ``before`` (new ones since their start)."""
    total = main = 0
    for (pid, tid), ns in after.threads.items():
        used = ns - before.threads.get((pid, tid), 0)
        total += used
        if tid == pid:
            main += used
    ended = sum(1 for key in before.threads if key not in after.threads)
    return CpuDelta(total, main, ended)
