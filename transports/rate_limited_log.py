"""Log lines a peer can repeat at will, at most one per kind per interval.

A peer controls how often some warnings fire (a refused CURVE key per handshake,
a reply to a client that went away per reply). :class:`RateLimitedLog` writes the
first line of a kind at once, counts the repeats that follow within
``interval`` seconds, and writes the next line of that kind, after the interval,
with how many were left out::

    ctlwire: rejected CURVE client key K2 (and 1519 more like it in the last 10 s)

Guarantees: at most one line per kind per ``interval``; every occurrence is
counted (:attr:`RateLimitedLog.total`, :attr:`RateLimitedLog.suppressed`), none
is lost silently; the kinds remembered are bounded (``max_kinds``; the least
recently logged is forgotten first, its pending count going into the next line
of any kind). Thread-safe: the CURVE authenticator logs from its own thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["RateLimitedLog"]


class RateLimitedLog:
    """One line per kind per ``interval`` seconds, with a count of those left out."""

    def __init__(self, logger: logging.Logger, *, interval: float = 10.0,
                 max_kinds: int = 64, clock: Callable[[], float] = time.monotonic) -> None:
        if interval < 0 or max_kinds < 1:
            raise ValueError("interval must be >= 0 and max_kinds >= 1")
        self.logger = logger
        self.interval = interval
        self.max_kinds = max_kinds
        self._clock = clock
        self._lock = threading.Lock()
        # kind -> (when its last line was written, repeats left out since)
        self._kinds: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._orphaned = 0  # left out under a kind that was forgotten
        #: occurrences reported to this log, written or not
        self.total = 0
        #: occurrences left out of the log (each counted in a later line where one came)
        self.suppressed = 0

    def log(self, level: int, kind: str, msg: str, *args: object, exc_info: bool = False
            ) -> bool:
        """Log ``msg % args`` at ``level`` unless a line of ``kind`` was written less
        than ``interval`` s ago (then count it). True when a line was written
        (``exc_info``: with the exception being handled, as ``logging`` does)."""
        now = self._clock()
        with self._lock:
            self.total += 1
            last = self._kinds.get(kind)
            if last is not None and now - last[0] < self.interval:
                self._kinds[kind] = (last[0], last[1] + 1)
                self.suppressed += 1
                return False
            left_out = (last[1] if last is not None else 0) + self._orphaned
            self._orphaned = 0
            self._kinds[kind] = (now, 0)
            self._kinds.move_to_end(kind)
            while len(self._kinds) > self.max_kinds:
                _, (_, pending) = self._kinds.popitem(last=False)
                self._orphaned += pending
            since = now - last[0] if last is not None else self.interval
        if left_out:
            msg += " (and %d more like it in the last %.0f s)"
            args = (*args, left_out, since)
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True

    def warning(self, kind: str, msg: str, *args: object) -> bool:
        """:meth:`log` at ``WARNING``."""
        return self.log(logging.WARNING, kind, msg, *args)
