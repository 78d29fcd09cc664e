"""Deterministic simulation of a whole fleet running one operation, and its recovery.

One thread, virtual time, and every choice drawn from one seed: a controller
driving the real :class:`~ctlwire.kernel.core.operation_core.OperationCore`,
N engines each with a real :class:`~ctlwire.kernel.engine.operation_ledger.OperationLedger`,
and a network that drops, delays, duplicates and reorders messages and
partitions ranks. The controller may crash at any event (between steps, or
while a step is in flight); engines may crash before or after a step's body
and come back with a fresh process. A successor controller then takes every
ledger over with a newer fence and reads it, computes what remains
(:func:`~ctlwire.kernel.operations.recovery.recovery_of`) and finishes it, as
:meth:`OperationRunner.finish` does. The first controller may instead only
stall and come back after its successor took over: it is fenced out.

Checked after every run (:class:`SimulationViolation` names the seed)::

    each rank ends committed, compensated, aborted or quarantined-and-reported
    (or superseded, when a successor took over and found nothing to finish)
    no step body runs twice in one engine process
    no engine is paused without a ledger record of its pause, nor unreported
    an engine's fence never goes backwards
    weights change only while the engine is paused
    the post-condition holds on every committed rank; a compensated or aborted
    rank is back on the old weights, serving

The membership store is a faulty component too
(:mod:`ctlwire.testing.simulated_store`,
:mod:`~ctlwire.testing.simulated_membership`): engines register in it under
leases, the controller's view follows it, and it goes down, freezes, slows,
loses watch events and loses leases of live ranks. The controller sends only to
ranks present in its view and alive, and fails a call when its rank is lost,
restarted or removed from the view; checked::

    no call to a live rank fails because of the store
    once the faults are over, the view holds every live registered rank (with its
    incarnation) and no dead one

A failing run replays exactly from its seed::

    python -m ctlwire.testing.operation_simulation --seeds 2000
    python -m ctlwire.testing.operation_simulation --seed 1234 --trace
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from ctlwire.kernel.core.membership import Membership
from ctlwire.kernel.core.operation_core import OperationCore
from ctlwire.kernel.core.operation_plan import (
    OperationPlan,
    OperationStep,
    PostCondition,
    StepCall,
    new_operation_id,
)
from ctlwire.kernel.core.operation_result import OperationResult
from ctlwire.kernel.engine.operation_ledger import (
    LastOperation,
    OperationLedger,
)
from ctlwire.kernel.operations.recovery import Recovery, recovery_of
from ctlwire.states import OperationState, RankState
from ctlwire.testing.simulated_fleet import (
    NEW,
    OLD,
    SimController,
    SimEngine,
    SimulationViolation,
    Version,
)
from ctlwire.testing.simulated_membership import StoreFleet
from ctlwire.testing.simulated_store import StoreConfig

__all__ = [
    "SimConfig",
    "SimulationViolation",
    "main",
    "sim_plan",
    "simulate",
    "simulate_many",
]


def sim_plan() -> OperationPlan:
    """pause -> update(NEW) -> resume, undone by resume / restore(OLD) / pause, and
    the post-condition (NEW, serving) before commit."""
    return OperationPlan("sim", (
        OperationStep("pause", "pause", None, 1.0, compensation=StepCall("resume")),
        OperationStep("update", "update_weights", Version(NEW), 1.0,
                      compensation=StepCall("restore_weights", Version(OLD))),
        OperationStep("resume", "resume", None, 1.0, compensation=StepCall("pause")),
    ), PostCondition("get_server_info", {"version": NEW, "paused": False}, timeout=1.0))


@dataclass(frozen=True)
class SimConfig:
    """Fault rates of one run (each run draws its own choices from its seed)."""

    ranks: int = 3
    drop: float = 0.03
    duplicate: float = 0.05
    max_delay: float = 0.3
    partition: float = 0.2       # chance that one rank is cut off for a while
    controller_crash: float = 0.5
    stalled_controller: float = 0.3  # of those: stalled and coming back, not dead
    engine_crash: float = 0.15   # per engine
    horizon: float = 60.0
    #: the membership store and its faults (None: no store, every rank always a member)
    store: StoreConfig | None = field(default_factory=StoreConfig)


class Simulation:
    """One seeded run; see the module docstring."""

    def __init__(self, seed: int, config: SimConfig,
                 core_factory: type[OperationCore] = OperationCore,
                 ledger_factory: Callable[[Mapping[str, Callable[..., Any]]],
                                          OperationLedger] | None = None,
                 trace: bool = False,
                 membership_factory: Callable[..., Membership] = Membership) -> None:
        self.seed = seed
        self.config = config
        self.rng = random.Random(seed)
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._n = 0
        self.trace: list[str] = []
        self.print_trace = trace
        self.core_factory = core_factory
        self.ledger_factory = ledger_factory or (
            lambda handlers: OperationLedger(handlers, clock=lambda: 2e9))
        self.plan = sim_plan()
        self.ranks = tuple(range(config.ranks))
        self.engines = {r: SimEngine(self, r) for r in self.ranks}
        self.cut: dict[int, float] = {}  # rank -> partitioned until
        self.quarantined: dict[int, str] = {}
        self.final: OperationResult | None = None
        self.controllers: list[SimController] = []
        self._fence = 1_000_000
        self._crash_points: dict[int, int] = {}  # rank -> the step message it dies at
        self._messages: dict[int, int] = {}
        self.took_over = False
        self.store = (StoreFleet(self, self.ranks, config.store, membership_factory)
                      if config.store is not None else None)

    # -- the clock and the network ------------------------------------------------------
    def at(self, when: float, fn: Callable[[], None]) -> None:
        self._n += 1
        heapq.heappush(self._events, (when, self._n, fn))

    def log(self, line: str) -> None:
        entry = f"{self.now:8.3f} {line}"
        self.trace.append(entry)
        if self.print_trace:
            print(entry)

    def violate(self, message: str) -> None:
        raise SimulationViolation(self.seed, message, self.trace)

    def _hop(self, rank: int) -> list[float]:
        """Delivery delays of one message to or from ``rank`` ([]: lost)."""
        if self.cut.get(rank, -1.0) > self.now or self.rng.random() < self.config.drop:
            return []
        delays = [self.rng.uniform(0.001, self.config.max_delay)]
        if self.rng.random() < self.config.duplicate:
            delays.append(self.rng.uniform(0.001, self.config.max_delay))
        return delays

    def send_request(self, rank: int, msg: dict[str, Any],
                     on_reply: Callable[[dict[str, Any]], None]) -> None:
        for delay in self._hop(rank):
            self.at(self.now + delay, lambda: self._deliver(rank, msg, on_reply))

    def _deliver(self, rank: int, msg: dict[str, Any],
                 on_reply: Callable[[dict[str, Any]], None]) -> None:
        engine = self.engines[rank]
        if not engine.alive:
            return
        reply = engine.handle(msg)
        if reply is None:
            self.at(self.now + self.rng.uniform(0.5, 3.0), engine.restart)
            return
        for delay in self._hop(rank):
            self.at(self.now + delay, lambda: on_reply(reply))

    # -- what the store and the controllers' clients see of the engines ---------------
    def reachable(self, rank: int) -> bool:
        """The rank's process is alive and not cut off."""
        return self.engines[rank].alive and self.cut.get(rank, -1.0) <= self.now

    def incarnation(self, rank: int) -> int | None:
        """The incarnation of the rank's live process (None: dead); never 0."""
        engine = self.engines[rank]
        return engine.incarnation + 1 if engine.alive else None

    def routable(self, rank: int) -> bool:
        return self.store is None or self.store.routable(rank)

    def engine_changed(self, rank: int, restarted: bool) -> None:
        if self.store is not None:
            if restarted:
                self.store.restarted(rank)
            else:
                self.store.reachability(rank)

    def fail_calls(self, rank: int, cause: str, detail: str) -> None:
        for controller in self.controllers:
            controller.fail(rank, cause, detail)

    def _cut_off(self, rank: int, until: float) -> None:
        self.cut[rank] = until
        if self.store is not None:
            self.store.reachability(rank)
            self.at(until, lambda: self.store.reachability(rank) if self.store else None)

    def engine_crash_point(self, rank: int) -> tuple[bool, bool]:
        """Whether this step message kills ``rank`` (before or after its body)."""
        n = self._messages[rank] = self._messages.get(rank, 0) + 1
        if self._crash_points.get(rank) != n:
            return False, False
        del self._crash_points[rank]
        return (True, False) if self.rng.random() < 0.5 else (False, True)

    # -- controllers ---------------------------------------------------------------------
    def new_fence(self) -> int:
        self._fence += self.rng.randint(1, 1000)
        return self._fence

    def controller_done(self, controller: SimController) -> None:
        result = controller.result
        assert result is not None
        # the newest controller's word is final (a stalled one may finish after it)
        newest = [c for c in self.controllers if c.result is not None][-1]
        self.final = newest.result
        for r in result.quarantined:
            self.quarantined[r] = result.ranks[r].detail

    def _start_first(self) -> None:
        fence = self.new_fence()
        core = self.core_factory(self.plan, self.ranks,
                                 op_id=new_operation_id(self.plan.name, fence), fence=fence)
        controller = SimController(self, core, peer=1)
        self.controllers.append(controller)
        controller.start()

    def _crash_controller(self) -> None:
        first = self.controllers[0]
        if first.result is not None:
            return
        successor_at = self.now + self.rng.uniform(0.1, 5.0)
        if self.rng.random() < self.config.stalled_controller:
            # not dead: stalled, it wakes up after its successor took over, and acts
            first.frozen_until = successor_at + self.rng.uniform(0.0, 4.0)
            self.log(f"controller 1 stalled until {first.frozen_until:.3f}")
        else:
            first.dead = True
            self.log("controller 1 crashed")
        self.at(successor_at, self._successor)

    def _successor(self, attempt: int = 1,
                   answers: dict[int, LastOperation | Exception] | None = None,
                   fence: int = 0) -> None:
        """Take every ledger over with a newer fence and read it (over the same
        network, a few attempts for the ranks that do not answer), then finish
        what remains under that fence."""
        fence = fence or self.new_fence()
        if answers is None:
            answers = {r: TimeoutError(f"rank {r} did not answer") for r in self.ranks}
        got = answers

        def answer(rank: int, reply: dict[str, Any]) -> None:
            if reply["ok"]:
                got[rank] = reply["result"]

        for r in self.ranks:
            if isinstance(got[r], Exception):
                self.send_request(r, {"kind": "take", "fence": fence, "peer": 2, "seq": 0},
                                  partial(answer, r))

        def settle() -> None:
            if attempt < 5 and any(isinstance(v, Exception) for v in got.values()):
                self._successor(attempt + 1, got, fence)
            else:
                self._finish(got, fence)

        self.at(self.now + 2.0, settle)

    def _finish(self, answers: Mapping[int, LastOperation | Exception], fence: int) -> None:
        self.took_over = True
        recovery = recovery_of(self.plan, answers)
        if recovery is None:
            missing = [r for r, v in answers.items() if isinstance(v, Exception)]
            self.log(f"successor: nothing of the operation applied on the ranks that "
                     f"answered; {missing} did not")
            for r in missing:
                self.quarantined[r] = "did not answer the recovery"
            self.final = None
            return
        self.log(f"successor: {recovery.action}, remaining {recovery.remaining}, "
                 f"missing {recovery.missing}")
        for r in recovery.missing:
            self.quarantined[r] = "did not answer the recovery"
        targets = tuple(r for r in recovery.ranks if r not in recovery.missing)
        if not targets:
            self.final = None
            return
        core = self.core_factory(self.plan, targets, op_id=recovery.op_id, fence=fence)
        applied = {r: recovery.steps.get(r, ()) for r in targets}
        if recovery.action == "compensate":
            core.finish_compensation(applied, {r: recovery.undone.get(r, ()) for r in targets})
        else:
            core.resume_forward(applied)
        controller = SimController(self, core, peer=2)
        self.controllers.append(controller)
        self.recovery: Recovery | None = recovery
        controller.start()

    # -- the run -------------------------------------------------------------------------
    def run(self) -> None:
        cfg, rng = self.config, self.rng
        if rng.random() < cfg.partition:
            rank = rng.choice(self.ranks)
            start = rng.uniform(0.0, 3.0)
            until = start + rng.uniform(0.2, 2.0)
            self.at(start, lambda: self._cut_off(rank, until))
        for r in self.ranks:
            if rng.random() < cfg.engine_crash:
                self._crash_points[r] = rng.randint(1, 6)
        if rng.random() < cfg.controller_crash:
            self.at(rng.uniform(0.0, 4.0), self._crash_controller)
        if self.store is not None:
            self.store.start()
        self.at(0.0, self._start_first)
        while self._events:
            when, _, fn = heapq.heappop(self._events)
            if when > cfg.horizon:
                self.violate("the run did not settle within the horizon")
            self.now = when
            fn()
        self.check()

    def check(self) -> None:
        """The invariants of a settled run (see the module docstring)."""
        done = [c for c in self.controllers if c.result is not None]
        undecided = [c for c in self.controllers if c.result is None and not c.dead]
        if undecided:
            self.violate("a live controller never decided its operation")
        final = self.final
        reports = final.ranks if final is not None and done and done[-1].result is final else {}
        for r, engine in self.engines.items():
            if engine.paused:
                last = engine.ledger.last_operation()
                if "pause" not in last.steps or "pause" in last.undone:
                    self.violate(f"rank {r} is paused without a ledger record of its pause")
                if r not in self.quarantined:
                    self.violate(f"rank {r} is paused and not reported quarantined")
            rep = reports.get(r)
            if rep is None:
                continue
            if rep.state is RankState.QUARANTINED:
                if r not in self.quarantined:
                    self.violate(f"rank {r} ended quarantined but is not reported")
            elif rep.state is RankState.COMMITTED:
                if not engine.crashed and (engine.version, engine.paused) != (NEW, False):
                    self.violate(f"rank {r} committed but runs {engine.version}, "
                                 f"paused={engine.paused}")
            elif rep.state in (RankState.COMPENSATED, RankState.ABORTED):
                if (engine.version, engine.paused) != (OLD, False):
                    self.violate(f"rank {r} ended {rep.state.value} but runs "
                                 f"{engine.version}, paused={engine.paused}")
            elif rep.state is RankState.SUPERSEDED and len(self.controllers) == 1 \
                    and self.took_over:
                pass  # a stalled controller fenced out by a successor that found nothing
            else:
                self.violate(f"rank {r} ended {rep.state.value}")
        if final is not None and final.state is OperationState.COMMITTED:
            for r in final.ranks:
                if final.ranks[r].state is not RankState.COMMITTED:
                    self.violate(f"committed, but rank {r} is {final.ranks[r].state.value}")


