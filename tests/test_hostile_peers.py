"""Issue 11, kernel side: hostile peers cannot grow kernel structures without
bound, stall replies to other clients, evict legitimate routes, or impersonate
a rank under CURVE. Counts and sizes are asserted, never durations."""

from __future__ import annotations

from typing import Any

import msgspec

from ctlwire.kernel.request_registry import ReplyDisposition, RequestRegistry
from ctlwire.transports.envelope import Reply

NIL = msgspec.Raw(b"\xc0")


def test_a_tombstone_never_grows_past_the_ranks_its_request_addressed() -> None:
    """Replies to a cleaned request claiming 10,000 different ranks are counted
    stray; the tombstone keeps at most the addressed ranks."""
    reg = RequestRegistry(max_tombstones=4)
    entry = reg.register("m", (0, 1))
    reg.mark_sent(entry, 0)
    reg.mark_sent(entry, 1)
    assert reg.on_reply(Reply(entry.id, 0, 1, True, NIL))[0] is ReplyDisposition.ACCEPTED
    reg.release(entry)  # cancelled with rank 1 outstanding
    dispositions: dict[ReplyDisposition, int] = {}
    for rank in range(10_000):
        disp, _ = reg.on_reply(Reply(entry.id, rank, 1, True, NIL))
        dispositions[disp] = dispositions.get(disp, 0) + 1
    tomb: Any = reg._tombstones[entry.id]
    print(f"tombstone answered set after 10,000 forged ranks: {sorted(tomb.answered)}")
    assert tomb.answered == {0, 1}
    # rank 0 had answered (duplicate), rank 1 is late once, the other 9,998 are stray
    assert dispositions == {ReplyDisposition.DUPLICATE: 1, ReplyDisposition.LATE: 1,
                            ReplyDisposition.STRAY: 9_998}
    assert reg.stats.stray == 9_998
    reg.check_invariants()


def test_a_reply_whose_connection_rank_differs_from_its_claim_never_enters_a_tombstone() -> None:
    reg = RequestRegistry()
    entry = reg.register("m", (0,))
    reg.mark_sent(entry, 0)
    reg.release(entry)
    # the envelope claims rank 0 but came in on rank 5's connection
    assert reg.on_reply(Reply(entry.id, 0, 1, True, NIL), peer=5)[0] is ReplyDisposition.STRAY
    assert reg._tombstones[entry.id].answered == set()
