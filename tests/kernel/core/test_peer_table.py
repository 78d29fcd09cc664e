"""PeerTable: the PeerLink machine driven by heartbeats, misses and disconnections."""

from __future__ import annotations

import time

import pytest

from ctlwire.kernel.core.peer_table import PeerTable, Progress, incarnation_at
from ctlwire.kernel.engine.liveness import new_incarnation
from ctlwire.states import PeerState


def test_suspect_then_lost_after_missed_heartbeats() -> None:
    t = PeerTable([0], interval=0.25, misses_allowed=4)
    assert t.state(0) is PeerState.UNKNOWN
    assert t.seen(0, 7, now=0.0) == []
    assert t.state(0) is PeerState.CONNECTED
    assert t.tick(0.30) == [] and t.state(0) is PeerState.CONNECTED  # within grace
    assert t.tick(0.40) == [] and t.state(0) is PeerState.SUSPECT
    assert t.seen(0, 7, now=0.45) == [] and t.state(0) is PeerState.CONNECTED
    assert t.tick(1.50) == []
    assert t.tick(1.58) == [0] and t.state(0) is PeerState.LOST
    assert t.tick(5.0) == []  # reported once
    assert t.is_lost(0) and 0 not in t.live_ranks()


def test_rejoin_after_lost_and_restart_detection() -> None:
    t = PeerTable([0], interval=0.25)
    t.seen(0, 7, now=0.0)
    assert t.disconnected(0, now=0.1)
    assert not t.disconnected(0, now=0.2)
    assert t.seen(0, 7, now=0.3) == [] and t.state(0) is PeerState.CONNECTED
    # a new incarnation while connected is a restart: the old one's requests must fail
    assert t.seen(0, 9, now=0.4) == [0]
    assert t.state(0) is PeerState.CONNECTED and t.peers[0].incarnation == 9
    assert t.is_stale(0, 7) and not t.is_stale(0, 9)
    assert t.peers[0].lost_count == 2 and t.peers[0].rejoin_count == 2


def test_replies_refresh_liveness_but_do_not_change_incarnation() -> None:
    t = PeerTable([0], interval=0.25)
    t.seen(0, 7, now=0.0)
    assert t.seen(0, 8, now=0.1, authoritative=False) == []
    assert t.peers[0].incarnation == 7
    t.disconnected(0, now=0.2)
    assert t.seen(0, 8, now=0.3, authoritative=False) == []
    assert t.state(0) is PeerState.LOST  # a stale reply does not resurrect the rank


def test_invalid_configuration() -> None:
    with pytest.raises(ValueError):
        PeerTable(interval=0)
    with pytest.raises(ValueError):
        PeerTable(misses_allowed=0)


def test_late_heartbeat_of_a_replaced_process_is_ignored() -> None:
    t = PeerTable([0], interval=0.25)
    t.seen(0, 100, now=0.0)
    assert t.seen(0, 200, now=0.1) == [0]  # restart: the old incarnation's calls fail
    assert t.seen(0, 100, now=0.2) == []   # a heartbeat of the old process, late
    assert t.peers[0].incarnation == 200 and t.peers[0].lost_count == 1
    assert t.is_stale(0, 100)


def test_older_incarnation_is_fenced_even_after_lost() -> None:
    """Once an incarnation is admitted, an older one (a frozen process that thaws
    after its replacement started) is never admitted again."""
    t = PeerTable([0], interval=0.25)
    t.seen(0, 300, now=0.0)
    assert t.seen(0, 500, now=0.1) == [0]  # the replacement is admitted
    t.disconnected(0, now=0.2)
    assert t.seen(0, 300, now=0.3) == []  # the old process thaws
    assert t.state(0) is PeerState.LOST and t.peers[0].incarnation == 500
    assert t.fenced == 1 and t.is_stale(0, 300)
    assert t.seen(0, 500, now=0.4) == [] and t.state(0) is PeerState.CONNECTED  # same one back


