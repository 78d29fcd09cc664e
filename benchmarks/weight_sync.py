"""``weight_sync``: one full weight-sync operation of a real model over 4 engine ranks.

A trainer (:class:`~ctlwire.app.torch_weight_sync.Trainer`) pushes a
decoder-only transformer's weights (~57M parameters; ``--quick``: ~13M) to 4
torch engine processes by gloo broadcast, one ctlwire operation per cycle
(pause -> group -> update -> check -> resume; :mod:`~ctlwire.app.torch_demo`).
Each operation's time is split into the data movement (the trainer's
broadcasts and joining the group), the engines' own work (checksum and swap of
the new weights, the slowest rank) and the rest: ctlwire's share (requests,
replies, ledger, pause, check, resume). The row reports ctlwire's share in ms
and as a percentage of the operation (targets: < 20 ms and < 5 %). The engines
run no sequences meanwhile, so no generation step is waited for.

Needs the torch extra; without it the group reports no row and says so.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from typing import Any

from .report import Row, Target
from .stats import median

__all__ = ["ENGINES", "GROUPS", "rows", "timing_rows"]

GROUPS = ("weight_sync",)
ENGINES = 4
SHARE_MS = 20.0
SHARE_PCT = 5.0


def timing_rows(timings: Sequence[Any], params_m: float) -> list[Row]:
    """The rows for measured :class:`~ctlwire.app.torch_demo.SyncTiming` values."""
    control_ms = [t.control * 1e3 for t in timings]
    data_ms = [t.data * 1e3 for t in timings]
    total_ms = [t.total * 1e3 for t in timings]
    engine_ms = [t.engine * 1e3 for t in timings]
    share_ms, total = median(control_ms), median(total_ms)
    details = {"cycles": len(timings), "params_millions": round(params_m, 1),
               "operation_ms": total, "data_movement_ms": median(data_ms),
               "engines_checksum_swap_ms": median(engine_ms),
               "ctlwire_ms_each": [round(v, 2) for v in control_ms],
               "all_ranks_decode_like_trainer": all(t.equal for t in timings),
               "note": "the first cycle (it forms the group) is left out"}
    scenario = f"one weight-sync operation, {ENGINES} ranks, {params_m:.0f}M params"
    return [
        Row("weight_sync", f"{scenario}: ctlwire's share", "ms", share_ms, median(data_ms),
            "data movement (gloo broadcast + group join)",
            100.0 * share_ms / total if total else float("inf"),
            "ctlwire's share / whole operation", Target("<=", SHARE_PCT), details, "%"),
        Row("weight_sync", f"{scenario}: ctlwire's share in ms", "ms", share_ms, total,
            "the whole operation", share_ms, "ctlwire's share (ms)", Target("<=", SHARE_MS),
            {}, " ms"),
    ]


def rows(quick: bool, say: Callable[[str], None]) -> list[Row]:
    """Run the cycles and return the rows; none (said) without torch."""
    if importlib.util.find_spec("torch") is None:
        say("weight_sync: torch is not installed (pip install 'ctlwire[torch]'); no row")
        return []
    import anyio

    from ctlwire.app.torch_demo import run
    from ctlwire.app.torch_engine import DecoderConfig

    config = (DecoderConfig(width=512, layers=4) if quick
              else DecoderConfig(width=768, layers=8))
    width, layers, vocab, ctx = config.width, config.layers, config.vocab, config.context
    params_m = (layers * 12 * width * width + 2 * vocab * width + ctx * width) / 1e6
    cycles = 3 if quick else 6
    timings = anyio.run(lambda: run(ENGINES, cycles, config, load=False, say=say))
    if not timings:
        say("weight_sync: a sync did not commit; no row")
        return []
    return timing_rows(timings[1:] or timings, params_m)  # the first also forms the group
