"""The actors of :mod:`ctlwire.testing.operation_simulation`: engines, each
with a real :class:`~ctlwire.kernel.engine.operation_ledger.OperationLedger`, and
controllers, each driving a real :class:`~ctlwire.kernel.core.operation_core.OperationCore`
over the simulated network, as :class:`~ctlwire.kernel.operations.runner.OperationRunner`
does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Protocol, cast

import msgspec

from ctlwire.kernel.core.operation_core import Dispatch, OperationCore, StepOutcome
from ctlwire.kernel.core.operation_result import OperationResult
from ctlwire.kernel.engine.liveness import _current_request
from ctlwire.kernel.engine.operation_ledger import OperationLedger, StepRequest, TakeOver
from ctlwire.transports.codec import MsgpackCodec

__all__ = ["NEW", "OLD", "SimController", "SimEngine", "SimulationViolation", "Version", "World"]

OLD, NEW = 0, 1
CODEC = MsgpackCodec()



class _ByController:
    """Who sent a simulated step: the controller it names (its "connection")."""

    @staticmethod
    def peer_of(route: Any, client: int) -> Any:
        return route

class Version(msgspec.Struct, frozen=True):
    version: int


class SimulationViolation(AssertionError):
    """An invariant failed in the run of ``seed`` (replay it with that seed)."""

    def __init__(self, seed: int, message: str, trace: list[str]) -> None:
        self.seed = seed
        self.trace = trace
        super().__init__(f"seed {seed}: {message}")


class World(Protocol):
    """What the actors use of the simulation: its clock, network, fault draws and checks."""

    now: float
    ledger_factory: Callable[[Mapping[str, Callable[..., Any]]], OperationLedger]

    def at(self, when: float, fn: Callable[[], None]) -> None: ...
    def log(self, line: str) -> None: ...
    def violate(self, message: str) -> None: ...
    def send_request(self, rank: int, msg: dict[str, Any],
                     on_reply: Callable[[dict[str, Any]], None]) -> None: ...
    def engine_crash_point(self, rank: int) -> tuple[bool, bool]: ...
    def controller_done(self, controller: SimController) -> None: ...
    def engine_changed(self, rank: int, restarted: bool) -> None: ...
    def routable(self, rank: int) -> bool: ...
    def reachable(self, rank: int) -> bool: ...
    def incarnation(self, rank: int) -> int | None: ...


class _Endpoint:
    """What OperationLedger.install uses of an endpoint."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.codec = CODEC
        self.methods: dict[str, Callable[..., Any]] = {}
        self.running: dict[int, tuple[str, float]] = {}

    def register(self, name: str, fn: Callable[..., Any], *, read_only: bool = False,
                 threaded: bool = False, control: bool = False) -> None:
        self.methods[name] = fn


class SimEngine:
    """One engine process: weights, paused flag, a ledger; lost when it crashes."""

    def __init__(self, sim: World, rank: int) -> None:
        self.sim = sim
        self.rank = rank
        self.alive = True
        self.crashed = False
        self.incarnation = 0
        self._boot()

    def _boot(self) -> None:
        self.version = OLD  # weights as loaded at start
        self.paused = False
        self.runs: dict[tuple[str, str, str], int] = {}
        self.current: StepRequest | None = None
        self.ledger = self.sim.ledger_factory({
            "pause": self.pause, "resume": self.resume,
            "update_weights": self.update_weights, "restore_weights": self.restore_weights})
        self.ledger.install(cast(Any, _Endpoint(self.rank)))
        self.fence_seen = 0

    def crash(self) -> None:
        self.alive = False
        self.crashed = True
        self.sim.log(f"engine {self.rank} crashed")
        self.sim.engine_changed(self.rank, restarted=False)

    def restart(self) -> None:
        self.incarnation += 1
        self.alive = True
        self._boot()
        self.sim.log(f"engine {self.rank} restarted")
        self.sim.engine_changed(self.rank, restarted=True)

    # -- step bodies -------------------------------------------------------------------
    def _body(self) -> None:
        req = self.current
        assert req is not None
        key = (req.op, req.step, req.phase)
        self.runs[key] = self.runs.get(key, 0) + 1
        if self.runs[key] > 1:
            self.sim.violate(f"rank {self.rank}: the body of {key} ran twice")

    def _set_version(self, version: int) -> None:
        if version != self.version and not self.paused:
            self.sim.violate(f"rank {self.rank}: weights changed {self.version} -> {version} "
                             "while serving")
        self.version = version

    def pause(self) -> None:
        self._body()
        self.paused = True

    def resume(self) -> None:
        self._body()
        self.paused = False

    def update_weights(self, req: Version) -> int:
        self._body()
        if not self.paused:
            raise RuntimeError("update_weights needs a paused engine")
        self._set_version(req.version)
        return self.version

    def restore_weights(self, req: Version) -> int:
        self._body()
        self._set_version(req.version)
        return self.version

    # -- requests ------------------------------------------------------------------------
    def handle(self, msg: dict[str, Any]) -> dict[str, Any] | None:
        """A request; its reply (None: the engine died before answering)."""
        kind = msg["kind"]
        if kind == "info":
            return {"ok": True, "result": {"version": self.version, "paused": self.paused}}
        if kind == "take":
            try:
                return {"ok": True, "result": self.ledger.take_over(TakeOver(msg["fence"]))}
            except Exception as exc:
                return {"ok": False, "error": type(exc).__name__, "detail": str(exc)}
        req: StepRequest = msg["step"]
        crash_before, crash_after = self.sim.engine_crash_point(self.rank)
        if crash_before:
            self.crash()
            return None
        self.current = req
        # the step runs as if its controller's connection (``peer``) had sent it
        token = _current_request.set(cast(Any, (_ByController, msg["peer"] << 32 | msg["seq"],
                                                msg["peer"], msg["peer"])))
        try:
            result = self.ledger.step(req)
            reply: dict[str, Any] = {"ok": True, "result": result}
        except SimulationViolation:
            raise
        except Exception as exc:
            reply = {"ok": False, "error": type(exc).__name__, "detail": str(exc)}
        finally:
            _current_request.reset(token)
            self.current = None
        if self.ledger.highest_fence < self.fence_seen:
            self.sim.violate(f"rank {self.rank}: fence went back from {self.fence_seen} "
                             f"to {self.ledger.highest_fence}")
        self.fence_seen = self.ledger.highest_fence
        if crash_after:
            self.crash()
            return None
        return reply


