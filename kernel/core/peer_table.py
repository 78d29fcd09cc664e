"""Liveness and progress of engine ranks: the ``PeerLink`` machine (sans-IO).

:class:`PeerTable` takes what the transports report — a heartbeat (with the
engine's progress) or a reply seen from a rank under some incarnation, a
disconnection — plus the passing of time (:meth:`PeerTable.tick` with a clock
reading) and returns the ranks whose pending requests must now fail.

* **Liveness.** Live → Suspect after one missed heartbeat interval (plus half
  an interval of grace); Lost after ``misses_allowed`` consecutive missed
  intervals (default 4 x 0.25 s + 0.125 s, about 1.1 s), or at once on a
  disconnection. Engines send heartbeats from a thread of their own, so a
  handler or step that blocks does not make a rank miss them.
* **Progress.** A heartbeat says what the engine runs and for how long:
  idle → Connected; running a request or a step → Busy; running it for longer
  than the stall limit of its method (``stall_limits``, else ``stall_limit``)
  → Stalled. Busy and Stalled ranks are alive: nothing here fails their calls.
* **The client's own stalls do not count against engines.**
  :meth:`excuse` moves every live rank's last-heard time forward by a period
  in which the client could not read (its loop was blocked), so heartbeats
  still queued in the socket are read before anyone is judged.
* **Incarnations are fenced.** A new incarnation seen while live is a restart:
  the old one is Lost first (its requests fail), then the new one rejoins.
  Incarnations grow with time, and once an incarnation is admitted, frames of
  older ones are stale for good: dropped and counted (:attr:`PeerTable.fenced`),
  never re-admitted, even while the rank is Lost (a frozen process that thaws
  after its replacement started). The admitted incarnation itself may rejoin
  after Lost (the same process, thawed or reconnected).
* **Incarnations are bounded.** An incarnation is minted as milliseconds since
  the epoch shifted left by 12 bits, plus 12 random bits (``new_incarnation``).
  One that claims a time more than ``incarnation_window`` seconds ahead of this
  client's wall clock is implausible: :meth:`PeerTable.plausible` refuses it and
  counts it (:attr:`PeerTable.implausible`), and it is never admitted. A forged
  incarnation can therefore fence a rank's real process for at most that window
  (a process started after it is newer); which peer may announce one at all is
  the transport's authentication (a CURVE key bound to the rank, or ipc).
* **Bounded.** Only the ranks given at construction or :meth:`PeerTable.add`-ed
  have entries; anything else is counted in :attr:`PeerTable.foreign` and ignored.
* **Ranks come and go.** :meth:`PeerTable.remove` forgets a rank's link but
  keeps its admitted incarnation (bounded, oldest forgotten first): while
  removed, :meth:`PeerTable.is_lost` is True for it (nothing is sent there),
  and when it is added again its older incarnations stay fenced.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ctlwire.states import PEER_LINK_TABLE, PeerEvent, PeerState

__all__ = ["INCARNATION_TIME_SHIFT", "Peer", "PeerTable", "Progress", "incarnation_at"]

#: an incarnation is ``milliseconds since the epoch << INCARNATION_TIME_SHIFT`` plus
#: random low bits
INCARNATION_TIME_SHIFT = 12


def incarnation_at(wall: float) -> int:
    """The smallest incarnation minted at or after ``wall`` (seconds since the epoch)."""
    return int(wall * 1000) << INCARNATION_TIME_SHIFT

_LIVE = (PeerState.CONNECTED, PeerState.BUSY, PeerState.STALLED, PeerState.SUSPECT)


@dataclass(frozen=True)
class Progress:
    """What an engine's last heartbeat said it was doing."""

    request_id: int = 0  # the request running (0: none, or a step)
    method: str = ""  # its method; "(step)" for the engine's own step; "" when idle
    busy_for: float = 0.0  # seconds it has run, on the engine's clock
    loops: int = 0  # the engine loop's iterations so far
    fraction: float = -1.0  # the handler's own report (0..1), negative when none
    note: str = ""


_IDLE = Progress()


@dataclass
class Peer:
    rank: int
    state: PeerState = PeerState.UNKNOWN
    incarnation: int = 0
    last_seen: float = 0.0
    misses: int = 0
    lost_count: int = 0
    rejoin_count: int = 0
    stall_count: int = 0
    lost_at: float | None = None
    progress: Progress = field(default=_IDLE)

    def describe(self) -> dict[str, Any]:
        p = self.progress
        return {"state": self.state.name, "incarnation": self.incarnation,
                "request": p.request_id, "method": p.method, "busy_for": round(p.busy_for, 3),
                "loops": p.loops, "progress": p.fraction, "note": p.note}


