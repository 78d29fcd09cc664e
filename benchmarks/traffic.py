"""Shared pieces of the soak, load and reliability runs: traffic, tallies, gauges.

:func:`drive` runs ``calls`` control calls from ``workers`` concurrent tasks
against a :class:`ControlClient` and sorts every outcome into a
:class:`Tally`. A call that produces no outcome within its timeout plus a
grace period is counted as *lost* (ctlwire promises it never happens); an
outcome of a type the workload cannot produce is *unexpected*.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.errors import (
    CtlwireError,
    EngineDead,
    FanOutFailed,
    RemoteError,
    RequestTimedOut,
)
from ctlwire.states import PeerState

__all__ = [
    "EXPECTED",
    "Gauges",
    "Tally",
    "Workload",
    "accounting_problems",
    "drive",
    "leaked_entries",
    "outcome_name",
    "private_dir",
    "rss_bytes",
    "wait_live",
    "wait_lost",
]

EXPECTED = ("ok", "RemoteError", "RequestTimedOut", "EngineDead", "FanOutFailed")
"""Outcomes a workload of echo/fail calls and echo fan-outs may legitimately see."""


def outcome_name(exc: BaseException) -> str:
    """The outcome column of an error: ``EngineDead`` for it and its refinements
    (``NotDelivered``, ``OutcomeUnknown``), else the class name."""
    return "EngineDead" if isinstance(exc, EngineDead) else type(exc).__name__


def accounting_problems(sent: int, outcomes: Mapping[str, int], unexpected: Mapping[str, int],
                        lost: int, leaked: int, samples: Sequence[str]) -> list[str]:
    """What is wrong with a run's accounting: every call sent must end in exactly
    one outcome, none lost, none unexpected, no request-map entry left."""
    out = []
    settled = sum(outcomes.values()) + sum(unexpected.values()) + lost
    if settled != sent:
        out.append(f"{sent} calls sent but {settled} outcomes")
    if lost:
        out.append(f"{lost} calls lost (no outcome)")
    if leaked:
        out.append(f"{leaked} request-map entries leaked")
    if unexpected:
        out.append(f"unexpected outcomes {dict(unexpected)}: {list(samples[:3])}")
    return out


def rss_bytes() -> int:
    """Resident set size of this process (``/proc/self/statm``; 0 where absent)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@contextmanager
def private_dir(prefix: str = "ctlwire-soak-") -> Iterator[str]:
    """A ``0700`` temporary directory for ipc sockets, removed afterwards."""
    d = tempfile.mkdtemp(prefix=prefix)
    os.chmod(d, 0o700)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@dataclass
class Workload:
    """What :func:`drive` sends: ``echo(n)`` to one rank, except every
    ``fail_every``-th call (``fail``: a RemoteError is the expected outcome)
    and every ``fan_out_every``-th (an ``echo`` fan-out to all ranks, queueing)."""

    calls: int
    workers: int = 128
    timeout: float = 1.0
    grace: float = 5.0
    fail_every: int = 0
    fan_out_every: int = 0


@dataclass
class Tally:
    """Outcomes of a run: every call sent ends in exactly one of
    ``outcomes`` (by type), ``unexpected`` or ``lost``."""

    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    unexpected: Counter[str] = field(default_factory=Counter)
    samples: list[str] = field(default_factory=list)
    lost: int = 0
    forged: int = 0  # results that were not the engine's (a forged reply accepted)

    @property
    def settled(self) -> int:
        return sum(self.outcomes.values()) + sum(self.unexpected.values()) + self.lost

    def odd(self, kind: str, detail: str) -> None:
        self.unexpected[kind] += 1
        if len(self.samples) < 10:
            self.samples.append(f"{kind}: {detail}")


@dataclass
class Gauges:
    """Peaks of the client's request map and tombstones, sampled while running."""

    max_live: int = 0
    max_tombstones: int = 0
    samples: int = 0

    async def watch(self, client: ControlClient, every: float = 0.02) -> None:
        reg = client.registry
        while True:
            self.sample(client)
            self.max_tombstones = max(self.max_tombstones, reg.tombstone_count)
            await anyio.sleep(every)

    def sample(self, client: ControlClient) -> None:
        self.samples += 1
        self.max_live = max(self.max_live, client.registry.live_count)