class SimController:
    """Drives one OperationCore over the simulated network (as OperationRunner does)."""

    def __init__(self, sim: World, core: OperationCore, peer: int) -> None:
        self.sim = sim
        self.core = core
        self.peer = peer
        self.dead = False
        self.frozen_until = -1.0  # a stalled controller (GC pause, partition) acts again then
        self.seq = 0
        self.result: OperationResult | None = None
        self.observed: dict[int, Any] = {}
        self.sent: dict[int, int] = {}  # rank -> the incarnation the dispatch in flight went to

    def start(self) -> None:
        self._next()

    def _next(self) -> None:
        if self.dead:
            return
        d = self.core.next_dispatch()
        if d is None:
            self.result = self.core.result()
            self.sim.log(f"controller {self.peer}: {self.result.summary()}")
            self.sim.controller_done(self)
            return
        self.seq += 1
        seq = self.seq
        self.sim.log(f"controller {self.peer}: {d.phase} {d.step} -> {d.ranks}")
        self.sent = {}
        for r in d.ranks:
            incarnation = self.sim.incarnation(r)
            if not self.sim.routable(r):  # removed, or lost: not sent (the client's rule)
                self.core.record(r, StepOutcome.NOT_DELIVERED, "not a live member")
                continue
            self.sent[r] = -1 if incarnation is None else incarnation
            if d.check:
                msg: dict[str, Any] = {"kind": "info"}
            else:
                msg = {"kind": "step", "step": _step_request(d, self.core.ranks)}
            msg.update(peer=self.peer, seq=seq)
            self.sim.send_request(r, msg, partial(self._reply, d, seq, r))
        if self.core.inflight is not d:  # not sent anywhere: settled already
            self._next()
            return
        self.sim.at(self.sim.now + (d.timeout or 1.0), lambda: self._deadline(d, seq))

    def fail(self, rank: int, cause: str, detail: str) -> None:
        """The client fails ``rank``'s call in flight (``cause``: ``liveness`` — the
        rank was lost; ``restart`` — a new process; ``store`` — a membership
        removal). A call whose process is alive and reachable must never fail
        because of the store."""
        d = self.core.inflight
        if self.dead or self.sim.now < self.frozen_until or d is None \
                or rank not in self.sent or self.core.has_outcome(rank):
            return
        current = self.sim.incarnation(rank)
        if cause == "restart" and self.sent[rank] == current:
            return  # sent to the new process
        if cause == "store" and self.sent[rank] == current and self.sim.reachable(rank):
            self.sim.violate(f"a call to live rank {rank} failed because of the store "
                             f"({detail})")
        self.core.record(rank, StepOutcome.UNKNOWN, detail)
        if self.core.inflight is None:
            self._next()

    def _frozen(self, fn: Callable[[], None]) -> bool:
        """While stalled, whatever reaches this controller waits until it wakes."""
        if self.sim.now < self.frozen_until:
            self.sim.at(self.frozen_until, fn)
            return True
        return False

    def _reply(self, d: Dispatch, seq: int, rank: int, reply: dict[str, Any]) -> None:
        if self._frozen(lambda: self._reply(d, seq, rank, reply)):
            return
        if self.dead or seq != self.seq or self.core.inflight is not d \
                or self.core.has_outcome(rank):
            return  # late, duplicated or for a dead controller
        if d.check:
            pc = self.core.plan.postcondition
            assert pc is not None
            self.observed[rank] = reply["result"]
            outcome = StepOutcome.OK if pc.holds(reply["result"]) else StepOutcome.ERROR
            self.core.record(rank, outcome, "" if outcome is StepOutcome.OK else "mismatch")
        elif reply["ok"]:
            self.core.record(rank, StepOutcome.OK)
        else:
            error = reply["error"]
            outcome = {"Fenced": StepOutcome.FENCED,
                       "StepNotApplied": StepOutcome.NOT_APPLIED}.get(error, StepOutcome.ERROR)
            self.core.record(rank, outcome, f"{error}: {reply['detail']}")
        if self.core.inflight is None:
            self._next()

    def _deadline(self, d: Dispatch, seq: int) -> None:
        if self._frozen(lambda: self._deadline(d, seq)):
            return
        if self.dead or seq != self.seq or self.core.inflight is not d:
            return
        for r in [r for r in d.ranks if not self.core.has_outcome(r)]:
            self.core.record(r, StepOutcome.UNKNOWN, "no answer in time")
        self._next()


def _step_request(d: Dispatch, ranks: tuple[int, ...]) -> StepRequest:
    return StepRequest(d.op_id, d.step, d.phase, d.fence, d.key, d.method,
                       CODEC.encode_value(d.payload), d.index, list(ranks))