class PeerTable:
    """Per-rank PeerLink state; see the module docstring."""

    def __init__(self, ranks: Iterable[int] = (), *, interval: float = 0.25,
                 misses_allowed: int = 4, stall_limit: float = 300.0,
                 stall_limits: Mapping[str, float] | None = None,
                 incarnation_window: float = 60.0) -> None:
        if interval <= 0 or misses_allowed < 1:
            raise ValueError("interval must be > 0 and misses_allowed >= 1")
        if stall_limit <= 0:
            raise ValueError("stall_limit must be > 0")
        if not incarnation_window >= 0:
            raise ValueError("incarnation_window must be >= 0 (seconds)")
        #: how far ahead of this client's wall clock an incarnation may claim to be minted
        self.incarnation_window = float(incarnation_window)
        self.implausible = 0  # incarnations refused: minted too far in the future
        self.interval = interval
        self.misses_allowed = misses_allowed
        self.stall_limit = stall_limit
        self.stall_limits = dict(stall_limits or {})
        self.peers: dict[int, Peer] = {r: Peer(r) for r in ranks}
        #: removed ranks -> their last admitted incarnation (bounded)
        self.retired: dict[int, int] = {}
        self.max_retired = 65_536
        self.fenced = 0  # frames of an incarnation older than the admitted one
        self.foreign = 0  # frames naming a rank this table does not have
        self._apply = PEER_LINK_TABLE.apply
        #: tracked peers now Lost: while 0 and ``retired`` is empty, :meth:`is_lost` is
        #: False for every rank
        self.lost_count = 0

    def _go(self, peer: Peer, event: PeerEvent) -> None:
        old = peer.state
        new = peer.state = self._apply(old, event, peer.rank)
        if (new is PeerState.LOST) is not (old is PeerState.LOST):
            self.lost_count += 1 if new is PeerState.LOST else -1

    def _lose(self, peer: Peer, now: float) -> None:
        self._go(peer, PeerEvent.LOSE)
        peer.lost_count += 1
        peer.lost_at = now
        peer.progress = _IDLE

    def _rejoin(self, peer: Peer, incarnation: int) -> None:
        self._go(peer, PeerEvent.REJOIN)
        peer.rejoin_count += 1
        peer.lost_at = None
        if incarnation:
            peer.incarnation = incarnation

    def add(self, rank: int) -> bool:
        """Track ``rank`` (Unknown until heard from; a rank removed before keeps
        its incarnation floor). False when it is already tracked."""
        if rank in self.peers:
            return False
        self.peers[rank] = Peer(rank, incarnation=self.retired.pop(rank, 0))
        return True

    def remove(self, rank: int) -> bool:
        """Stop tracking ``rank`` (see the module docstring). False when it was not."""
        p = self.peers.pop(rank, None)
        if p is None:
            return False
        if p.state is PeerState.LOST:
            self.lost_count -= 1
        retired = self.retired
        retired.pop(rank, None)
        while len(retired) >= self.max_retired:
            del retired[next(iter(retired))]
        retired[rank] = p.incarnation
        return True

    def state(self, rank: int) -> PeerState:
        p = self.peers.get(rank)
        return PeerState.UNKNOWN if p is None else p.state

    def is_lost(self, rank: int) -> bool:
        """Lost, or removed: a request to ``rank`` must not be sent."""
        p = self.peers.get(rank)
        if p is None:
            return rank in self.retired
        return p.state is PeerState.LOST

    def is_live(self, rank: int) -> bool:
        p = self.peers.get(rank)
        return p is not None and p.state in _LIVE

    def is_stale(self, rank: int, incarnation: int) -> bool:
        """A frame from ``incarnation`` is not from the rank's admitted process."""
        p = self.peers.get(rank)
        return (p is not None and p.incarnation != 0 and incarnation != 0
                and incarnation != p.incarnation
                # re-added after removal, not yet heard from: only older ones are stale
                and (p.state is not PeerState.UNKNOWN or incarnation < p.incarnation))

    def plausible(self, incarnation: int, wall: float) -> bool:
        """Whether ``incarnation`` may have been minted by now (``wall``: this client's
        clock, seconds since the epoch), within :attr:`incarnation_window`. False is
        counted in :attr:`implausible`: the frame is refused."""
        if 0 <= incarnation <= incarnation_at(wall + self.incarnation_window + 0.001) | 0xFFF:
            return True
        self.implausible += 1
        return False

    def stall_limit_for(self, method: str) -> float:
        return self.stall_limits.get(method, self.stall_limit)

    def _progress_event(self, progress: Progress | None) -> PeerEvent:
        if progress is None or not progress.method:
            return PeerEvent.IDLE
        if progress.busy_for > self.stall_limit_for(progress.method):
            return PeerEvent.STALL
        return PeerEvent.WORK

    def seen(self, rank: int, incarnation: int, now: float, *, authoritative: bool = True,
             progress: Progress | None = None) -> list[int]:
        """``rank`` was heard from. Returns ``[rank]`` when this revealed a
        restart (its old incarnation's requests must fail), else ``[]``.

        ``authoritative`` is True for heartbeats (which announce the
        incarnation and carry ``progress``); replies only refresh liveness."""
        if progress is None and self.reply_seen(rank, incarnation, now):
            return []  # the common case, Connected --idle--> Connected: no state change
        p = self.peers.get(rank)
        if p is None:
            self.foreign += 1
            return []
        lost: list[int] = []
        if incarnation and p.incarnation and incarnation != p.incarnation:
            if not authoritative:
                return lost  # a reply of another process: the caller drops it as stale
            if incarnation < p.incarnation:
                self.fenced += 1  # an older process than the admitted one: fenced for good
                return lost
            # a newer incarnation: a restart
            if p.state in _LIVE:
                self._lose(p, now)
                lost.append(rank)
            if p.state is PeerState.UNKNOWN:  # re-added after removal: first contact
                p.incarnation = incarnation
            else:
                self._rejoin(p, incarnation)
        elif p.state is PeerState.LOST:
            self._rejoin(p, incarnation)
        elif incarnation and authoritative and not p.incarnation:
            p.incarnation = incarnation
        if authoritative:
            event = self._progress_event(progress)
            if event is PeerEvent.STALL and p.state is not PeerState.STALLED:
                p.stall_count += 1
            if not (event is PeerEvent.IDLE and p.state is PeerState.CONNECTED):
                self._go(p, event)
            p.progress = progress if progress is not None else _IDLE
        elif p.state is PeerState.UNKNOWN or p.state is PeerState.SUSPECT:
            self._go(p, PeerEvent.IDLE if p.progress.method == "" else PeerEvent.WORK)
        p.last_seen = now
        p.misses = 0
        return lost

    def reply_seen(self, rank: int, incarnation: int, now: float) -> bool:
        """A reply (or an idle heartbeat) came from ``rank`` under ``incarnation``: in
        the common case (the rank Connected, the frame from its admitted
        incarnation) refresh its liveness with one lookup and return True. False
        when anything else holds: the caller then takes the general path
        (:meth:`seen`, and for a reply :meth:`is_stale` and :meth:`finished`),
        which this equals here."""
        p = self.peers.get(rank)
        if (p is not None and p.state is PeerState.CONNECTED
                and (incarnation == p.incarnation or not incarnation)):
            p.last_seen = now
            p.misses = 0
            return True
        return False

    def finished(self, rank: int, request_id: int) -> None:
        """A reply to ``request_id`` came from ``rank``: if its last heartbeat said
        it was running that request, it no longer is (Busy/Stalled → Connected)."""
        p = self.peers.get(rank)
        if (p is not None and p.progress.request_id == request_id and request_id
                and p.state in (PeerState.BUSY, PeerState.STALLED)):
            self._go(p, PeerEvent.IDLE)
            p.progress = _IDLE

    def disconnected(self, rank: int, now: float) -> bool:
        """The transport saw the connection end. True when this made it Lost."""
        p = self.peers.get(rank)
        if p is None or p.state not in _LIVE:
            return False
        self._lose(p, now)
        return True

    def excuse(self, seconds: float, now: float) -> None:
        """The client could not read for ``seconds`` (its own loop was blocked):
        that time does not count as silence of any rank."""
        if seconds <= 0:
            return
        for p in self.peers.values():
            if p.state in _LIVE:
                p.last_seen = min(now, p.last_seen + seconds)

    def tick(self, now: float) -> list[int]:
        """Account for time passing; returns ranks that just became Lost."""
        lost = []
        for p in self.peers.values():
            if p.state not in _LIVE:
                continue
            # half an interval of grace: a heartbeat due right now is not yet missed
            missed = int((now - p.last_seen) / self.interval - 0.5)
            while p.misses < missed and p.state in _LIVE:
                p.misses += 1
                if p.misses >= self.misses_allowed:
                    self._lose(p, now)
                    lost.append(p.rank)
                elif p.state is not PeerState.SUSPECT:
                    self._go(p, PeerEvent.MISS)
        return lost

    def live_ranks(self) -> list[int]:
        return [r for r, p in self.peers.items() if p.state in _LIVE]

    def snapshot(self) -> dict[int, str]:
        return {r: p.state.name for r, p in sorted(self.peers.items())}

    def describe(self) -> dict[int, dict[str, Any]]:
        """Every rank's state and what it was last doing."""
        return {r: p.describe() for r, p in sorted(self.peers.items())}
