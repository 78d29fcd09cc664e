"""Is each engine rank alive? The client's liveness monitor (anyio shell over the peer table).

:class:`LivenessMonitor` drives the sans-IO :class:`~ctlwire.kernel.core.peer_table.PeerTable`
from what the client hears and from the passing of time, and tells the client
which ranks to give up on::

    monitor = LivenessMonitor(transport, ranks, interval=0.25, misses_allowed=4,
                              fail_rank=client_fail_rank, counters=client.counters)
    monitor.now = current_backend().clock     # once the event loop runs
    tg.start_soon(monitor.run, incarnation)   # heartbeats (when interval is set)
    ...
    monitor.seen(rank, reply.incarnation, authoritative=False)   # on every reply
    progress = monitor.heartbeat(rank, hb)                       # on every heartbeat

Guarantees:

* **Lost means lost, and is said at once.** A rank is Lost when it misses
  ``misses_allowed`` heartbeat intervals, when the transport reports it
  disconnected, or when it is unroutable and silent for an interval; then
  ``fail_rank(rank, detail)`` is called once (the client fails its pending
  requests: NotDelivered or OutcomeUnknown), ``engine_lost`` is counted and a
  warning logged. A new incarnation of a live rank is a restart: its old
  incarnation's requests fail the same way (``engine_restarted``).
* **Busy is not dead.** Heartbeats say what a rank runs: Busy and Stalled
  (past its method's stall limit; counted once per stall in
  ``engine_stalled`` and logged) ranks stay alive.
* **This client's stalls are excused.** When the heartbeat loop wakes more
  than half an interval late (this loop was blocked: a blocking call, a GC
  pause), engines are not judged for that tick; their silence of that time is
  excused (``client_stalls``), so heartbeats still unread are read first.
* **Every rank hears from us.** Each interval a heartbeat goes to every rank
  not live (an engine that binds learns our route, a lost one that comes back
  hears from us at once); a live rank, every ``LIVE_HEARTBEAT_EVERY`` intervals.
* **Waiters learn of changes.** :attr:`peer_changed` is set (and replaced)
  whenever a rank becomes live or is lost, and on :meth:`close`.
* **Only plausible incarnations.** A heartbeat or reply whose incarnation claims
  to be minted more than ``incarnation_window`` s ahead of this client's wall
  clock is refused (``implausible_incarnation``, one warning per rank): it
  neither admits the incarnation nor refreshes the rank, so one forged frame
  cannot fence the rank's real process. Which peer may speak for a rank at all
  is the transport's authentication.
* **Quiet after close.** Once :meth:`close` is called, ranks that stop (a
  disconnect at shutdown) are not reported lost.

The monitor never touches a request itself: what a lost rank means for the
calls in flight is the client's ``fail_rank``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio

from ctlwire.kernel.core.peer_table import PeerTable, Progress
from ctlwire.kernel.errors import ClientClosed, RequestTimedOut
from ctlwire.states import LIVE_PEER_STATES
from ctlwire.transports.envelope import Heartbeat
from ctlwire.transports.errors import TransportError, Unroutable, WouldBlock
from ctlwire.transports.transport import ClientTransport

__all__ = ["LIVE_HEARTBEAT_EVERY", "LivenessMonitor"]

log = logging.getLogger("ctlwire.client")
_LIVE = LIVE_PEER_STATES

LIVE_HEARTBEAT_EVERY = 8
"""A live rank gets this client's heartbeat every this many intervals (every 2 s at the
default interval); a rank not live, every interval. An engine's loss is not found
through them (missed beacon heartbeats and the socket monitor find it), and an engine
only counts them; they keep this client's route fresh in a binding engine, which
replaces a route only once it has been silent for 10 s."""


class LivenessMonitor:
    """Drives the peer table of one client; see the module docstring.

    ``counters`` is the client's counter dict (the monitor adds to
    ``heartbeats_sent``, ``heartbeats_received``, ``engine_lost``,
    ``engine_restarted``, ``engine_stalled``, ``client_stalls`` and
    ``implausible_incarnation``).
    ``interval=None`` disables time-based liveness (the peer table still
    judges by a 1 s interval what it is told; nothing ticks it).
    """

    def __init__(self, transport: ClientTransport, ranks: Sequence[int], *,
                 interval: float | None, misses_allowed: int,
                 fail_rank: Callable[[int, str], None], counters: dict[str, int],
                 stall_limit: float = 300.0,
                 stall_limits: Mapping[str, float] | None = None,
                 incarnation_window: float = 60.0) -> None:
        self.transport = transport
        self.ranks = tuple(ranks)
        self.interval = interval
        self.peers = PeerTable(self.ranks, interval=interval or 1.0,
                               misses_allowed=misses_allowed, stall_limit=stall_limit,
                               stall_limits=stall_limits, incarnation_window=incarnation_window)
        self.counters = counters
        counters.setdefault("implausible_incarnation", 0)
        #: the wall clock incarnations are judged by (seconds since the epoch)
        self.wall: Callable[[], float] = time.time
        self._warned_implausible: set[int] = set()
        self._fail_rank = fail_rank
        #: the clock (the client sets the event loop's own once it runs)
        self.now: Callable[[], float] = anyio.current_time
        #: set, then replaced, whenever a rank becomes live or is lost, and on close
        self.peer_changed = anyio.Event()
        #: called with a rank once it is lost, after its calls failed (the client's
        #: membership: a rank whose registration is lost leaves when it dies)
        self.on_lost: Callable[[int], None] | None = None
        self.closed = False

    def close(self) -> None:
        """The client closed: stop reporting losses; wake whoever waits for a change."""
        self.closed = True
        self.notify_peer_change()

    def add_rank(self, rank: int) -> None:
        """Track ``rank`` from now on (heartbeats go to it; Unknown until heard from)."""
        if self.peers.add(rank):
            self.ranks = tuple(sorted((*self.ranks, rank)))

    def remove_rank(self, rank: int) -> None:
        """Stop tracking ``rank`` (no heartbeats to it; its frames are foreign).
        What that means for its calls is the client's."""
        if self.peers.remove(rank):
            self.ranks = tuple(r for r in self.ranks if r != rank)
            self.notify_peer_change()  # a send waiting for its first contact gives up

    def rank_status(self, rank: int) -> dict[str, Any]:
        """What is known of ``rank``: its PeerLink state, incarnation, and what it runs."""
        peer = self.peers.peers.get(rank)
        if peer is None:
            raise ValueError(f"rank {rank} is not one of this client's ranks {self.ranks}")
        return peer.describe()

    async def wait_ready(self, ranks: Sequence[int], timeout: float) -> None:
        """Wait until every rank in ``ranks`` has been heard from. Raises
        RequestTimedOut naming the ranks still missing, ClientClosed when the
        client closes meanwhile."""
        with anyio.move_on_after(timeout):
            while True:
                if self.closed:
                    raise ClientClosed("client is closed")
                missing = [r for r in ranks if r not in self.peers.live_ranks()]
                if not missing:
                    return
                await self.peer_changed.wait()
        missing = [r for r in ranks if r not in self.peers.live_ranks()]
        raise RequestTimedOut(f"wait_ready (ranks {missing} not connected)", timeout)

    # -- what the client hears -------------------------------------------------
    def heartbeat(self, rank: int, hb: Heartbeat) -> Progress | None:
        """A heartbeat from ``rank``. Returns what it says the rank is running
        (for the client's progress callbacks), None when idle or not current."""
        self.counters["heartbeats_received"] += 1
        if not hb.method:
            # idle from the admitted incarnation of a Connected rank (nearly every
            # heartbeat): a refresh, no state change; that incarnation was judged when
            # it was admitted
            if not self.peers.reply_seen(rank, hb.incarnation, self.now()):
                self.seen(rank, hb.incarnation, authoritative=True)
            return None
        busy_for = hb.busy_for if math.isfinite(hb.busy_for) else 0.0
        progress = Progress(hb.busy, hb.method[:200], busy_for, hb.loops,
                            hb.progress if math.isfinite(hb.progress) else -1.0, hb.note[:200])
        peers = self.peers
        stalls = peers.peers[rank].stall_count if rank in peers.peers else 0
        if not self.seen(rank, hb.incarnation, authoritative=True, progress=progress):
            return None
        peer = peers.peers.get(rank)
        if peer is None or peer.incarnation != hb.incarnation:
            return None
        if peer.stall_count > stalls:
            self.counters["engine_stalled"] += 1
            log.warning("ctlwire: engine rank %d stalled: %s running for %.1f s (limit %.1f s)",
                        rank, hb.method, busy_for, peers.stall_limit_for(hb.method))
        return progress

    def plausible(self, rank: int, incarnation: int) -> bool:
        """Whether ``incarnation`` may be believed (see the module docstring); a refusal
        is counted, and logged once per rank."""
        if self.peers.plausible(incarnation, self.wall()):
            return True
        self.counters["implausible_incarnation"] += 1
        if rank not in self._warned_implausible and len(self._warned_implausible) < 64:
            self._warned_implausible.add(rank)
            log.warning("ctlwire: refused a frame for rank %d claiming incarnation %d, minted "
                        "more than %.0f s in the future (a forged frame or a clock far "
                        "ahead); further refusals are only counted", rank, incarnation,
                        self.peers.incarnation_window)
        return False

    def seen(self, rank: int, incarnation: int, *, authoritative: bool,
             progress: Progress | None = None) -> bool:
        """``rank`` was heard from under ``incarnation`` (a reply is not authoritative
        about progress, a heartbeat is). False when the incarnation is implausible:
        nothing was taken from the frame, which the caller drops."""
        if not self.plausible(rank, incarnation):
            return False
        peers = self.peers
        was_live = peers.state(rank) in _LIVE
        restarted = peers.seen(rank, incarnation, self.now(), authoritative=authoritative,
                               progress=progress)
        for r in restarted:
            self.counters["engine_restarted"] += 1
            self._fail_rank(r, "engine restarted (new incarnation)")
        if not was_live and peers.state(rank) in _LIVE:
            self.notify_peer_change()
        return True

    def disconnected(self, rank: int, detail: str) -> None:
        """The transport reports ``rank`` disconnected."""
        if self.peers.disconnected(rank, anyio.current_time()):
            self.rank_lost(rank, detail)

    def notify_peer_change(self) -> None:
        self.peer_changed.set()
        self.peer_changed = anyio.Event()

    def rank_lost(self, rank: int, detail: str) -> None:
        if self.closed:
            # after the client closed nothing is pending: engines that stop now (a
            # disconnect, an unroutable heartbeat) are a shutdown, not a loss to report
            return
        self.counters["engine_lost"] += 1
        log.warning("ctlwire: engine rank %d lost (%s)", rank, detail)
        self._fail_rank(rank, detail)
        if self.on_lost is not None:
            self.on_lost(rank)
        self.notify_peer_change()

    # -- the passing of time ---------------------------------------------------
    async def run(self, incarnation: int) -> None:
        """The heartbeat task: every interval, judge the ranks (unless this loop
        was stalled) and send each rank a heartbeat of ``incarnation``."""
        interval = self.interval
        assert interval
        peers = self.peers
        transport = self.transport
        hb_seq = 0
        last = self.now()
        while True:
            await anyio.sleep(interval)
            now = self.now()
            lag = now - last - interval
            last = now
            if lag > interval / 2:
                # this client's own loop was blocked (a blocking call, a GC pause):
                # the engines' heartbeats of that time are still queued, unread.
                # That time is not their silence; judge them once they are read.
                self.counters["client_stalls"] += 1
                peers.excuse(lag, now)
            else:
                for rank in peers.tick(now):
                    self.rank_lost(rank, f"no heartbeat for {peers.misses_allowed} intervals")
            hb_seq += 1
            live = set(peers.live_ranks())
            heartbeat = Heartbeat(-1, incarnation, hb_seq)
            # a live rank needs only to know we are there: at the first tick, then less often
            to_live = (hb_seq - 1) % LIVE_HEARTBEAT_EVERY == 0
            with transport.batched_sends():  # one readiness re-check a tick
                for rank in self.ranks:
                    if not to_live and rank in live:
                        continue
                    try:
                        transport.send_nowait(rank, heartbeat)
                        self.counters["heartbeats_sent"] += 1
                    except Unroutable:
                        # unroutable and silent: gone. (Unroutable while its beacon is
                        # heard: the request connection is being re-established.)
                        peer = peers.peers[rank]
                        if (rank in live and now - peer.last_seen > interval
                                and peers.disconnected(rank, now)):
                            self.rank_lost(rank, "unroutable")
                    except (WouldBlock, TransportError):
                        pass