def test_busy_and_stalled_ranks_stay_alive() -> None:
    t = PeerTable([0], interval=0.25, stall_limit=5.0, stall_limits={"update_weights": 60.0})
    t.seen(0, 7, now=0.0)
    busy = Progress(11, "update_weights", 30.0, 3, 0.5, "half")
    assert t.seen(0, 7, now=0.1, progress=busy) == []
    assert t.state(0) is PeerState.BUSY and t.peers[0].progress.fraction == 0.5
    # its own stall limit (60 s) applies, not the default (5 s)
    assert t.seen(0, 7, now=0.2, progress=Progress(11, "update_weights", 61.0)) == []
    assert t.state(0) is PeerState.STALLED and t.peers[0].stall_count == 1
    assert t.tick(0.3) == [] and 0 in t.live_ranks() and not t.is_lost(0)
    assert t.seen(0, 7, now=0.4, progress=Progress(0, "get_load", 6.0)) == []
    assert t.state(0) is PeerState.STALLED and t.peers[0].stall_count == 1  # one episode
    assert t.seen(0, 7, now=0.5, progress=Progress()) == []
    assert t.state(0) is PeerState.CONNECTED


def test_a_stall_of_the_client_itself_is_excused() -> None:
    t = PeerTable([0, 1], interval=0.25, misses_allowed=4)
    t.seen(0, 7, now=0.0)
    t.seen(1, 8, now=0.0)
    t.excuse(2.0, now=2.0)  # the client's loop was blocked for 2 s
    assert t.tick(2.0) == [] and t.live_ranks() == [0, 1]
    assert t.tick(3.2) == [0, 1]  # silence after the stall still counts


def test_frames_of_ranks_outside_the_table_are_counted_not_added() -> None:
    t = PeerTable([0], interval=0.25)
    for rank in range(1, 1001):
        assert t.seen(rank, 1, now=0.0) == []
    assert list(t.peers) == [0] and t.foreign == 1000


def test_incarnations_minted_beyond_the_window_are_implausible_and_counted() -> None:
    wall = 1_800_000_000.0
    table = PeerTable([0], incarnation_window=60.0)
    assert table.plausible(incarnation_at(wall) | 0xFFF, wall)
    assert table.plausible(incarnation_at(wall + 60.0) | 0xFFF, wall)  # at the edge
    assert table.plausible(1, wall)  # old and small: plausible (fencing judges order)
    assert table.implausible == 0
    assert not table.plausible(incarnation_at(wall + 61.0), wall)
    assert not table.plausible(2**64 - 1, wall)
    assert not table.plausible(-1, wall)
    assert table.implausible == 3
    assert table.plausible(new_incarnation(), time.time())  # what engines mint
    with pytest.raises(ValueError):
        PeerTable([0], incarnation_window=-1.0)


def test_lost_count_follows_every_way_in_and_out_of_lost() -> None:
    """``lost_count`` is what lets a send skip the per-rank lost check: it must equal
    the number of Lost peers after every change."""
    t = PeerTable([0, 1, 2], interval=0.25, misses_allowed=4)

    def lost() -> int:
        return sum(t.state(r) is PeerState.LOST for r in t.peers)

    for rank in (0, 1, 2):
        t.seen(rank, 7, now=0.0)
    assert t.lost_count == lost() == 0
    t.disconnected(0, now=0.1)
    assert t.tick(2.0) == [1, 2]  # missed heartbeats
    assert t.lost_count == lost() == 3
    t.seen(1, 7, now=2.1)  # rejoins
    assert t.lost_count == lost() == 2
    assert t.remove(0)  # a Lost rank removed: retired, no longer counted
    assert t.lost_count == lost() == 1 and t.is_lost(0)
    t.add(0)
    t.seen(2, 9, now=2.2)  # a restart rejoins too
    assert t.lost_count == lost() == 0