def simulate(seed: int, config: SimConfig | None = None, *,
             core_factory: type[OperationCore] = OperationCore,
             ledger_factory: Callable[[Mapping[str, Callable[..., Any]]],
                                      OperationLedger] | None = None,
             membership_factory: Callable[..., Membership] = Membership,
             trace: bool = False) -> Simulation:
    """Run the simulation of ``seed``; raises SimulationViolation naming it."""
    sim = Simulation(seed, config or SimConfig(), core_factory, ledger_factory, trace,
                     membership_factory)
    sim.run()
    return sim


@dataclass
class Summary:
    runs: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


def simulate_many(seeds: range, config: SimConfig | None = None, **kwargs: Any) -> Summary:
    """Run every seed; the first violation raises (with its seed)."""
    summary = Summary()
    for seed in seeds:
        sim = simulate(seed, config, **kwargs)
        summary.runs += 1
        key = sim.final.state.value if sim.final is not None else "nothing-applied"
        summary.outcomes[key] = summary.outcomes.get(key, 0) + 1
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--seeds", type=int, default=2000, help="how many seeds to run")
    p.add_argument("--first", type=int, default=0, help="the first seed")
    p.add_argument("--seed", type=int, help="replay one seed (with --trace: its events)")
    p.add_argument("--trace", action="store_true")
    args = p.parse_args(argv)
    try:
        if args.seed is not None:
            sim = simulate(args.seed, trace=args.trace)
            print(f"seed {args.seed}: "
                  f"{sim.final.summary() if sim.final is not None else 'nothing applied'}")
            return 0
        summary = simulate_many(range(args.first, args.first + args.seeds))
    except SimulationViolation as exc:
        print(f"VIOLATION {exc}\nreplay: python -m ctlwire.testing.operation_simulation "
              f"--seed {exc.seed} --trace", file=sys.stderr)
        return 1
    print(f"{summary.runs} runs, no violation: {summary.outcomes}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
