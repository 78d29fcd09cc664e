"""Exhaustive interleaving checks of the registry and the fan-out mailbox.

* Every interleaving of every scenario of :func:`standard_scenarios` (up to 3
  callers, every event kind) keeps every invariant; the counts are printed.
* Every interleaving of :func:`pipelined_scenarios` (a mailbox with depth 2 to
  4: several requests in flight) keeps every invariant, the order of sends per
  rank and of completions included.
* Two deliberately broken cores (``tests/testing/broken_cores.py``) -- SGLang's
  wake-up-window admission and FastDeploy's register-after-send -- are each
  caught with a short counterexample that :func:`replay` reproduces; each is
  caught by the structural check *and*, with that check switched off, by the
  symptom check, so neither check is dead weight.
* Pasted sequences replay deterministically.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
from broken_cores import (
    ForgetfulRegistry,
    HandOffOnSendRegistry,
    RegisterAfterSendRegistry,
    ReturnAtDecisionQueue,
    SilentLeaveQueue,
    StartAtOnceQueue,
    WakeupWindowQueue,
)

from ctlwire.kernel.core.admission_queue import AdmissionQueue
from ctlwire.kernel.core.request_registry import RequestRegistry
from ctlwire.testing.interleaving import (
    CHECKS,
    EVERY_KIND,
    CallerSpec,
    CancelMode,
    Counterexample,
    ExplorationResult,
    InvariantViolation,
    ReplayError,
    ReplyMode,
    Scenario,
    explore,
    pipelined_scenarios,
    replay,
    standard_scenarios,
)
from ctlwire.testing.interleaving._checks import _check_final, _step
from ctlwire.testing.interleaving._steps import _enabled
from ctlwire.testing.interleaving._world import _clone_world, _shared, _World

MAX_COUNTEREXAMPLE = 12

# The heaviest scenario runs with the reduction (a finished caller's late replies
# are delivered before anything else, a decided holder that passed the mailbox on
# settles before anything else: they commute with every other event); every
# standard scenario is explored in full.
REDUCED = {"k=3 2 ranks all, every event kind"}
RUNS = [*standard_scenarios(max_callers=3, max_callers_two_ranks=2),
        Scenario.uniform(3, EVERY_KIND, ranks=2, name="k=3 2 ranks all, every event kind")]

# A in flight, B queued, A's reply, C arriving before B resumes: the SGLang scenario
OVERTAKE = Scenario.uniform(3, CallerSpec(), name="A in flight, B queued, reply for A, C arrives")
# FastDeploy: one caller, a fast reply, a deadline (FastDeploy's was 600 s)
FAST_REPLY = Scenario.uniform(1, CallerSpec(timeout=True), name="one caller, fast reply")


def say(capsys: pytest.CaptureFixture[str], text: str) -> None:
    """Print past pytest's capture, so the counts show even under ``pytest -q``."""
    with capsys.disabled():
        print("\n" + text, end="", flush=True)


@pytest.fixture(scope="module")
def totals(request: pytest.FixtureRequest) -> Iterator[list[ExplorationResult]]:
    results: list[ExplorationResult] = []
    yield results
    if not results:
        return
    exact = [r for r in results if not r.reduced]
    line = (f"\ninterleavings, k <= 3: {len(results)} scenarios checked, "
            f"{sum(r.interleavings for r in exact):,} interleavings in the "
            f"{len(exact)} explored exhaustively (+ "
            f"{sum(r.interleavings for r in results if r.reduced):,} representatives in "
            f"{len(results) - len(exact)} reduced), "
            f"{sum(r.states for r in results):,} distinct states, "
            f"{sum(r.transitions for r in results):,} transitions, "
            f"{sum(r.seconds for r in results):.1f} s\n")
    capman: Any = request.config.pluginmanager.getplugin("capturemanager")
    if capman is None:
        print(line)
    else:
        with capman.global_and_fixture_disabled():
            print(line, end="")


