"""An engine's duplicate filter: request ids recently seen, per peer (sans-IO).

A request id is chosen by its sender, so ids are remembered per *peer*: the
transport's route the frame came from (the connection, not a client id the
frame claims). A peer can only make its own requests look like duplicates;
ids sent over another connection never drop a legitimate request.

Guarantees:

* :meth:`DuplicateFilter.seen` is True for an id already seen from the same
  peer within the last ``window`` ids of that peer.
* Bounded: at most ``window`` ids per peer and ``max_peers`` peers; the peer
  heard from least recently is forgotten first (counted in :attr:`peers_evicted`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["DuplicateFilter"]


class DuplicateFilter:
    """``peer -> recently seen request ids``, bounded; see the module docstring."""

    __slots__ = ("_peers", "max_peers", "peers_evicted", "window")

    def __init__(self, window: int = 4096, max_peers: int = 64) -> None:
        if window < 1 or max_peers < 1:
            raise ValueError("window and max_peers must be >= 1")
        self.window = window
        self.max_peers = max_peers
        self.peers_evicted = 0
        self._peers: OrderedDict[Hashable, OrderedDict[int, None]] = OrderedDict()

    def __len__(self) -> int:
        """Ids remembered, over every peer."""
        return sum(len(ids) for ids in self._peers.values())

    def seen(self, peer: Hashable, request_id: int) -> bool:
        """True for an id ``peer`` already sent (a duplicate: drop it); else
        remember it and return False."""
        peers = self._peers
        ids = peers.get(peer)
        if ids is None:
            if len(peers) >= self.max_peers:
                peers.popitem(last=False)
                self.peers_evicted += 1
            ids = peers[peer] = OrderedDict()
        elif request_id in ids:
            return True
        else:
            peers.move_to_end(peer)
        ids[request_id] = None
        if len(ids) > self.window:
            ids.popitem(last=False)
        return False

    def forget(self, peer: Hashable) -> None:
        """``peer`` is gone: its ids need not be remembered."""
        self._peers.pop(peer, None)
