"""Registrations, the controller's watcher and its liveness, over the simulated
store (:mod:`ctlwire.testing.simulated_store`), for
:mod:`ctlwire.testing.operation_simulation`.

Each engine process's registration does the rounds of
:class:`~ctlwire.kernel.membership.etcd_registration.EtcdRegistration` (read the key back,
keep the lease alive every ``ttl / 3``, register again under the same
incarnation when the lease is lost, write only on the revision read); the
controller's watcher does what
:class:`~ctlwire.kernel.membership.etcd_membership.EtcdMembership` does (list, watch from a
revision, probe the watch every half round, resume from the last revision
applied, list again on compaction and every ``relist_interval``, tell a lease
loss from a removal by asking whether the lease lives), feeding the **real**
:class:`~ctlwire.kernel.core.membership.Membership`; the controller's liveness
loses a rank ``detect`` seconds after its process died or was cut off and hears
it again shortly after it is back.

The property it checks (through the world's ``fail_calls``): **no call to a live
rank fails because of the store** — a call whose process is alive and reachable
is never failed by a membership removal. And once the faults are over, the view
converges: every rank alive long enough is present with its incarnation and
registered, every rank dead long enough is gone.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from ctlwire.kernel.core.membership import Membership, MembershipChange, MembershipEvent
from ctlwire.states import MemberState
from ctlwire.testing.simulated_store import (
    Entry,
    SimStore,
    StoreConfig,
    StoreWorld,
)

__all__ = ["SimRegistration", "SimWatcher", "StoreFleet"]


class SimRegistration:
    """One engine process's registration (its incarnation), until the process dies:
    the rounds of :class:`~ctlwire.kernel.membership.etcd_registration.EtcdRegistration`."""

    def __init__(self, fleet: StoreFleet, rank: int, incarnation: int) -> None:
        self.fleet = fleet
        self.rank = rank
        self.incarnation = incarnation
        self.lease = 0

    def _current(self) -> bool:
        sim = self.fleet.sim
        return sim.now < self.fleet.store.until and sim.incarnation(self.rank) == self.incarnation

    def _again(self, wait: float) -> None:
        self.fleet.sim.at(self.fleet.sim.now + wait, self.round)

    def _failed(self, why: str) -> None:
        self._again(self.fleet.cfg.retry_interval)

    def _request(self, op: Callable[[], Any], then: Callable[[Any], None]) -> None:
        self.fleet.store.request(op, then, self._failed, self.fleet.cfg.ttl / 3, self.rank)

    def round(self) -> None:
        """Read the key back, then keep the lease alive (a key gone under a lease that
        lives after it was gone was deleted, not expired)."""
        if not self._current():
            return
        store = self.fleet.store
        if not self.lease:
            self._request(lambda: store.get(self.rank), self._register)
            return

        def read(entry: Entry | None) -> None:
            def kept(ttl: float) -> None:
                if ttl <= 0:  # lost: register again at once, same incarnation
                    self.lease = 0
                    self.round()
                else:
                    self._check(entry)

            self._request(lambda: store.keep_alive(self.lease), kept)

        self._request(lambda: store.get(self.rank), read)

    def _register(self, entry: Entry | None) -> None:
        if entry is not None and entry[0] > self.incarnation:
            return  # superseded
        store = self.fleet.store
        expect = entry[2] if entry else 0

        def granted(lease: int) -> None:
            self._request(lambda: store.put_if(self.rank, self.incarnation, lease, expect),
                          lambda ok: self._registered(lease, ok))

        self._request(store.grant, granted)

    def _registered(self, lease: int, ok: bool) -> None:
        if not ok:
            self._failed("changed while registering")
            return
        self.lease = lease
        self._again(self.fleet.cfg.ttl / 3)

    def _check(self, entry: Entry | None) -> None:
        """The key read back: gone while the lease lives is an explicit removal (the
        registration stops); an older incarnation's, or another lease, is rewritten."""
        if entry is None:
            self.fleet.sim.log(f"registration of rank {self.rank}: key gone, lease alive")
            return
        if entry[0] > self.incarnation:
            return  # superseded
        if entry[0] < self.incarnation or entry[1] != self.lease:
            store = self.fleet.store
            store.request(lambda: store.put_if(self.rank, self.incarnation, self.lease,
                                               entry[2]), lambda ok: None, lambda why: None,
                          self.fleet.cfg.ttl / 3, self.rank)
        self._again(self.fleet.cfg.ttl / 3)


