"""The engine's inbound parts alone (sans-IO): the fence guard, the per-peer
duplicate filter and the idempotency cache."""

from __future__ import annotations

import pytest

from ctlwire.kernel.core.duplicate_filter import DuplicateFilter
from ctlwire.kernel.core.fencing import FenceGuard, FenceVerdict, new_fence
from ctlwire.kernel.core.result_cache import (
    ENTRY_OVERHEAD,
    NOT_RETAINED,
    RUNNING,
    RecordedOutcome,
    ResultCache,
)
from ctlwire.transports.envelope import ErrorInfo

NOW = 1_700_000_000.0  # seconds since the epoch
NOW_US = int(NOW * 1_000_000)


# -- FenceGuard -------------------------------------------------------------------------


def test_a_fence_is_admitted_within_the_window_and_refused_beyond() -> None:
    guard = FenceGuard(window=60.0)
    assert guard.limit(NOW) == NOW_US + 60_000_000
    assert guard.verdict(NOW_US + 60_000_000, NOW) is FenceVerdict.ADMIT
    assert guard.verdict(NOW_US + 60_000_001, NOW) is FenceVerdict.OUT_OF_RANGE
    assert guard.verdict(2**64 - 1, NOW) is FenceVerdict.OUT_OF_RANGE
    assert guard.verdict(-5, NOW) is FenceVerdict.OUT_OF_RANGE
    in_nanoseconds = NOW_US * 1000
    assert guard.verdict(in_nanoseconds, NOW) is FenceVerdict.OUT_OF_RANGE
    assert guard.out_of_range == 4 and guard.high == 0  # a verdict never moves the fence


def test_only_accept_moves_the_fence_and_it_never_goes_back() -> None:
    guard = FenceGuard()
    assert guard.verdict(10, NOW) is FenceVerdict.ADMIT and guard.high == 0
    guard.accept(10)
    assert guard.verdict(9, NOW) is FenceVerdict.STALE and guard.stale == 1
    assert guard.verdict(10, NOW) is FenceVerdict.ADMIT  # the same token again
    guard.accept(7)
    assert guard.high == 10


def test_a_minted_fence_is_admitted_by_an_engine_on_the_same_clock() -> None:
    import time

    guard = FenceGuard(window=0.0)
    fence = new_fence()
    assert guard.verdict(fence, time.time() + 1.0) is FenceVerdict.ADMIT


def test_a_negative_window_is_refused() -> None:
    with pytest.raises(ValueError):
        FenceGuard(window=-1.0)


# -- DuplicateFilter --------------------------------------------------------------------


def test_duplicates_are_per_peer() -> None:
    f = DuplicateFilter()
    assert f.seen(b"a", 7) is False
    assert f.seen(b"a", 7) is True
    assert f.seen(b"b", 7) is False  # another peer's 7 is not a duplicate
    assert f.seen(b"b", 7) is True


def test_another_peer_cannot_push_a_peers_ids_out_of_its_window() -> None:
    f = DuplicateFilter(window=4)
    f.seen(b"legit", 1)
    for i in range(10_000):
        f.seen(b"hostile", i)
    assert f.seen(b"legit", 1) is True
    assert len(f) == 1 + 4


def test_the_filter_is_bounded_in_ids_and_peers() -> None:
    f = DuplicateFilter(window=3, max_peers=2)
    for i in range(5):
        f.seen(b"a", i)
    assert f.seen(b"a", 0) is False  # fell out of a's window of 3
    f.seen(b"b", 1)
    f.seen(b"a", 9)  # a heard from last: b is now the least recent
    f.seen(b"c", 1)
    assert f.peers_evicted == 1 and f.seen(b"a", 9) is True and f.seen(b"b", 1) is False
    assert len(f) <= 2 * 3


# -- ResultCache ------------------------------------------------------------------------


def ok(data: bytes = b"\x01") -> RecordedOutcome:
    return RecordedOutcome(True, data, None)


def test_keys_are_scoped_by_peer_and_method() -> None:
    c = ResultCache()
    assert c.start(b"a", "update", "k", NOW)
    c.finish(b"a", "update", "k", ok(b"a-result"), NOW)
    assert c.lookup(b"a", "update", "k") is not None
    assert c.lookup(b"b", "update", "k") is None  # another peer: runs
    assert c.lookup(b"a", "flush", "k") is None  # another method with the same key: runs


def test_a_recorded_error_is_what_a_repeat_gets() -> None:
    c = ResultCache()
    c.start(None, "m", "k", NOW)
    boom = RecordedOutcome(False, b"\xc0", ErrorInfo("RuntimeError", "boom", 0))
    c.finish(None, "m", "k", boom, NOW)
    again = c.lookup(None, "m", "k")
    assert again is not None and not again.ok and again.error == boom.error


def test_a_running_key_is_running_and_an_abandoned_one_is_forgotten() -> None:
    c = ResultCache()
    c.start(None, "m", "k", NOW)
    assert c.lookup(None, "m", "k") is RUNNING
    c.abandon(None, "m", "k")
    assert c.lookup(None, "m", "k") is None and len(c) == 0 and c.bytes == 0
    assert c.start(None, "m", "k", NOW)  # a retry runs