def leaked_entries(client: ControlClient) -> int:
    """Request-map entries and queued mailbox callers left behind (must be 0 once idle)."""
    reg = client.registry
    stranded = reg.stats.registered - reg.stats.cleaned
    depth = sum(int(n) for n in client.metrics()["mailbox_depth"].values())
    return max(reg.live_count, stranded) + depth


async def _one(client: ControlClient, work: Workload, tally: Tally, n: int) -> None:
    ranks = client.ranks
    live = [r for r in ranks if not client.peers.is_lost(r)] or list(ranks)
    rank = live[n % len(live)]
    fan_out = bool(work.fan_out_every) and n % work.fan_out_every == 0
    fail = not fan_out and bool(work.fail_every) and n % work.fail_every == 0
    kind = ""
    with anyio.move_on_after(work.timeout + work.grace) as guard:
        try:
            if fan_out:
                res = await client.fan_out("echo", n, timeout=work.timeout)
                wrong = {r: v for r, v in res.results.items() if v != n}
                tally.forged += sum(1 for v in wrong.values() if v == "FORGED")
                if wrong:
                    tally.odd("WrongValue", f"fan-out {n} got {wrong}")
                    return
            elif fail:
                await client.call("fail", "soak", rank=rank, timeout=work.timeout)
                tally.odd("NoError", f"fail() on rank {rank} returned")
                return
            else:
                value = await client.call("echo", n, rank=rank, timeout=work.timeout)
                if value != n:
                    tally.forged += value == "FORGED"
                    tally.odd("WrongValue", f"echo {n} on rank {rank} returned {value!r}")
                    return
            kind = "ok"
        except RemoteError as exc:
            if not fail or exc.type_name != "RuntimeError":
                tally.odd(f"RemoteError:{exc.type_name}", str(exc))
                return
            kind = "RemoteError"
        except (RequestTimedOut, EngineDead, FanOutFailed) as exc:
            kind = outcome_name(exc)
        except CtlwireError as exc:
            tally.odd(type(exc).__name__, str(exc))
            return
        except Exception as exc:  # anything else is a bug: count it, keep going
            tally.odd(type(exc).__name__, repr(exc))
            return
    if guard.cancelled_caught:
        tally.lost += 1
        if len(tally.samples) < 10:
            tally.samples.append(f"lost: call {n} to rank {rank} had no outcome")
    else:
        tally.outcomes[kind] += 1


async def drive(client: ControlClient, work: Workload, tally: Tally, *,
                keep_going: Callable[[], bool] | None = None,
                on_progress: Callable[[int], Any] | None = None) -> float:
    """Send ``work.calls`` calls (and more while ``keep_going()``); returns the
    seconds it took. ``on_progress(n)`` is called as call ``n`` is sent."""

    async def worker() -> None:
        while True:
            n = tally.sent
            if n >= work.calls and (keep_going is None or not keep_going()):
                return
            tally.sent += 1
            if on_progress is not None:
                on_progress(n)
            await _one(client, work, tally, n)

    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for _ in range(work.workers):
            tg.start_soon(worker)
    return anyio.current_time() - start


async def wait_lost(client: ControlClient, rank: int, since: float, limit: float = 10.0
                    ) -> float | None:
    """Seconds from ``since`` (anyio clock) until ``rank`` was marked Lost; None if
    not within ``limit``."""
    with anyio.move_on_after(limit):
        while client.peers.state(rank) is not PeerState.LOST:
            await anyio.sleep(0.002)
        lost_at = client.peers.peers[rank].lost_at
        return (lost_at if lost_at is not None else anyio.current_time()) - since
    return None


async def wait_live(client: ControlClient, rank: int, since: float, limit: float = 15.0
                    ) -> float | None:
    """Seconds from ``since`` until ``rank`` is live again; None if not within ``limit``."""
    try:
        await client.wait_ready([rank], timeout=limit)
    except RequestTimedOut:
        return None
    return anyio.current_time() - since