@pytest.mark.parametrize("scenario", RUNS, ids=[s.name for s in RUNS])
def test_every_interleaving_keeps_every_invariant(
        scenario: Scenario, totals: list[ExplorationResult],
        capsys: pytest.CaptureFixture[str]) -> None:
    result = explore(scenario, reduce=scenario.name in REDUCED)
    say(capsys, f"interleavings {result.summary()}")
    assert result.ok, result.counterexample and result.counterexample.format()
    assert result.interleavings >= 1 and result.states > 1
    totals.append(result)


PIPELINED = pipelined_scenarios()


@pytest.mark.parametrize("scenario", PIPELINED, ids=[s.name for s in PIPELINED])
def test_every_pipelined_interleaving_keeps_the_admission_order(
        scenario: Scenario, capsys: pytest.CaptureFixture[str]) -> None:
    result = explore(scenario, reduce=scenario.name.endswith("reduced"))
    say(capsys, f"interleavings {result.summary()}")
    assert result.ok, result.counterexample and result.counterexample.format()
    assert result.interleavings >= 1 and result.states > 1


# -- the checker can fail: broken cores --------------------------------------------------


def caught(result: ExplorationResult, check: str, capsys: pytest.CaptureFixture[str],
           **classes: Any) -> Counterexample:
    """The exploration failed on ``check`` with a short counterexample that replays."""
    cx = result.counterexample
    assert cx is not None, f"{result.scenario.name}: the broken core went unnoticed"
    say(capsys, cx.format())
    assert cx.violation.check == check, cx.format()
    assert len(cx) <= MAX_COUNTEREXAMPLE, cx.format()
    with pytest.raises(InvariantViolation) as raised:
        replay(result.scenario, cx.events, checks=result.checks, **classes)
    assert raised.value == cx.violation
    return cx


def test_sglang_wakeup_window_is_caught_as_a_wakeup_without_handoff(
        capsys: pytest.CaptureFixture[str]) -> None:
    """(The same scenario with the real admission queue is clean: "k=3 every event
    kind" above.)"""
    classes = {"queue_cls": WakeupWindowQueue}
    cx = caught(explore(Scenario.uniform(3), **classes), "handoff", capsys, **classes)
    assert cx.events[-1].startswith(("finish A", "cancel A", "raise A"))
    cx = caught(explore(OVERTAKE, **classes), "handoff", capsys, **classes)
    assert cx.events[-1] == "reply A"  # the decision passes the mailbox on


