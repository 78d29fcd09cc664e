"""Membership on etcd v3: engines register under a prefix with a lease; a client
follows the prefix (anyio shell; needs ``httpx``: the ``etcd`` extra).

::

    gateway = EtcdGateway("http://10.0.0.1:2379,http://10.0.0.2:2379,http://10.0.0.3:2379")
    # engine side: rank 3 at its address, under its own incarnation
    tg.start_soon(EtcdRegistration(gateway, "/fleet/a/", 3, "tcp://h:5555", ttl=10,
                                   incarnation=endpoint.incarnation).run)
    # client side: the client's ranks follow the prefix (an unreachable etcd raises
    # EtcdUnavailable after start_timeout instead of starting)
    await tg.start(EtcdMembership(client, gateway, "/fleet/a/").run)

The store says who *should* be in the fleet; the ranks' heartbeats say who is
*alive* (the client's liveness monitor). This module reports the first to the
client's :class:`~ctlwire.kernel.core.membership.Membership`, which keeps them
apart (the ``RankMembership`` machine).

Guarantees:

* **A lease loss is not a removal.** A registration that vanishes is told
  apart by its lease (the watch reports the deleted key-value with its lease;
  etcd is asked whether that lease still exists). Lease gone — it expired while
  etcd was frozen, unreachable or changing leader, or it was revoked — is a
  ``"lost"`` event: a rank that is alive stays present and routed to, its calls
  untouched, until its engine registers again (same incarnation: restored). When
  etcd cannot say, it is a lease loss too. Lease alive — an operator deleted the
  key, or the engine deregistered (:meth:`EtcdRegistration.withdraw`) — is an
  explicit ``"remove"``: the rank's pending calls fail at once.
* **A dead rank leaves on time.** Its lease expires ``ttl`` seconds after its
  last keep-alive; the watch reports the deletion, its lease is gone, and the
  rank, lost by liveness, leaves the view — within the lease's TTL plus one
  ``watch_round`` (plus etcd's own expiry tick) while etcd is up. Its calls failed
  typed when liveness lost it, before that.
* **The watch resumes where it stopped.** Every ``watch_round / 2`` seconds a
  linearizable probe asks the member the watch streams from whether it still
  answers (a frozen or leaderless member keeps a watch stream open and silent):
  when it does not within ``watch_round / 2``, or the stream fails, the watch
  moves to the next endpoint and resumes from the revision after the last one
  applied — no event missed, none applied twice. Only a compacted start
  revision makes it list again (``compacted``), and so does every
  ``relist_interval`` (a watch that went quiet without an error cannot hide a
  change longer than that). A list also tells lease losses from removals, by
  the lease of each registration last applied.
* **Unreachable etcd keeps the last view**: ``membership.stale`` says why, and
  ``stale_since`` since when, until etcd answers again. Nothing is removed
  because etcd cannot be reached.
* **A store unreachable at start is an error, not a hang.** :meth:`run` raises
  :class:`EtcdUnavailable` when no list succeeds within ``start_timeout``
  seconds (with ``await tg.start(membership.run)``, the caller's ``start``
  raises it); until then ``membership.stale`` says why the client has no ranks.
* **Bad entries are refused and counted, never applied** (``bad_entries``, and
  by reason in ``refusals``): a key that is not ``PREFIX<rank>`` spelled one
  way (``03``, ``+3``, ``٣`` are not rank 3) with a rank in range, a value larger
  than ``max_value_bytes``, a value that is not a :class:`Registration`
  (garbage, wrong types), one naming another rank than its key. Two live
  registrations of one rank are fenced by incarnation: the older one is never
  applied (``fenced_incarnation``).
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

import anyio
from anyio import CancelScope
from anyio.abc import TaskStatus

from ctlwire.kernel.core.membership import MembershipEvent
from ctlwire.kernel.membership.etcd_gateway import (
    Compacted,
    EtcdError,
    EtcdGateway,
    EtcdUnavailable,
    unb64,
)
from ctlwire.kernel.membership.etcd_registration import (
    MAX_RANK,
    MAX_VALUE_BYTES,
    EtcdRegistration,
    Registration,
    decode_registration,
    rank_of_key,
)
from ctlwire.states import MemberState

if TYPE_CHECKING:
    from ctlwire.kernel.client.control_client import ControlClient

__all__ = ["Compacted", "EtcdError", "EtcdGateway", "EtcdMembership", "EtcdRegistration",
           "EtcdUnavailable", "Registration"]

log = logging.getLogger("ctlwire.client")  # the client's view of the membership

_REASONS = ("key", "size", "value", "rank", "client")


class EtcdMembership:
    """Feeds ``client``'s membership from ``prefix``, as described above.
    ``counters``: ``lists``, ``watch_events``, ``watch_resumed``, ``compacted``,
    ``lease_checks``, ``lease_check_errors``, ``errors``, ``bad_entries``."""

    def __init__(self, client: ControlClient, gateway: EtcdGateway, prefix: str, *,
                 relist_interval: float = 30.0, retry_interval: float = 0.5,
                 watch_round: float = 2.0, start_timeout: float = 30.0,
                 max_rank: int = MAX_RANK, max_value_bytes: int = MAX_VALUE_BYTES) -> None:
        for name, value in (("relist_interval", relist_interval),
                            ("retry_interval", retry_interval), ("watch_round", watch_round),
                            ("start_timeout", start_timeout)):
            if not value > 0:
                raise ValueError(f"{name} must be > 0 (seconds)")
        self.client = client
        self.gateway = gateway
        self.prefix = prefix
        self.relist_interval = relist_interval
        self.retry_interval = retry_interval
        self.watch_round = watch_round
        self.start_timeout = start_timeout
        self.max_rank = max_rank
        self.max_value_bytes = max_value_bytes
        #: every event up to this revision is applied (a watch resumes after it)
        self.revision = 0
        #: the endpoint the watch streams from (None: not watching now)
        self.watching: str | None = None
        self.stale_since: float | None = None
        self.counters = {"lists": 0, "watch_events": 0, "watch_resumed": 0, "compacted": 0,
                         "lease_checks": 0, "lease_check_errors": 0, "errors": 0,
                         "bad_entries": 0}
        self.refusals = dict.fromkeys(_REASONS, 0)
        #: set each time a list has been applied (tests and callers can wait on it)
        self.listed = anyio.Event()
        self._leases: dict[int, int] = {}  # rank -> lease of its registration last applied

    # -- reading entries --------------------------------------------------------------
    def _refuse(self, reason: str, kv: Any, detail: object) -> None:
        self.counters["bad_entries"] += 1
        self.refusals[reason] += 1
        log.debug("ctlwire: etcd membership entry refused (%s): %.200r (%s)", reason, kv,
                  detail)

    def _rank(self, kv: Any) -> int | None:
        """The rank ``kv``'s key names, or None."""
        try:
            return rank_of_key(unb64(kv["key"]), self.prefix, self.max_rank)
        except (KeyError, TypeError, ValueError, UnicodeDecodeError):
            return None

    def _registration(self, kv: Any) -> tuple[int, Registration] | None:
        """The rank and registration ``kv`` holds; None, refused and counted, when it
        is not a valid one."""
        rank = self._rank(kv)
        if rank is None:
            self._refuse("key", kv, "not PREFIX<rank>, spelled one way, in range")
            return None
        try:
            return rank, decode_registration(kv.get("value"), rank, self.max_value_bytes)
        except ValueError as exc:
            text = str(exc)
            reason = ("size" if "larger" in text else "rank" if "names rank" in text
                      else "value")
            self._refuse(reason, kv, exc)
            return None

    def _apply(self, event: MembershipEvent, lease: int = 0) -> None:
        try:
            self.client.apply_membership(event)
        except (ValueError, TypeError) as exc:  # e.g. a transport refusing the address
            self.counters["bad_entries"] += 1
            self.refusals["client"] += 1
            log.warning("ctlwire: membership event %r not applied: %s", event, exc)
            return
        member = self.client.membership.get(event.rank)
        if event.kind in ("add", "update"):
            if member is not None and member.incarnation == event.incarnation:
                self._leases[event.rank] = lease
        elif member is None:
            self._leases.pop(event.rank, None)

    def _put(self, kv: dict[str, Any]) -> int | None:
        """Apply a registration (listed or watched); its rank, None when refused."""
        found = self._registration(kv)
        if found is None:
            return None
        rank, reg = found
        try:
            revision = int(kv["mod_revision"])
            lease = int(kv.get("lease", 0))
        except (KeyError, TypeError, ValueError) as exc:
            self._refuse("value", kv, exc)
            return None
        known = self.client.membership.get(rank)
        if known is None or known.revision != revision:  # else: applied already
            self._apply(MembershipEvent("add", rank, reg.address, reg.incarnation, revision),
                        lease)
        return rank

    async def _vanished(self, rank: int, revision: int, lease: int | None,
                        incarnation: int) -> None:
        """``rank``'s registration is gone at ``revision``: an explicit removal when
        its lease still lives (or it had none), else a lease loss (also when its
        lease is unknown: a rank never seen registered here)."""
        kind: Any = "remove" if lease == 0 else "lost"
        if lease:
            self.counters["lease_checks"] += 1
            try:
                alive = await self.gateway.lease_alive(lease, timeout=self.watch_round)
            except EtcdError as exc:  # etcd cannot say: never a reason to remove
                self.counters["lease_check_errors"] += 1
                log.debug("ctlwire: lease check of rank %d: %s", rank, exc)
                alive = False
            kind = "remove" if alive else "lost"
        self._apply(MembershipEvent(kind, rank, incarnation=incarnation, revision=revision))

    async def _deleted(self, kv: dict[str, Any], prev: Any) -> None:
        rank = self._rank(kv)
        if rank is None:
            return  # a key that was never a registration (refused when it was put)
        try:
            revision = int(kv["mod_revision"])
        except (KeyError, TypeError, ValueError) as exc:
            self._refuse("value", kv, exc)
            return
        lease, incarnation = self._leases.get(rank), 0
        if isinstance(prev, dict) and self._rank(prev) == rank:
            try:
                incarnation = decode_registration(prev.get("value"), rank,
                                                  self.max_value_bytes).incarnation
                lease = int(prev.get("lease", 0))
            except (ValueError, TypeError):
                pass  # an entry refused when it was put: whatever is present goes
        await self._vanished(rank, revision, lease, incarnation)

    # -- listing ----------------------------------------------------------------------
    async def relist(self) -> int:
        """List the prefix and make the client's ranks match it (a registered rank
        not listed: removed or lost, by its lease); the list's revision."""
        revision, kvs = await self.gateway.list_prefix(self.prefix)
        listed = {rank for kv in kvs if (rank := self._put(kv)) is not None}
        membership = self.client.membership
        for rank in membership.ranks:
            if rank not in listed and membership.state(rank) is MemberState.REGISTERED:
                await self._vanished(rank, revision, self._leases.get(rank), 0)
        self.revision = max(self.revision, revision)
        self.counters["lists"] += 1
        self._fresh()
        self.listed.set()
        self.listed = anyio.Event()
        return revision

    # -- watching ---------------------------------------------------------------------
    async def _watch(self) -> None:
        """Watch from the revision after :attr:`revision` through the preferred
        endpoint, probed every half round, for at most ``relist_interval``."""
        endpoint = self.gateway.endpoint
        half = self.watch_round / 2
        try:
            await self.gateway.probe(self.prefix, endpoint, half)
        except EtcdError:
            self.gateway.failed(endpoint)
            raise
        if self.stale_since is not None:  # after an outage: from where it stopped
            self.counters["watch_resumed"] += 1
        self._fresh()
        failed: list[EtcdError] = []
        self.watching = endpoint
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._probe, endpoint, tg.cancel_scope, failed)
            try:
                with anyio.move_on_after(self.relist_interval):
                    stream = self.gateway.watch(self.prefix, self.revision + 1,
                                                endpoint=endpoint)
                    async with contextlib.aclosing(stream) as batches:
                        async for events in batches:
                            await self._events(events)
            except EtcdError as exc:
                failed.append(exc)
            finally:
                self.watching = None
            tg.cancel_scope.cancel()
        if failed:
            if not isinstance(failed[0], Compacted):
                self.gateway.failed(endpoint)
            raise failed[0]

    async def _probe(self, endpoint: str, scope: CancelScope, failed: list[EtcdError]) -> None:
        half = self.watch_round / 2
        while True:
            await anyio.sleep(half)
            try:
                await self.gateway.probe(self.prefix, endpoint, half)
            except EtcdError as exc:
                failed.append(exc)
                scope.cancel()
                return

    async def _events(self, events: list[Any]) -> None:
        """Apply one batch in order; :attr:`revision` moves past a revision once every
        event of it is applied (a batch holds all of a revision's events)."""
        for i, ev in enumerate(events):
            kv = ev.get("kv") if isinstance(ev, dict) else None
            if not isinstance(kv, dict):
                self._refuse("value", ev, "a watch event without a key-value")
                continue
            self.counters["watch_events"] += 1
            if ev.get("type") == "DELETE":
                await self._deleted(kv, ev.get("prev_kv"))
            else:
                self._put(kv)
            try:
                revision = int(kv["mod_revision"])
            except (KeyError, TypeError, ValueError):
                continue
            following = events[i + 1] if i + 1 < len(events) else None
            nxt = following.get("kv") if isinstance(following, dict) else None
            if not isinstance(nxt, dict) or str(nxt.get("mod_revision")) != str(revision):
                self.revision = max(self.revision, revision)

    # -- running ----------------------------------------------------------------------
    def _fresh(self) -> None:
        self.client.membership.stale = None
        self.stale_since = None

    def _stale(self, exc: EtcdError) -> None:
        self.counters["errors"] += 1
        if self.stale_since is None:
            self.stale_since = anyio.current_time()
            log.warning("ctlwire: etcd membership stale (keeping the last view): %s", exc)
        self.client.membership.stale = str(exc)[:200]

    async def _first_list(self) -> None:
        last: EtcdError | None = None
        with anyio.move_on_after(self.start_timeout):
            while True:
                try:
                    await self.relist()
                    return
                except EtcdError as exc:
                    last = exc
                    self._stale(exc)
                await anyio.sleep(self.retry_interval)
        raise EtcdUnavailable(
            f"etcd ({', '.join(self.gateway.endpoints)}) did not list {self.prefix!r} within "
            f"start_timeout={self.start_timeout:g} s: {last}")

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """List (EtcdUnavailable after ``start_timeout`` without one), report started,
        then watch, resume, and list again as the module docstring says; until
        cancelled."""
        await self._first_list()
        task_status.started()
        listing = False
        while True:
            try:
                if listing:
                    await self.relist()
                    listing = False
                await self._watch()
                listing = True  # relist_interval passed: list again
            except Compacted:
                self.counters["compacted"] += 1
                listing = True
            except EtcdError as exc:
                self._stale(exc)
                await anyio.sleep(self.retry_interval)
