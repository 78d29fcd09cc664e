"""Liveness of engine ranks: the ``PeerLink`` machine driven by heartbeats (sans-IO).

:class:`PeerTable` takes what the transports report — a frame or heartbeat
seen from a rank under some incarnation, a disconnection — plus the passing
of time (:meth:`PeerTable.tick` with a clock reading) and returns the ranks
whose pending requests must now fail.

* Connected → Suspect after one missed heartbeat interval (plus half an
  interval of grace); Lost after ``misses_allowed`` consecutive missed
  intervals (default 4 x 0.25 s + 0.125 s, about 1.1 s), or at once on a
  disconnection.
* A rank heard from again after Lost rejoins. A *new incarnation* seen while
  Connected or Suspect is a restart: the old incarnation is Lost first (its
  requests fail with EngineDead), then the new one rejoins.
* Frames from an incarnation other than the current one are stale
  (:meth:`PeerTable.is_stale`) and must be dropped. Incarnations grow with
  time, so a late heartbeat of a replaced process is ignored rather than
  taken for yet another restart.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ctlwire.states import PEER_LINK_TABLE, PeerEvent, PeerState

__all__ = ["Peer", "PeerTable"]

_LIVE = (PeerState.CONNECTED, PeerState.SUSPECT)


@dataclass
class Peer:
    rank: int
    state: PeerState = PeerState.UNKNOWN
    incarnation: int = 0
    last_seen: float = 0.0
    misses: int = 0
    lost_count: int = 0
    rejoin_count: int = 0
    lost_at: float | None = None


class PeerTable:
    """Per-rank PeerLink state; see the module docstring."""

    def __init__(self, ranks: Iterable[int] = (), *, interval: float = 0.25,
                 misses_allowed: int = 4) -> None:
        if interval <= 0 or misses_allowed < 1:
            raise ValueError("interval must be > 0 and misses_allowed >= 1")
        self.interval = interval
        self.misses_allowed = misses_allowed
        self.peers: dict[int, Peer] = {r: Peer(r) for r in ranks}
        self._apply = PEER_LINK_TABLE.apply

    def _go(self, peer: Peer, event: PeerEvent) -> None:
        peer.state = self._apply(peer.state, event, peer.rank)

    def peer(self, rank: int) -> Peer:
        p = self.peers.get(rank)
        if p is None:
            p = self.peers[rank] = Peer(rank)
        return p

    def state(self, rank: int) -> PeerState:
        p = self.peers.get(rank)
        return PeerState.UNKNOWN if p is None else p.state

    def is_lost(self, rank: int) -> bool:
        p = self.peers.get(rank)
        return p is not None and p.state is PeerState.LOST

    def is_stale(self, rank: int, incarnation: int) -> bool:
        """A frame from ``incarnation`` is not from the rank's current process."""
        p = self.peers.get(rank)
        return (p is not None and p.incarnation != 0 and incarnation != 0
                and incarnation != p.incarnation)

    def seen(self, rank: int, incarnation: int, now: float, *, authoritative: bool = True
             ) -> list[int]:
        """``rank`` was heard from. Returns ``[rank]`` when this revealed a
        restart (its old incarnation's requests must fail), else ``[]``.

        ``authoritative`` is True for heartbeats (which announce the
        incarnation); replies only refresh liveness."""
        p = self.peers.get(rank)
        if (p is not None and p.state is PeerState.CONNECTED
                and (incarnation == p.incarnation or not incarnation)):
            # the common case, Connected --seen--> Connected: no state change
            p.last_seen = now
            p.misses = 0
            return []
        p = self.peer(rank)
        lost: list[int] = []
        if (authoritative and incarnation and p.incarnation and incarnation < p.incarnation
                and p.state in _LIVE):
            # a late heartbeat of a process this rank has already replaced; once the
            # rank is Lost, any incarnation may rejoin (a restart on a host whose
            # clock is behind, or after a garbled incarnation)
            return lost
        if p.state is PeerState.LOST:
            if not authoritative and p.incarnation and incarnation != p.incarnation:
                return lost
            self._go(p, PeerEvent.REJOIN)
            p.rejoin_count += 1
            p.lost_at = None
            if incarnation:
                p.incarnation = incarnation
        elif (authoritative and incarnation and p.incarnation and incarnation != p.incarnation
              and p.state in _LIVE):
            self._go(p, PeerEvent.LOSE)
            p.lost_count += 1
            lost.append(rank)
            self._go(p, PeerEvent.REJOIN)
            p.rejoin_count += 1
            p.incarnation = incarnation
        else:
            if not authoritative and p.incarnation and incarnation != p.incarnation:
                return lost
            self._go(p, PeerEvent.SEEN)
            if incarnation and authoritative:
                p.incarnation = incarnation
        p.last_seen = now
        p.misses = 0
        return lost

    def disconnected(self, rank: int, now: float) -> bool:
        """The transport saw the connection end. True when this made it Lost."""
        p = self.peers.get(rank)
        if p is None or p.state not in _LIVE:
            return False
        self._go(p, PeerEvent.LOSE)
        p.lost_count += 1
        p.lost_at = now
        return True

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
                    self._go(p, PeerEvent.LOSE)
                    p.lost_count += 1
                    p.lost_at = now
                    lost.append(p.rank)
                else:
                    self._go(p, PeerEvent.MISS)
        return lost

    def live_ranks(self) -> list[int]:
        return [r for r, p in self.peers.items() if p.state in _LIVE]

    def snapshot(self) -> dict[int, str]:
        return {r: p.state.name for r, p in sorted(self.peers.items())}
