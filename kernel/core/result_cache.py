"""The engine's record of requests run under an idempotency key (sans-IO, time
passed in).

A caller that got :class:`~ctlwire.kernel.errors.OutcomeUnknown` cannot tell
whether its ``update_weights`` ran. If the request carried an idempotency key,
it retries with the same key; the engine finds the key here and answers with
the first run's outcome (result or error) instead of running the handler
again: at-most-once delivery plus a retry becomes an exactly-once effect.

Guarantees:

* Keys are scoped by the peer that sent them and by method: ``(peer, method,
  key)``. A peer is the connection the request came from (the transport's
  route), so another connection can neither read nor pre-empt a key, and two
  methods using the same key both run.
* A key is at most ``max_key_bytes`` bytes (UTF-8); :meth:`ResultCache.key_fits`
  says whether one is, and the engine refuses a longer one.
* A key whose first request is still running is reported as running
  (:meth:`ResultCache.lookup` returns :data:`RUNNING`); the engine answers
  ``InProgress`` rather than run it twice. A run that ends with no outcome
  (cancelled) forgets its key (:meth:`ResultCache.abandon`): a retry runs.
* The first run's error is recorded like a result: a repeat gets the same error.
* Bounded in entries and in bytes (keys, method names, results and error
  texts, plus a fixed overhead per entry), in all and **per owner**: each new
  key is charged to the peer that sent it (the engine passes its connection,
  or the key its transport names for it), which holds at most ``owner_share`` of the entries
  and of the bytes (a quarter by default), so one peer can fill only its own
  share. A recorded outcome is kept at least ``retention`` seconds (the retry
  window): it is never evicted younger than that. When there is no room for a
  new key -- in its owner's share, or in the cache without evicting a younger
  entry -- :meth:`ResultCache.start` refuses it (counted in
  :attr:`refused_full`) and the engine answers ``CacheFull`` without running
  the handler. A result too large to fit is replaced by a ``ResultNotRetained``
  error (counted in :attr:`results_not_kept`): a retry learns that the call
  ran, and it does not run twice. Entries past their retention are evicted
  oldest first when room is needed (counted in :attr:`evicted`).
* The cache lives as long as the engine process (its incarnation): it survives
  client restarts, not an engine restart.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Final

from ctlwire.transports.envelope import ErrorInfo
from ctlwire.transports.error_codes import ErrorCode

__all__ = ["ENTRY_OVERHEAD", "NOT_RETAINED", "RUNNING", "CacheKey", "RecordedOutcome",
           "ResultCache"]

ENTRY_OVERHEAD: Final = 256
"""Bytes counted for an entry on top of its key, method name and outcome."""

CacheKey = tuple[Hashable, str, str]
"""``(peer, method, key)``."""


class RecordedOutcome:
    """The first run's outcome: an encoded result, or the error it raised."""

    __slots__ = ("error", "ok", "result")

    def __init__(self, ok: bool, result: bytes, error: ErrorInfo | None) -> None:
        self.ok = ok
        self.result = result
        self.error = error

    @property
    def size(self) -> int:
        err = self.error
        return len(self.result) + (len(err.message) + len(err.type) if err is not None else 0)


RUNNING: Final = RecordedOutcome(False, b"", None)
"""The placeholder of a key whose first request is still running."""

NOT_RETAINED: Final = RecordedOutcome(False, b"", ErrorInfo(
    "ResultNotRetained", "the request with this idempotency key ran; its outcome was too "
    "large for the engine's idempotency cache", ErrorCode.RESULT_NOT_RETAINED))
"""What a repeat gets when the first run's outcome did not fit (it ran once)."""


class _Entry:
    __slots__ = ("outcome", "owner", "since", "size")

    def __init__(self, outcome: RecordedOutcome, size: int, since: float,
                 owner: Hashable) -> None:
        self.outcome = outcome
        self.size = size
        self.since = since
        self.owner = owner


