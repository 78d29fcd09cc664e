"""Cost of one request lifecycle: derived table versus a transitions model.

A lifecycle is what the registry does per request: create an entry, apply
send, wait, complete and clean, remove the entry. Measured with ``live``
other requests already in the map (10 and 10,000) to show whether the cost
grows with the number of live requests. The transitions baseline is the
cheapest way to use transitions for many requests: one shared ``Machine``,
``add_model``/``remove_model`` per request and its generated triggers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from transitions import Machine

from ctlwire.states import CONTROL_REQUEST, CONTROL_REQUEST_TABLE, RequestEvent, RequestState

__all__ = ["LifecycleRow", "measure"]

_LIFECYCLE = (RequestEvent.SEND, RequestEvent.WAIT, RequestEvent.COMPLETE, RequestEvent.CLEAN)


@dataclass(frozen=True)
class LifecycleRow:
    live: int
    table_us: float
    transitions_us: float

    @property
    def speedup(self) -> float:
        return self.transitions_us / self.table_us


class _Entry:
    __slots__ = ("id", "state")

    def __init__(self, rid: int) -> None:
        self.id = rid
        self.state = RequestState.REGISTERED


class _Model:
    def __init__(self, rid: int) -> None:
        self.id = rid


def _table_lifecycles(n: int, live: int) -> float:
    table = CONTROL_REQUEST_TABLE
    entries: dict[int, _Entry] = {-i - 1: _Entry(-i - 1) for i in range(live)}
    apply = table.apply
    start = time.perf_counter()
    for rid in range(n):
        entry = _Entry(rid)
        entries[rid] = entry
        for event in _LIFECYCLE:
            entry.state = apply(entry.state, event, rid)
        del entries[rid]
    return (time.perf_counter() - start) / n * 1e6


def _transitions_lifecycles(n: int, live: int) -> float:
    machine = Machine(model=None, **CONTROL_REQUEST.machine_kwargs())
    for i in range(live):
        machine.add_model(_Model(-i - 1))
    triggers = [e.value for e in _LIFECYCLE]
    start = time.perf_counter()
    for rid in range(n):
        model: Any = _Model(rid)
        machine.add_model(model)
        for trig in triggers:
            getattr(model, trig)()
        machine.remove_model(model)
    return (time.perf_counter() - start) / n * 1e6


def measure(quick: bool = False, lives: tuple[int, ...] = (10, 10_000)) -> list[LifecycleRow]:
    """One row per number of live requests; best of three runs each."""
    n_table = 20_000 if quick else 200_000
    n_trans = 500 if quick else 3_000
    rows = []
    for live in lives:
        t = min(_table_lifecycles(n_table, live) for _ in range(3))
        m = min(_transitions_lifecycles(n_trans, live) for _ in range(3))
        rows.append(LifecycleRow(live, t, m))
    return rows


def main() -> None:  # pragma: no cover - manual entry point
    rows = measure()
    print(f"{'live':>7} {'table µs':>10} {'transitions µs':>15} {'speedup':>8}")
    for r in rows:
        print(f"{r.live:>7} {r.table_us:>10.2f} {r.transitions_us:>15.2f} {r.speedup:>7.0f}x")
    growth = rows[-1].table_us / rows[0].table_us
    print(f"table cost at {rows[-1].live} live / at {rows[0].live} live: {growth:.2f}x")


if __name__ == "__main__":  # pragma: no cover
    main()