def test_key_length_is_bounded_in_utf8_bytes() -> None:
    c = ResultCache(max_key_bytes=8)
    assert c.key_fits("12345678") and not c.key_fits("123456789")
    assert not c.key_fits("ééééé")  # 5 characters, 10 bytes


def test_bytes_count_keys_results_and_errors() -> None:
    c = ResultCache()
    c.start(b"peer", "m", "key", NOW)
    running = c.bytes
    assert running >= ENTRY_OVERHEAD + len("m") + len("key") + len(b"peer")
    c.finish(b"peer", "m", "key", ok(b"x" * 10_000), NOW)
    assert c.bytes >= 10_000 + len("key")
    c2 = ResultCache()
    c2.start(None, "m", "k", NOW)
    c2.finish(None, "m", "k", RecordedOutcome(False, b"", ErrorInfo("E", "m" * 5000)), NOW)
    assert c2.bytes >= 5000


def test_an_entry_inside_its_retention_is_never_evicted_new_keys_are_refused() -> None:
    c = ResultCache(max_entries=3, retention=60.0, owner_share=1.0)
    for k in "abc":
        assert c.start(None, "m", k, NOW)
        c.finish(None, "m", k, ok(), NOW)
    assert not c.start(None, "m", "d", NOW + 59.0)  # refused, nothing evicted
    assert c.refused_full == 1 and c.evicted == 0
    assert all(c.lookup(None, "m", k) is not None for k in "abc")
    assert c.start(None, "m", "d", NOW + 60.0)  # "a" is past its retention now
    assert c.evicted == 1 and c.lookup(None, "m", "a") is None


def test_the_byte_budget_holds_with_the_same_rule() -> None:
    c = ResultCache(max_bytes=4 * ENTRY_OVERHEAD + 2000, retention=60.0, owner_share=1.0)
    assert c.start(None, "m", "a", NOW)
    c.finish(None, "m", "a", ok(b"x" * 1500), NOW)
    refused = 0
    for i in range(20):
        if not c.start(None, "m", f"k{i}", NOW):
            refused += 1
    assert refused > 0 and c.refused_full == refused and c.evicted == 0
    assert c.bytes <= c.max_bytes and c.lookup(None, "m", "a") is not None


def test_a_result_too_large_to_keep_is_recorded_as_not_retained() -> None:
    c = ResultCache(max_bytes=2 * ENTRY_OVERHEAD + 1000, retention=60.0, owner_share=1.0)
    assert c.start(None, "m", "big", NOW)
    c.finish(None, "m", "big", ok(b"x" * 10_000), NOW)
    again = c.lookup(None, "m", "big")
    assert again is NOT_RETAINED and c.results_not_kept == 1
    assert c.bytes <= c.max_bytes


def test_running_keys_are_never_evicted() -> None:
    c = ResultCache(max_entries=2, retention=0.0, owner_share=1.0)
    assert c.start(None, "m", "a", NOW) and c.start(None, "m", "b", NOW)
    assert not c.start(None, "m", "c", NOW + 1e6)
    assert c.lookup(None, "m", "a") is RUNNING and c.lookup(None, "m", "b") is RUNNING


@pytest.mark.parametrize("budget", ["entries", "bytes"])
def test_several_owners_filling_the_cache_evict_nothing_inside_its_retention(
        budget: str) -> None:
    """Each owner within its share, the cache full between them: a new key is
    refused (CacheFull) until the oldest outcome is past its retention, and
    then only that one goes."""
    fill = ok(b"x" * NOT_RETAINED.size)  # an outcome as large as start() reserves
    probe = ResultCache()
    assert probe.start(b"p0", "m", "k", NOW)
    entry_bytes = probe.bytes
    if budget == "entries":
        c = ResultCache(max_entries=4, retention=60.0, owner_share=0.25)
    else:
        c = ResultCache(max_bytes=4 * entry_bytes, retention=60.0, owner_share=0.25)
    peers = [b"p%d" % i for i in range(6)]
    for i, peer in enumerate(peers[:4]):
        assert c.start(peer, "m", "k", NOW + i)
        c.finish(peer, "m", "k", fill, NOW + i)
    assert c.owners == 4 and len(c) == 4 and c.bytes == 4 * entry_bytes
    assert not c.start(peers[4], "m", "k", NOW + 59.5)  # the oldest is 59.5 s old
    assert c.refused_full == 1 and c.evicted == 0
    assert all(c.lookup(p, "m", "k") is fill for p in peers[:4])
    assert c.start(peers[4], "m", "k", NOW + 60.0)  # the oldest is past its retention
    assert c.evicted == 1 and c.lookup(peers[0], "m", "k") is None
    assert not c.start(peers[5], "m", "k", NOW + 60.5)  # the next oldest is 59.5 s old
    assert c.refused_full == 2 and c.evicted == 1
    assert all(c.lookup(p, "m", "k") is fill for p in peers[1:4])
