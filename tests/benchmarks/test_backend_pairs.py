"""``python -m ctlwire.benchmarks.backend_pairs``: trio vs asyncio in paired rounds."""

from __future__ import annotations

import sys

import pytest

from ctlwire.benchmarks.backend_pairs import METRICS, PairedResult, run_pairs
from ctlwire.benchmarks.scenarios import BackendRound


def _round(p50: float, rate: float, fan: float, cpu: float, cpu_fan: float) -> BackendRound:
    return BackendRound([p50 - 1, p50, p50 + 1], rate, fan, cpu, cpu_fan)


def test_each_ratio_is_oriented_so_that_higher_is_trios_advantage() -> None:
    result = PairedResult(
        asyncio=[_round(200, 1000, 100, 50, 400), _round(100, 2000, 50, 40, 300)],
        trio=[_round(250, 800, 110, 60, 500), _round(100, 3000, 50, 20, 600)])
    names = [m[0] for m in METRICS]
    assert result.ratios(names.index("sequential call p50 (µs)")) == [0.8, 1.0]
    assert result.ratios(names.index("64 concurrent callers (calls/s)")) == [0.8, 1.5]
    assert result.ratios(names.index("queueing fan-out, 8 engines (fan-outs/s)")) == [1.1, 1.0]
    assert result.ratios(names.index("client CPU per concurrent call (µs)")) == [50 / 60, 2.0]
    assert result.ratios(names.index("client CPU per fan-out (µs)")) == [0.8, 0.5]
    table = result.table()
    assert "2 pairs kept, 0 dropped" in table
    assert "64 concurrent callers (calls/s)" in table and "paired ratio 1.150" in table


@pytest.mark.timeout(180)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="steal is read from /proc")
def test_a_pair_over_the_steal_limit_is_run_again_on_real_engines() -> None:
    # every pair "exceeds" a negative limit: the first is dropped, the second kept
    # (no more drops than pairs asked for)
    result = run_pairs(1, max_steal=-1.0, quick=True)
    assert result.dropped == 1
    assert len(result.asyncio) == len(result.trio) == 1
    for r in (result.asyncio[0], result.trio[0]):
        assert len(r.seq_us) == 300 and all(x > 0 for x in r.seq_us)
        assert r.rate > 0 and r.fan_rate > 0
        assert r.cpu_per_call_us > 0 and r.cpu_per_fan_out_us > 0
    assert all(x > 0 for i in range(len(METRICS)) for x in result.ratios(i))


def test_no_pairs_is_a_usage_error() -> None:
    with pytest.raises(ValueError):
        run_pairs(0)
