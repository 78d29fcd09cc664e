"""The engine's record of requests run under an idempotency key (sans-IO).

A caller that got :class:`~ctlwire.kernel.errors.OutcomeUnknown` cannot tell
whether its ``update_weights`` ran. If the request carried an idempotency key,
it retries with the same key; the engine finds the key here and answers with
the first run's outcome (result or error) instead of running the handler
again: at-most-once delivery plus a retry becomes an exactly-once effect.

Guarantees:

* Keys are scoped by method: ``(method, key)``.
* A key whose first request is still running is reported as running
  (:meth:`ResultCache.lookup` returns :data:`RUNNING`); the engine answers
  ``InProgress`` rather than run it twice.
* Bounded by entries and by bytes of recorded results; the oldest records are
  evicted first, and evictions are counted. The cache lives as long as the
  engine process (its incarnation): it survives reconnects and client restarts,
  not an engine restart.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

from ctlwire.transports.envelope import ErrorInfo

__all__ = ["RUNNING", "RecordedOutcome", "ResultCache"]


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
        return len(self.result) + (len(err.message) + len(err.type) if err is not None else 0) + 64


RUNNING: Final = RecordedOutcome(False, b"", None)
"""The placeholder of a key whose first request is still running."""


class ResultCache:
    """``(method, key) -> outcome``, bounded; see the module docstring."""

    def __init__(self, max_entries: int = 4096, max_bytes: int = 64 * 1024 * 1024) -> None:
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be >= 1")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, str], RecordedOutcome] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, method: str, key: str) -> RecordedOutcome | None:
        """The recorded outcome, :data:`RUNNING`, or None (never seen: run it)."""
        found = self._entries.get((method, key))
        if found is not None and found is not RUNNING:
            self.hits += 1
        return found

    def start(self, method: str, key: str) -> None:
        """The first request with this key starts running."""
        self._entries[(method, key)] = RUNNING
        self._entries.move_to_end((method, key))
        self._evict()

    def finish(self, method: str, key: str, outcome: RecordedOutcome) -> None:
        """Record the outcome of the run :meth:`start` announced."""
        k = (method, key)
        old = self._entries.pop(k, None)
        if old is not None and old is not RUNNING:
            self.bytes -= old.size
        self._entries[k] = outcome
        self.bytes += outcome.size
        self._evict()

    def abandon(self, method: str, key: str) -> None:
        """The run ended without an outcome to record (cancelled): forget the key."""
        if self._entries.get((method, key)) is RUNNING:
            del self._entries[(method, key)]

    def _evict(self) -> None:
        entries = self._entries
        while len(entries) > self.max_entries or self.bytes > self.max_bytes:
            # oldest first; a running key is kept (it is re-inserted at the end)
            k, v = entries.popitem(last=False)
            if v is RUNNING:
                entries[k] = v
                if all(x is RUNNING for x in entries.values()):
                    break
                continue
            self.bytes -= v.size
            self.evicted += 1
