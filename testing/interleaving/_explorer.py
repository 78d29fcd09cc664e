"""The interleaving explorer's search: explore (memoised depth-first), the shortest
counterexample (breadth-first), replay and the command line.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

from ctlwire.kernel.core.admission_queue import AdmissionQueue
from ctlwire.kernel.core.request_registry import RequestRegistry
from ctlwire.testing.interleaving._checks import _check_final, _step
from ctlwire.testing.interleaving._scenario import (
    _PRIORITY,
    CHECKS,
    Counterexample,
    ExplorationResult,
    InvariantViolation,
    ReplayError,
    Scenario,
    standard_scenarios,
)
from ctlwire.testing.interleaving._steps import _enabled
from ctlwire.testing.interleaving._world import (
    QueueFactory,
    RegistryFactory,
    _clone_world,
    _key,
    _shared,
    _World,
)

__all__ = ["explore", "main", "replay"]

# -- exploration --------------------------------------------------------------------------------


def _checks(checks: Iterable[str]) -> frozenset[str]:
    chosen = frozenset(checks)
    unknown = chosen - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; known: {CHECKS}")
    return chosen


def explore(scenario: Scenario, *, queue_cls: QueueFactory = AdmissionQueue,
            registry_cls: RegistryFactory = RequestRegistry,
            checks: Iterable[str] = CHECKS, reduce: bool = False,
            max_states: int = 5_000_000) -> ExplorationResult:
    """Check every interleaving of ``scenario`` against ``checks`` (see the module
    docstring), driving instances of ``queue_cls`` and ``registry_cls`` (the real
    cores by default; subclasses to test mutants).

    Returns the counts, or, at the first failure, a shortest counterexample
    (found breadth-first) instead of finishing the count. ``reduce``: deliver a
    finished caller's late replies first (fewer paths; see the module
    docstring). Raises RuntimeError past ``max_states`` distinct states.
    """
    chosen = _checks(checks)
    result = ExplorationResult(scenario, checks=tuple(c for c in CHECKS if c in chosen),
                               reduced=reduce)
    started = time.perf_counter()
    root = _World(scenario, queue_cls, registry_cls, chosen, reduce)
    memo: dict[tuple[Any, ...], int] = {}
    seed = _shared(root)
    counters = [0, 0]  # transitions, max depth

    def dfs(w: _World, depth: int) -> int:
        if depth > counters[1]:
            counters[1] = depth
        enabled = _enabled(w)
        if not enabled:
            _check_final(w)
            return 1
        total = 0
        last = len(enabled) - 1
        for i, label in enumerate(enabled):
            child = w if i == last else _clone_world(w, seed)
            _step(child, label)
            counters[0] += 1
            key = _key(child)
            paths = memo.get(key)
            if paths is None:
                if len(memo) >= max_states:
                    raise RuntimeError(f"{scenario.name}: more than {max_states} states")
                paths = dfs(child, depth + 1)
                memo[key] = paths
            total += paths
        return total

    collecting = gc.isenabled()
    gc.disable()  # worlds are acyclic (freed by refcounting); the collector costs ~40 %
    try:
        result.interleavings = dfs(root, 0) * _symmetry(scenario)
    except InvariantViolation:
        result.counterexample = _shortest(scenario, queue_cls, registry_cls, chosen)
    finally:
        if collecting:
            gc.enable()
    result.states = len(memo) + 1
    memo.clear()  # dfs refers to itself (a cycle): let the keys go now
    result.transitions, result.max_depth = counters
    result.seconds = time.perf_counter() - started
    return result


def _symmetry(scenario: Scenario) -> int:
    """How many complete paths each explored one stands for: the permutations of
    the names of callers with equal specs (they are explored in one arrival order)."""
    factor = 1
    for spec in set(scenario.callers):
        factor *= math.factorial(scenario.callers.count(spec))
    return factor


def _shortest(scenario: Scenario, queue_cls: QueueFactory, registry_cls: RegistryFactory,
              checks: frozenset[str]) -> Counterexample:
    """Breadth-first: the shortest failing sequences; among them, one per check,
    the first found of the most preferred check."""
    root = _World(scenario, queue_cls, registry_cls, checks, reduce=False)
    seen = {_key(root)}
    seed = _shared(root)
    frontier: list[tuple[_World, tuple[str, ...]]] = [(root, ())]
    while frontier:
        found: dict[str, tuple[tuple[str, ...], InvariantViolation]] = {}
        nxt: list[tuple[_World, tuple[str, ...]]] = []
        for w, path in frontier:
            enabled = _enabled(w)
            last = len(enabled) - 1
            for i, label in enumerate(enabled):
                child = w if i == last else _clone_world(w, seed)
                events = (*path, label)
                try:
                    _step(child, label)
                    if not _enabled(child):
                        _check_final(child)
                except InvariantViolation as failed:
                    found.setdefault(failed.check, (events, failed))
                    continue
                key = _key(child)
                if key not in seen:
                    seen.add(key)
                    nxt.append((child, events))
        if found:
            ranked = sorted(found.items(), key=lambda item: _PRIORITY[item[0]])
            events, violation = ranked[0][1]
            trace: list[str] = []
            try:
                replay(scenario, events, queue_cls=queue_cls, registry_cls=registry_cls,
                       checks=checks, trace=trace)
            except InvariantViolation as again:
                if again != violation:
                    raise AssertionError(f"replay of {list(events)} raised {again}, "
                                         f"not {violation}") from again
            else:
                raise AssertionError(f"replay of {list(events)} did not fail")
            others = tuple((check, ev) for check, (ev, _) in ranked[1:])
            return Counterexample(scenario, events, violation, tuple(trace), others)
        frontier = nxt
    raise AssertionError("a violation was seen depth-first but not breadth-first")


def replay(scenario: Scenario, events: Sequence[str], *, queue_cls: QueueFactory = AdmissionQueue,
           registry_cls: RegistryFactory = RequestRegistry,
           checks: Iterable[str] = CHECKS, trace: list[str] | None = None) -> list[str]:
    """Re-run exactly ``events`` (e.g. a counterexample's) from the initial state.

    Raises :class:`InvariantViolation` as the explorer saw it (including the
    end-of-run checks when no event is enabled after the last one), or
    :class:`ReplayError` when an event is not enabled where it appears. Returns
    what each event did (also appended to ``trace`` as it goes).
    """
    w = _World(scenario, queue_cls, registry_cls, _checks(checks), reduce=False,
               symmetric=False)
    out = trace if trace is not None else []
    for i, label in enumerate(events):
        enabled = _enabled(w)
        if label not in enabled:
            raise ReplayError(f"event {i + 1} {label!r} is not enabled; enabled: {enabled}")
        _step(w, label, out)
    if not _enabled(w):
        try:
            _check_final(w)
        except InvariantViolation as violation:
            out.append(f"no event can happen any more  !! {violation}")
            raise
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ctlwire.testing.interleaving [MAX_CALLERS [MAX_CALLERS_TWO_RANKS]]``:
    explore :func:`standard_scenarios`, print one summary line per scenario (and
    any counterexample); exit status 1 if a check failed."""
    import sys

    args = [int(a) for a in (sys.argv[1:] if argv is None else argv)]
    failed = 0
    started = time.perf_counter()
    for scenario in standard_scenarios(*args[:2]):
        result = explore(scenario)
        print(result.summary(), flush=True)
        if result.counterexample is not None:
            failed += 1
            print(result.counterexample.format(), flush=True)
    print(f"{failed} failing scenarios, {time.perf_counter() - started:.1f} s")
    return 1 if failed else 0