def test_sglang_wakeup_window_is_caught_as_overtaking(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without the hand-off check, the FIFO check sees C overtake B, exactly the
    interleaving of the production bug: A in flight, B queued, reply for A, C
    arrives before B resumes."""
    classes = {"queue_cls": WakeupWindowQueue}
    checks = [c for c in CHECKS if c != "handoff"]
    cx = caught(explore(OVERTAKE, checks=checks, **classes), "fifo", capsys, **classes)
    assert cx.events[-1] == "arrive C"
    assert cx.events.index("arrive B") < cx.events.index("reply A")
    assert "resume B" not in cx.events
    assert "C was admitted while B" in str(cx.violation)
    # with every event kind, the window opens sooner (A cancelled or raising)
    cx = caught(explore(Scenario.uniform(3), checks=checks, **classes), "fifo", capsys,
                **classes)
    assert cx.events[-1] == "arrive C"


def test_a_hand_off_before_the_decision_is_caught(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Passing the mailbox on once the frames are out (not at the decision) leaves
    an undecided request in flight without the mailbox: caught as soon as A
    waits, before B could send."""
    classes = {"registry_cls": HandOffOnSendRegistry}
    cx = caught(explore(OVERTAKE, **classes), "exclusive", capsys, **classes)
    assert cx.events == ("arrive A", "resume A", "register A", "send A", "send A")
    assert "A has a request in flight without holding the mailbox" in str(cx.violation)


def test_a_hand_off_at_the_decision_that_wakes_nobody_is_caught(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The decision admits B but nobody wakes B: the hand-off check sees it at once,
    and without it, the progress check sees B hang."""
    classes = {"queue_cls": SilentLeaveQueue}
    cx = caught(explore(OVERTAKE, **classes), "handoff", capsys, **classes)
    assert cx.events[-1] == "reply A" and "never woken" in str(cx.violation)
    checks = [c for c in CHECKS if c != "handoff"]
    cx = caught(explore(OVERTAKE, checks=checks, **classes), "progress", capsys, **classes)
    assert "B (queued)" in str(cx.violation)


# two callers with replies in any order, depth 2: both in flight at once
PIPELINE = Scenario.uniform(2, CallerSpec(), depth=2, name="depth 2, two callers")


def test_pipelining_that_lets_two_callers_send_at_once_is_caught(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Admitting B while A still hands its frames over: the queue's own invariant
    (one ticket starting at a time) and the exclusive check see two callers
    admitted to start at once; without them, the order check sees the symptom:
    a rank receives B's request before A's."""
    classes = {"queue_cls": StartAtOnceQueue}
    cx = caught(explore(PIPELINE, **classes), "fifo", capsys, **classes)
    assert "start at once" in str(cx.violation)
    cx = caught(explore(PIPELINE, checks=[c for c in CHECKS if c != "fifo"], **classes),
                "exclusive", capsys, **classes)
    assert "admitted to start at once" in str(cx.violation)
    cx = caught(explore(PIPELINE, checks=[c for c in CHECKS if c not in ("fifo", "exclusive")],
                        **classes), "order", capsys, **classes)
    assert cx.events[-1] == "send A" and "after B's" in str(cx.violation)
    assert cx.events.index("send B") < cx.events.index("send A")


def test_pipelining_that_completes_out_of_order_is_caught(
        capsys: pytest.CaptureFixture[str]) -> None:
    """B's request decided before A's, and B returning at once: B completes before
    A, who was admitted first. The same scenario with the real queue makes B wait
    for its turn."""
    classes = {"queue_cls": ReturnAtDecisionQueue}
    cx = caught(explore(PIPELINE, **classes), "order", capsys, **classes)
    assert "B returned its outcome while A" in str(cx.violation)
    assert "reply B" in cx.events and "reply A" not in cx.events
    trace = replay(PIPELINE, cx.events)  # the real queue: B waits for A
    assert trace[-1] == "nothing left to send; waits for its turn (A has not returned)"


def test_fastdeploy_register_after_send_is_caught_at_registration(
        capsys: pytest.CaptureFixture[str]) -> None:
    classes = {"registry_cls": RegisterAfterSendRegistry}
    cx = caught(explore(Scenario.uniform(3), **classes), "registry", capsys, **classes)
    assert cx.events[-1] == "register A"


def test_fastdeploy_register_after_send_is_caught_as_a_lost_reply(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without the registry check, the reply check catches the symptom: the fast
    reply is classified LATE (never UNKNOWN-safe, never delivered to the caller)."""
    classes = {"registry_cls": RegisterAfterSendRegistry}
    checks = [c for c in CHECKS if c != "registry"]
    for scenario in (FAST_REPLY, Scenario.uniform(3, CallerSpec(timeout=True))):
        cx = caught(explore(scenario, checks=checks, **classes), "replies", capsys, **classes)
        assert cx.events == ("arrive A", "resume A", "register A", "send A", "reply A")
        assert "classified LATE: the reply is lost" in str(cx.violation)
    # and for concurrent calls without a mailbox (ControlClient.call)
    concurrent = Scenario.uniform(3, CallerSpec(timeout=True), mailbox=False)
    cx = caught(explore(concurrent, checks=checks, **classes), "replies", capsys, **classes)
    assert cx.events == ("register A", "send A", "reply A")


def test_fastdeploy_without_a_deadline_hangs(capsys: pytest.CaptureFixture[str]) -> None:
    """With neither check, and no deadline, the caller waits forever (FastDeploy's
    /v1/resume hang, minus the 600 s timeout)."""
    classes = {"registry_cls": RegisterAfterSendRegistry}
    checks = [c for c in CHECKS if c not in ("registry", "replies")]
    cx = caught(explore(Scenario.uniform(1, CallerSpec()), checks=checks, **classes),
                "progress", capsys, **classes)
    assert "reply A" in cx.events and cx.events[-1] != "finish A"


def test_a_registry_forgetting_evicted_ids_is_caught_without_the_reduction(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A late reply must be LATE, never UNKNOWN, even after its tombstone was
    evicted (bound 1, two calls). The reduction delivers late replies early and
    misses this; the default full search does not."""
    classes = {"registry_cls": ForgetfulRegistry}
    scenario = Scenario.uniform(2, CallerSpec(timeout=True, cancel=CancelMode.ADMITTED),
                                max_tombstones=1)
    assert explore(scenario, reduce=True, **classes).ok
    cx = caught(explore(scenario, **classes), "replies", capsys, **classes)
    assert cx.events[-1] == "reply A" and "classified UNKNOWN" in str(cx.violation)
    assert cx.events.index("arrive B") > cx.events.index("send A")


# -- replay ---------------------------------------------------------------------------------


def test_the_production_window_replays_cleanly_on_the_real_cores() -> None:
    """The SGLang interleaving, pasted: with hand-off admission C queues behind B,
    and B, then C, get the mailbox; each hand-off happens at the holder's decision,
    and B sends while A is still reading its outcome."""
    events = ["arrive A", "resume A", "register A", "send A", "arrive B", "reply A",
              "arrive C", "resume B", "register B", "send B", "send A", "finish A",
              "reply B", "send B", "finish B", "resume C", "register C", "send C", "reply C",
              "send C", "finish C"]
    trace = replay(OVERTAKE, events)
    assert trace[events.index("reply A")] == "reply -> COMPLETED; hands the mailbox to B"
    assert trace[events.index("arrive C")].startswith("queued")
    assert trace[events.index("finish A")] == "finished"
    assert trace[events.index("reply B")] == "reply -> COMPLETED; hands the mailbox to C"
    assert trace[events.index("reply C")] == "reply -> COMPLETED; the mailbox is free"
    assert all("!!" not in line for line in trace)


def test_a_pasted_counterexample_replays_deterministically() -> None:
    events = ["arrive A", "arrive B", "cancel A", "arrive C"]
    checks = [c for c in CHECKS if c != "handoff"]
    for _ in range(2):
        with pytest.raises(InvariantViolation) as raised:
            replay(Scenario.uniform(3), events, checks=checks, queue_cls=WakeupWindowQueue)
        assert raised.value == InvariantViolation(
            "fifo", "C was admitted while B, who arrived earlier, still waits")
    assert replay(Scenario.uniform(3), events, checks=checks)[-1].startswith("queued")


def test_replay_rejects_an_event_that_cannot_happen() -> None:
    with pytest.raises(ReplayError, match="'reply A' is not enabled"):
        replay(OVERTAKE, ["arrive A", "reply A"])
    with pytest.raises(ReplayError, match="'resume B' is not enabled"):
        replay(OVERTAKE, ["arrive A", "arrive B", "resume B"])  # not woken, no deadline


def test_replay_runs_the_end_of_run_checks() -> None:
    events = ["arrive A", "resume A", "register A", "send A", "reply A", "send A", "finish A"]
    assert replay(FAST_REPLY, events)[-1] == "finished"
    # FastDeploy's hang: after the last event nothing can happen, yet A never finishes
    trace: list[str] = []
    with pytest.raises(InvariantViolation, match=r"\[progress\] .* A \(waiting\) never"):
        replay(Scenario.uniform(1, CallerSpec()), [*events[:-1]],
               checks=[c for c in CHECKS if c not in ("registry", "replies")],
               registry_cls=RegisterAfterSendRegistry, trace=trace)
    assert trace[4] == "reply -> LATE" and trace[-1].startswith("no event can happen")


# -- the explorer itself ---------------------------------------------------------------------


def count_naively(scenario: Scenario) -> int:
    """Every complete path, one by one: no memo, no symmetry, no reduction."""
    root = _World(scenario, AdmissionQueue, RequestRegistry,
                  frozenset(CHECKS), False)
    root.twin_before = (-1,) * len(scenario.callers)
    seed = _shared(root)

    def walk(w: _World) -> int:
        enabled = _enabled(w)
        if not enabled:
            _check_final(w)
            return 1
        total = 0
        for i, label in enumerate(enabled):
            child = w if i == len(enabled) - 1 else _clone_world(w, seed)
            _step(child, label)
            total += walk(child)
        return total

    return walk(root)


@pytest.mark.parametrize("scenario", [
    Scenario((CallerSpec(timeout=True, raises=True), CallerSpec(cancel=CancelMode.ADMITTED))),
    Scenario.uniform(2, CallerSpec(), ranks=2),
], ids=["k=2 mixed", "k=2 plain, 2 ranks"])
def test_memo_and_symmetry_count_every_path(scenario: Scenario) -> None:
    """The memoised, symmetry-reduced count equals a naive enumeration of every
    path (26,019 and 51,380 here): merging states loses no path and adds none."""
    assert explore(scenario).interleavings == count_naively(scenario)


def test_worlds_hold_no_reference_cycle() -> None:
    """The explorer pauses the cyclic collector: a world (and its clones) must be
    freed by refcounting alone, also with a queueing holder's hand-off waiter in the
    request map and a second caller queued."""
    events = ["arrive A", "resume A", "register A", "send A", "arrive B"]
    collecting = gc.isenabled()
    gc.disable()
    try:
        gc.collect()
        w = _World(OVERTAKE, AdmissionQueue, RequestRegistry, frozenset(CHECKS), False)
        for label in events:
            _step(w, label)
        clone = _clone_world(w, _shared(w))
        _step(clone, "reply A")
        del w, clone
        assert gc.collect() == 0
    finally:
        if collecting:
            gc.enable()


def test_the_reduction_finds_what_the_full_search_finds() -> None:
    for scenario in (Scenario.uniform(2), Scenario.uniform(1, EVERY_KIND, ranks=2)):
        full, reduced = explore(scenario), explore(scenario, reduce=True)
        assert full.ok and reduced.ok and reduced.states <= full.states
    classes = {"queue_cls": WakeupWindowQueue}
    full = explore(Scenario.uniform(3), **classes)
    reduced = explore(Scenario.uniform(3), reduce=True, **classes)
    assert full.counterexample is not None and reduced.counterexample is not None
    assert full.counterexample.events == reduced.counterexample.events


def test_scenarios_are_validated() -> None:
    with pytest.raises(ValueError, match="1 to 4 callers"):
        Scenario(())
    with pytest.raises(ValueError, match="needs timeout=True"):
        Scenario.uniform(1, CallerSpec(reply=ReplyMode.NEVER))
    with pytest.raises(ValueError, match="unknown checks"):
        explore(Scenario.uniform(1), checks=["fifo", "nope"])


def test_four_callers(capsys: pytest.CaptureFixture[str]) -> None:
    spec = CallerSpec(reply=ReplyMode.DUPLICATE, timeout=True, cancel=CancelMode.QUEUED)
    result = explore(Scenario.uniform(4, spec), reduce=True)
    say(capsys, f"interleavings {result.summary()}")
    assert result.ok
