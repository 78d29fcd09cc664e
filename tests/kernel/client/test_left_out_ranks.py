"""A rank a fan-out leaves out counts where success is judged: ``ok``,
``failures`` (a typed ``RankLeftOut``), ``raise_for_errors()``, the table and the
summary. Asking for the admissible ranks only is explicit (``ranks="admissible"``)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from ctlwire.kernel import (
    EngineEndpoint,
    Quarantine,
    RankLeftOut,
    RequestMetrics,
    RequestTimedOut,
)

pytestmark = [pytest.mark.anyio, pytest.mark.ctlwire_virtual_clock]


def setup(ep: EngineEndpoint) -> None:
    rank = ep.rank

    @ep.method()
    def load() -> int:
        return rank

    @ep.method()
    async def hang() -> None:
        await anyio.sleep(3600)


async def test_a_quarantined_rank_makes_a_default_fan_out_not_ok(ctlwire_harness: Any) -> None:
    metrics = RequestMetrics()
    async with ctlwire_harness(ranks=3, setup=setup) as h:
        h.client.registry.observers.append(metrics)
        h.client.quarantine.add(Quarantine(1, "weight-update@1", "update", "lost"))
        res = await h.client.fan_out("load", timeout=10)
        only = await h.client.fan_out("load", ranks="admissible", timeout=10)
        named = await h.client.fan_out("load", ranks=(0, 2), timeout=10)
    assert res.results == {0: 0, 2: 2} and not res.errors and res.left_out == {1: "quarantined"}
    assert not res.ok
    (error,) = res.failures.values()
    assert list(res.failures) == [1] and isinstance(error, RankLeftOut)
    assert (error.rank, error.reason) == (1, "quarantined")
    with pytest.raises(RankLeftOut, match="rank 1 left out: quarantined"):
        res.raise_for_errors()
    assert [(row.rank, row.status, type(row.error).__name__) for row in res.table()] == [
        (0, "ok", "NoneType"), (1, "left out", "RankLeftOut"), (2, "ok", "NoneType")]
    assert res.summary() == "load: 2 ok (ranks 0, 2); 1 left out (rank 1: quarantined)"
    # asked for explicitly: the same ranks, the one left out reported, not counted
    assert only.ok and only.left_out == {1: "quarantined"} and not only.failures
    only.raise_for_errors()
    assert only.summary().endswith("1 left out, admissible ranks only (rank 1: quarantined)")
    # naming the ranks leaves nothing out
    assert named.ok and not named.left_out
    # the requests' outcomes: the default one PARTIAL, the explicit ones DONE
    assert metrics.outcomes == {("load", "PARTIAL"): 1, ("load", "DONE"): 2}


async def test_a_timed_out_fan_out_keeps_its_left_out_ranks(ctlwire_harness: Any) -> None:
    async with ctlwire_harness(ranks=2, setup=setup) as h:
        h.client.quarantine.add(Quarantine(0, "op", "step", "held"))
        with pytest.raises(RequestTimedOut) as timed_out:
            await h.client.fan_out("hang", timeout=1.0)
    partial = timed_out.value.partial
    assert partial is not None and partial.pending == (1,)
    assert partial.left_out == {0: "quarantined"} and isinstance(
        partial.failures[0], RankLeftOut)


async def test_ranks_must_be_ranks_or_admissible(ctlwire_harness: Any) -> None:
    async with ctlwire_harness(ranks=2, setup=setup) as h:
        with pytest.raises(ValueError, match="'admissible'"):
            await h.client.fan_out("load", ranks="all", timeout=10)  # type: ignore[arg-type]