class SimWatcher:
    """The controller's watcher: feeds the view in store order, one item at a time."""

    def __init__(self, fleet: StoreFleet) -> None:
        self.fleet = fleet
        self.revision = 0
        self.subscription = 0
        self.leases: dict[int, int] = {}  # rank -> lease of its registration last applied
        self._items: list[tuple[Any, ...]] = []
        self._busy = False
        self._listed_at = 0.0
        self._ids = itertools.count(1)

    @property
    def _store(self) -> SimStore:
        return self.fleet.store

    def _active(self) -> bool:
        return self.fleet.sim.now < self._store.until

    # -- list and watch ------------------------------------------------------------------
    def relist(self) -> None:
        if not self._active():
            return
        self._store.unsubscribe(self)
        self.subscription = 0
        cfg = self.fleet.cfg
        self._store.request(self._store.listing, self._listed, lambda why: self._retry(),
                            cfg.watch_round)

    def _retry(self, listing: bool = True) -> None:
        sim = self.fleet.sim
        sim.at(sim.now + self.fleet.cfg.retry_interval, self.relist if listing else self.watch)

    def _listed(self, answer: tuple[int, dict[int, Entry]]) -> None:
        revision, keys = answer
        for rank, (incarnation, lease, mod) in sorted(keys.items()):
            self._items.append(("put", rank, incarnation, lease, mod))
        view = self.fleet.view
        for rank in view.ranks:
            if rank not in keys and view.state(rank) is MemberState.REGISTERED:
                self._items.append(("vanished", rank, revision, self.leases.get(rank), 0))
        self._items.append(("listed", revision))
        self._next()

    def watch(self) -> None:
        """Subscribe from the revision after the last one applied."""
        if not self._active():
            return
        sub = self.subscription = next(self._ids)  # its events are taken from now on
        store, cfg = self._store, self.fleet.cfg

        def subscribed(_: None) -> None:
            if sub == self.subscription:
                self._probe(sub)

        def refused(why: str) -> None:
            if sub != self.subscription:
                return
            self.subscription = 0
            if why == "compacted":
                self.relist()
            else:
                self._retry(listing=False)

        store.request(lambda: store.subscribe(self, sub, self.revision + 1), subscribed,
                      refused, cfg.watch_round)

    def _probe(self, sub: int) -> None:
        sim, cfg = self.fleet.sim, self.fleet.cfg

        def tick() -> None:
            if sub != self.subscription or not self._active():
                return
            if sim.now - self._listed_at >= cfg.relist_interval and not self._busy:
                self.relist()
                return
            self._store.request(self._store.probe, lambda _: tick_later(),
                                lambda why: self.stream_broken(sub), cfg.watch_round / 2)

        def tick_later() -> None:
            sim.at(sim.now + cfg.watch_round / 2, tick)

        tick_later()

    def stream_broken(self, sub: int | None = None) -> None:
        if sub is not None and sub != self.subscription:
            return
        self._store.unsubscribe(self)
        self.subscription = 0
        self._retry(listing=False)

    def event(self, sub: int, record: tuple[int, int, Entry | None],
              prev: Entry | None) -> None:
        if sub != self.subscription:
            return
        revision, rank, entry = record
        if entry is None:
            lease, incarnation = (prev[1], prev[0]) if prev else (self.leases.get(rank), 0)
            self._items.append(("vanished", rank, revision, lease, incarnation))
        else:
            self._items.append(("put", rank, entry[0], entry[1], revision))
        self._items.append(("applied", revision))
        self._next()

    # -- applying, in order ----------------------------------------------------------------
    def _next(self) -> None:
        while self._items and not self._busy:
            item = self._items.pop(0)
            kind = item[0]
            if kind == "put":
                _, rank, incarnation, lease, revision = item
                self._apply(MembershipEvent("add", rank, "", incarnation, revision), lease)
            elif kind == "vanished":
                self._vanished(*item[1:])
            elif kind == "applied":
                self.revision = max(self.revision, item[1])
            else:  # listed
                self.revision = max(self.revision, item[1])
                self._listed_at = self.fleet.sim.now
                self.watch()

    def _vanished(self, rank: int, revision: int, lease: int | None, incarnation: int) -> None:
        if not lease:  # unknown: cannot tell, a loss; none: only a deletion removes it
            self._apply(MembershipEvent("lost" if lease is None else "remove", rank,
                                        incarnation=incarnation, revision=revision))
            return
        self._busy = True
        store = self._store

        def answer(alive: bool) -> None:
            self._busy = False
            self._apply(MembershipEvent("remove" if alive else "lost", rank,
                                        incarnation=incarnation, revision=revision))
            self._next()

        store.request(lambda: store.lease_alive(lease), answer, lambda why: answer(False),
                      self.fleet.cfg.watch_round)

    def _apply(self, event: MembershipEvent, lease: int = 0) -> None:
        change = self.fleet.view.apply(event)
        member = self.fleet.view.get(event.rank)
        if event.kind == "add" and member is not None \
                and member.incarnation == event.incarnation:
            self.leases[event.rank] = lease
        if change is not None:
            self.fleet.changed(change)


