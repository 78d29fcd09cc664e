"""The membership store as a faulty component of :mod:`ctlwire.testing.operation_simulation`.

An etcd-like store in virtual time — keys under leases, revisions, a watch that
replays from a revision, a lessor that expires leases, conditional puts — and
its faults, drawn from the run's seed: **down** (unreachable; leases expire
meanwhile, and the history may be compacted), **frozen** (requests wait; at
thaw the lessor runs first, so every lease that was not kept alive expires at
once), **slow** (answers late, past the callers' timeouts, and the writes still
apply), **lost watch events** (a watch that goes silently stale) and **a lease
revoked while its rank lives**. Who uses it: :mod:`ctlwire.testing.simulated_membership`.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from ctlwire.kernel.errors import CtlwireError

__all__ = ["Entry", "SimStore", "StoreConfig", "StoreError", "StoreWorld", "Watcher"]


@dataclass(frozen=True)
class StoreConfig:
    ttl: float = 2.0  # lease TTL of every registration
    fault: float = 0.7  # chance that a run has store faults (one or two)
    lost_event: float = 0.3  # while events are lost: chance each event is not delivered
    watch_round: float = 1.0
    relist_interval: float = 3.0
    retry_interval: float = 0.3
    detect: float = 1.0  # liveness: lost this long after the process died or was cut off
    latency: float = 0.01


class StoreError(CtlwireError):
    """The store answered with an error (a lease not found, a compacted revision)."""


class StoreWorld(Protocol):
    """What the store's actors use of the simulation."""

    now: float
    rng: random.Random

    def at(self, when: float, fn: Callable[[], None]) -> None: ...
    def log(self, line: str) -> None: ...
    def violate(self, message: str) -> None: ...
    def reachable(self, rank: int) -> bool: ...
    def incarnation(self, rank: int) -> int | None: ...
    def fail_calls(self, rank: int, cause: str, detail: str) -> None: ...


Entry = tuple[int, int, int]
"""A key's registration: (incarnation, lease, mod revision)."""

Record = tuple[int, int, Entry | None]
"""One change in the store's history: (revision, rank, entry; None when deleted)."""


class Watcher(Protocol):
    """What the store delivers a watch's events to (under its subscription number)."""

    def event(self, sub: int, record: Record, prev: Entry | None) -> None: ...
    def stream_broken(self, sub: int | None = None) -> None: ...