class ResultCache:
    """``(peer, method, key) -> outcome``, bounded, as described above."""

    def __init__(self, max_entries: int = 4096, max_bytes: int = 64 * 1024 * 1024, *,
                 max_key_bytes: int = 256, retention: float = 600.0,
                 owner_share: float = 0.25) -> None:
        if max_entries < 1 or max_bytes < 1 or max_key_bytes < 1:
            raise ValueError("max_entries, max_bytes and max_key_bytes must be >= 1")
        if not retention >= 0:
            raise ValueError("retention must be >= 0 seconds")
        if not 0 < owner_share <= 1:
            raise ValueError("owner_share must be in (0, 1]")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.owner_share = owner_share
        #: what one owner may hold: ``owner_share`` of the entries and of the bytes
        self.max_entries_per_owner = max(1, int(max_entries * owner_share))
        self.max_bytes_per_owner = max(1, int(max_bytes * owner_share))
        #: owner -> [entries, bytes] it holds (owners holding none are forgotten)
        self._owners: dict[Hashable, list[int]] = {}
        self.max_key_bytes = max_key_bytes
        self.retention = retention
        self._running: dict[CacheKey, _Entry] = {}
        self._done: OrderedDict[CacheKey, _Entry] = OrderedDict()  # oldest outcome first
        self.bytes = 0
        self.hits = 0
        self.evicted = 0
        self.refused_full = 0
        self.results_not_kept = 0

    def __len__(self) -> int:
        return len(self._running) + len(self._done)

    def key_fits(self, key: str) -> bool:
        """Whether ``key`` is within :attr:`max_key_bytes` (UTF-8)."""
        limit = self.max_key_bytes
        return len(key) <= limit and len(key.encode("utf-8", "surrogatepass")) <= limit

    def lookup(self, peer: Hashable, method: str, key: str) -> RecordedOutcome | None:
        """The recorded outcome, :data:`RUNNING`, or None (never seen: run it)."""
        k = (peer, method, key)
        if k in self._running:
            return RUNNING
        found = self._done.get(k)
        if found is None:
            return None
        self.hits += 1
        return found.outcome

    def start(self, peer: Hashable, method: str, key: str, now: float, *,
              owner: Hashable = None) -> bool:
        """The first request with this key starts running, charged to ``owner``
        (default: ``peer``). False (counted in :attr:`refused_full`, nothing
        recorded) when there is no room for it: the owner's share is full (of
        entries younger than :attr:`retention`: its older ones are evicted first),
        or the cache is, without evicting an entry younger than that."""
        k = (peer, method, key)
        if k in self._running or k in self._done:
            raise ValueError(f"key {key!r} of {method!r} is already recorded")
        if owner is None:
            owner = peer
        # room for the outcome that always fits: a result too large becomes NOT_RETAINED
        size = _base_size(k) + NOT_RETAINED.size
        if not (self._owner_room(owner, size, now) and self._make_room(size, 1, now)):
            self.refused_full += 1
            return False
        self._running[k] = _Entry(RUNNING, size, now, owner)
        self._charge(owner, 1, size)
        self.bytes += size
        return True

    def finish(self, peer: Hashable, method: str, key: str, outcome: RecordedOutcome,
               now: float) -> None:
        """Record the outcome of the run :meth:`start` announced."""
        k = (peer, method, key)
        entry = self._running.pop(k, None)
        if entry is None:
            return  # never started here: nothing to record
        owner = entry.owner
        self.bytes -= entry.size
        self._charge(owner, 0, -entry.size)
        size = _base_size(k) + outcome.size
        if size > entry.size and not (self._owner_room(owner, size, now, entries=0)
                                      and self._make_room(size, 0, now)):
            self.results_not_kept += 1
            outcome, size = NOT_RETAINED, entry.size  # the room start() reserved
        self._done[k] = _Entry(outcome, size, now, owner)
        self._charge(owner, 0, size)
        self.bytes += size

    def abandon(self, peer: Hashable, method: str, key: str) -> None:
        """The run ended without an outcome to record (cancelled): forget the key."""
        entry = self._running.pop((peer, method, key), None)
        if entry is not None:
            self.bytes -= entry.size
            self._charge(entry.owner, -1, -entry.size)

    def owned(self, owner: Hashable) -> tuple[int, int]:
        """The entries and bytes ``owner`` holds."""
        held = self._owners.get(owner)
        return (held[0], held[1]) if held is not None else (0, 0)

    @property
    def owners(self) -> int:
        """Owners holding at least one entry."""
        return len(self._owners)

    def _charge(self, owner: Hashable, entries: int, size: int) -> None:
        held = self._owners.get(owner)
        if held is None:
            held = self._owners[owner] = [0, 0]
        held[0] += entries
        held[1] += size
        if not held[0]:
            del self._owners[owner]

    def _owner_room(self, owner: Hashable, size: int, now: float, *, entries: int = 1) -> bool:
        """Whether ``owner``'s share takes ``entries`` more entries and ``size`` more
        bytes, once outcomes past their retention are evicted (oldest first, any
        owner's: each is evicted once, so this costs no more than their number)."""
        done = self._done
        while True:
            held = self._owners.get(owner, _NONE_HELD)
            if (held[0] + entries <= self.max_entries_per_owner
                    and held[1] + size <= self.max_bytes_per_owner):
                return True
            if not done:
                return False
            oldest = next(iter(done.values()))
            if now - oldest.since < self.retention:
                return False
            done.popitem(last=False)
            self.bytes -= oldest.size
            self.evicted += 1
            self._charge(oldest.owner, -1, -oldest.size)

    def _make_room(self, size: int, entries: int, now: float) -> bool:
        """Evict outcomes past their retention, oldest first, until ``size`` more
        bytes and ``entries`` more entries fit. False when they cannot."""
        done = self._done
        while (self.bytes + size > self.max_bytes
               or len(self._running) + len(done) + entries > self.max_entries):
            if not done:
                return False
            oldest = next(iter(done.values()))
            if now - oldest.since < self.retention:
                return False
            done.popitem(last=False)
            self.bytes -= oldest.size
            self.evicted += 1
            self._charge(oldest.owner, -1, -oldest.size)
        return True


_NONE_HELD: Final = (0, 0)


def _base_size(k: CacheKey) -> int:
    peer, method, key = k
    return (ENTRY_OVERHEAD + len(method) + len(key.encode("utf-8", "surrogatepass"))
            + (len(peer) if isinstance(peer, bytes) else 0))