class StoreFleet:
    """The store, the registrations, the watcher, the controller's liveness and its
    membership view, for one run."""

    def __init__(self, sim: StoreWorld, ranks: tuple[int, ...], cfg: StoreConfig,
                 membership_factory: Callable[..., Membership] = Membership) -> None:
        self.sim = sim
        self.cfg = cfg
        self.ranks = ranks
        rng = sim.rng
        faults: list[tuple[str, float, float]] = []
        if rng.random() < cfg.fault:
            for _ in range(rng.randint(1, 2)):
                kind = rng.choice(("frozen", "down", "slow", "lost_events", "lease_revoked"))
                start = rng.uniform(0.0, 4.0)
                faults.append((kind, start, start + rng.uniform(0.5, 4.0)))
        # how long a rank must have been steady (alive or dead) for the view to be
        # right about it: a lease expiry, a list, a liveness verdict, a retry
        self.settle = cfg.ttl + cfg.relist_interval + cfg.detect + 1.0
        self.until = max([end for _, _, end in faults] + [5.0]) + self.settle + 1.0
        self.store = SimStore(sim, cfg, self.until)
        for fault in faults:
            self.store.add_fault(*fault)
        #: the controller's liveness: heard from, not lost
        self.alive = dict.fromkeys(ranks, True)
        self.view = membership_factory(ranks, alive=lambda r: self.alive.get(r, False))
        self.watcher = SimWatcher(self)
        self._down_since: dict[int, float] = {}
        self._steady_since = dict.fromkeys(ranks, 0.0)
        self.faults = faults

    def start(self) -> None:
        self.store.start()
        for r in self.ranks:
            self._register(r)
        # the controller starts following the store once the engines have registered
        self.sim.at(0.1, self.watcher.relist)
        self.sim.at(self.until - 0.001, self.check_view)

    def _register(self, rank: int) -> None:
        incarnation = self.sim.incarnation(rank)
        if incarnation is not None:
            SimRegistration(self, rank, incarnation).round()

    # -- what the controller learns -----------------------------------------------------
    def changed(self, change: MembershipChange) -> None:
        if change.member is None:  # removed: its calls fail with the change's reason
            self.sim.log(f"membership: rank {change.rank} removed ({change.reason})")
            self.sim.fail_calls(change.rank, "store", change.reason)
        else:
            self.sim.log(f"membership: rank {change.rank} {change.kind.value}")

    def reachability(self, rank: int) -> None:
        """The rank's process died, came back, or was cut off or reconnected."""
        sim = self.sim
        self._steady_since[rank] = sim.now
        if sim.reachable(rank):
            self._down_since.pop(rank, None)
            sim.at(sim.now + 0.05, lambda: self._heard(rank))
            return
        self._down_since.setdefault(rank, sim.now)
        sim.at(sim.now + self.cfg.detect, lambda: self._judge(rank))

    def restarted(self, rank: int) -> None:
        """A new process of ``rank``: calls to the old one fail (a restart), and it
        registers under its own incarnation."""
        self.sim.fail_calls(rank, "restart", "engine restarted (new incarnation)")
        self._register(rank)
        self.reachability(rank)

    def _heard(self, rank: int) -> None:
        if self.sim.reachable(rank) and not self.alive[rank]:
            self.alive[rank] = True
            self.sim.log(f"liveness: rank {rank} heard again")

    def _judge(self, rank: int) -> None:
        since = self._down_since.get(rank)
        if since is None or self.sim.now - since < self.cfg.detect - 1e-9 \
                or not self.alive[rank]:
            return
        self.alive[rank] = False
        self.sim.log(f"liveness: rank {rank} lost")
        self.sim.fail_calls(rank, "liveness", "lost")
        change = self.view.rank_died(rank)
        if change is not None:
            self.changed(change)

    def routable(self, rank: int) -> bool:
        """A call to ``rank`` is sent (present and alive), else not delivered."""
        return rank in self.view and self.alive[rank]

    def check_view(self) -> None:
        """Once the faults are over: every rank steady and alive is present with its
        incarnation and registered; every rank steady and dead is gone."""
        sim = self.sim
        for r in self.ranks:
            if sim.now - self._steady_since[r] < self.settle:
                continue
            member = self.view.get(r)
            if sim.reachable(r):
                if member is None or member.incarnation != sim.incarnation(r) \
                        or member.state is not MemberState.REGISTERED:
                    sim.violate(f"rank {r} alive and registered, but the view has {member}")
            elif member is not None:
                sim.violate(f"rank {r} dead since {self._steady_since[r]:.3f}, still present")