class SimStore:
    """The etcd-like store; its faults are known in advance (drawn at the start)."""

    def __init__(self, sim: StoreWorld, cfg: StoreConfig, until: float) -> None:
        self.sim = sim
        self.cfg = cfg
        self.until = until
        self.revision = 1
        self.keys: dict[int, Entry] = {}
        self.leases: dict[int, float] = {}  # lease -> expiry
        self.history: list[Record] = []  # (revision, rank, entry)
        self.compacted = 0
        self.watchers: dict[Watcher, int] = {}  # watcher -> its subscription
        self.faults: list[tuple[str, float, float]] = []
        self._ids = itertools.count(1000)
        self._frozen_queue: list[Callable[[], None]] = []

    # -- faults -----------------------------------------------------------------------
    def _fault(self, kind: str, t: float | None = None) -> tuple[float, float] | None:
        now = self.sim.now if t is None else t
        for k, start, end in self.faults:
            if k == kind and start <= now < end:
                return start, end
        return None

    def add_fault(self, kind: str, start: float, end: float) -> None:
        self.faults.append((kind, start, end))
        self.sim.log(f"store {kind} from {start:.3f} to {end:.3f}")
        if kind == "frozen":
            self.sim.at(end, self._thaw)
        elif kind == "down":
            self.sim.at(start, self._break_watches)
            if self.sim.rng.random() < 0.3:
                self.sim.at(end, self._compact)
        elif kind == "lease_revoked":
            self.sim.at(start, self._revoke_one)

    def _thaw(self) -> None:
        self._expire()  # the lessor catches up first
        queued, self._frozen_queue = self._frozen_queue, []
        for run in queued:
            run()

    def _compact(self) -> None:
        self.compacted = self.revision
        self.history.clear()

    def _break_watches(self) -> None:
        for w, sub in list(self.watchers.items()):
            self.unsubscribe(w)
            self.sim.at(self.sim.now + self.cfg.latency, partial(w.stream_broken, sub))

    def _revoke_one(self) -> None:
        if self.keys:
            rank = self.sim.rng.choice(sorted(self.keys))
            self.sim.log(f"store: the lease of rank {rank} is revoked while it lives")
            self._revoke(self.keys[rank][1])

    # -- the lessor ---------------------------------------------------------------------
    def start(self) -> None:
        self._tick()

    def _tick(self) -> None:
        if self.sim.now >= self.until:
            return
        if self._fault("frozen") is None:
            self._expire()
        self.sim.at(self.sim.now + 0.5, self._tick)

    def _expire(self) -> None:
        for lease, expiry in sorted(self.leases.items()):
            if expiry <= self.sim.now:
                self._revoke(lease)

    def _revoke(self, lease: int) -> None:
        self.leases.pop(lease, None)
        for rank, entry in sorted(self.keys.items()):
            if entry[1] == lease:
                self._write(rank, None)

    def _write(self, rank: int, entry: Entry | None) -> None:
        self.revision += 1
        prev_entry: Entry | None = None
        if entry is None:
            prev_entry = self.keys.pop(rank)
        else:
            entry = (entry[0], entry[1], self.revision)
            self.keys[rank] = entry
        record = (self.revision, rank, entry)
        self.history.append(record)
        lossy = self._fault("lost_events") is not None
        for w, sub in list(self.watchers.items()):
            if lossy and self.sim.rng.random() < self.cfg.lost_event:
                continue  # the watch goes silently stale
            self._deliver(w, sub, record, prev_entry)

    def _deliver(self, w: Watcher, sub: int, record: Record,
                 prev: Entry | None) -> None:
        self.sim.at(self.sim.now + self.cfg.latency, lambda: w.event(sub, record, prev))

    # -- requests -----------------------------------------------------------------------
    def request(self, op: Callable[[], Any], on_reply: Callable[[Any], None],
                on_error: Callable[[str], None], timeout: float, sender: int | None = None
                ) -> None:
        """``op`` runs at the store when the request reaches it (at thaw, if frozen;
        never, if down or the sender is cut off); the caller gets its answer, or an
        error at ``timeout``."""
        sim, cfg = self.sim, self.cfg
        done = [False]

        def finish(fn: Callable[[], None]) -> None:
            if not done[0]:
                done[0] = True
                fn()

        sim.at(sim.now + timeout, lambda: finish(lambda: on_error("timeout")))
        if sender is not None and not sim.reachable(sender):
            return
        if self._fault("down") is not None:
            return
        slow = self._fault("slow")
        delay = sim.rng.uniform(0.1, 1.0) * timeout * 2 if slow else 0.0

        def arrive() -> None:
            def run() -> None:
                try:
                    value = op()
                except StoreError as exc:
                    why = str(exc)
                    sim.at(sim.now + cfg.latency, lambda: finish(lambda: on_error(why)))
                    return
                sim.at(sim.now + cfg.latency, lambda: finish(lambda: on_reply(value)))

            if self._fault("down") is not None:
                return
            if self._fault("frozen") is not None:
                self._frozen_queue.append(run)
            else:
                run()

        sim.at(sim.now + cfg.latency + delay, arrive)

    # -- operations (run at the store) --------------------------------------------------
    def grant(self) -> int:
        lease = next(self._ids)
        self.leases[lease] = self.sim.now + self.cfg.ttl
        return lease

    def keep_alive(self, lease: int) -> float:
        if lease not in self.leases:
            return 0.0
        self.leases[lease] = self.sim.now + self.cfg.ttl
        return self.cfg.ttl

    def put_if(self, rank: int, incarnation: int, lease: int, mod_revision: int) -> bool:
        """Put only if the key was last modified at ``mod_revision`` (0: absent)."""
        if lease not in self.leases:
            raise StoreError("lease not found")
        current = self.keys.get(rank)
        if (current[2] if current else 0) != mod_revision:
            return False
        self._write(rank, (incarnation, lease, 0))
        return True

    def get(self, rank: int) -> Entry | None:
        return self.keys.get(rank)

    def lease_alive(self, lease: int) -> bool:
        return lease in self.leases

    def listing(self) -> tuple[int, dict[int, Entry]]:
        return self.revision, dict(self.keys)

    def subscribe(self, w: Watcher, sub: int, start: int) -> None:
        if start <= self.compacted:
            raise StoreError("compacted")
        if self.watchers.get(w, 0) > sub:
            return  # a newer subscription of this watcher got here first
        for record in self.history:
            if record[0] >= start:
                prev = None
                if record[2] is None:  # the deleted entry, from the record before it
                    prev = next((r[2] for r in reversed(self.history)
                                 if r[1] == record[1] and r[0] < record[0]), None)
                self._deliver(w, sub, record, prev)
        self.watchers[w] = sub

    def unsubscribe(self, w: Watcher) -> None:
        self.watchers.pop(w, None)

    def probe(self) -> int:
        return self.revision
