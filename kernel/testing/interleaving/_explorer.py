"""The interleaving explorer's search (documented in :mod:`ctlwire.kernel.testing.interleaving`)."""

from __future__ import annotations

import gc
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import Enum
from types import BuiltinFunctionType, FunctionType, MethodType
from typing import Any

import msgspec

from ctlwire.kernel.admission_queue import AdmissionQueue
from ctlwire.kernel.call_core import CallCore
from ctlwire.kernel.errors import EngineDead
from ctlwire.kernel.fan_out_policy import Policy
from ctlwire.kernel.request_registry import PendingRequest, ReplyDisposition, RequestRegistry
from ctlwire.states import RequestState, StateTable, TicketState
from ctlwire.transports.envelope import ErrorInfo, Reply

__all__ = [
    "CHECKS",
    "EVERY_KIND",
    "CallerSpec",
    "CancelMode",
    "Counterexample",
    "ExplorationResult",
    "InvariantViolation",
    "ReplayError",
    "ReplyMode",
    "Scenario",
    "explore",
    "main",
    "replay",
    "standard_scenarios",
]

CHECKS: tuple[str, ...] = ("fifo", "exclusive", "handoff", "registry", "replies", "outcomes",
                           "cleanup", "progress")
"""The named checks, in order of preference between equally short counterexamples."""

_PRIORITY = {name: i for i, name in enumerate((*CHECKS, "crash"))}
_NAMES = "ABCD"
_NIL = msgspec.Raw(b"\xc0")
_METHOD = "m"
_ENGINE_INCARNATION = 1


# -- scenarios -------------------------------------------------------------------------


class ReplyMode(Enum):
    """When a caller's reply (one per rank) reaches the client."""

    NORMAL = "normal"        # once, at any time after its frame left
    DUPLICATE = "duplicate"  # once, then possibly once more (covers NORMAL)
    LATE = "late"            # only after the caller's deadline passed or it finished
    NEVER = "never"          # never


class CancelMode(Enum):
    """When a caller may be cancelled."""

    NEVER = "never"
    QUEUED = "queued"        # while waiting for admission, ticket still queued
    ADMITTED = "admitted"    # once its ticket is admitted (even before it resumed)
    ANY = "any"              # both


@dataclass(frozen=True)
class CallerSpec:
    """What may happen to one caller. Every event allowed here is optional."""

    reply: ReplyMode = ReplyMode.NORMAL
    reply_ok: bool = True      # False: the engine answers with an error
    timeout: bool = False      # the caller's deadline may pass
    cancel: CancelMode = CancelMode.NEVER
    raises: bool = False       # the admitted holder may raise

    def describe(self) -> str:
        parts = [f"reply={self.reply.value}"]
        if not self.reply_ok:
            parts.append("remote-error")
        if self.timeout:
            parts.append("timeout")
        if self.cancel is not CancelMode.NEVER:
            parts.append(f"cancel={self.cancel.value}")
        if self.raises:
            parts.append("raises")
        return ",".join(parts)


EVERY_KIND = CallerSpec(reply=ReplyMode.DUPLICATE, timeout=True, cancel=CancelMode.ANY,
                        raises=True)
"""Every caller event at once: reply (any time, also late), duplicate, timeout,
cancellation anywhere, holder raising."""


@dataclass(frozen=True)
class Scenario:
    """k callers (1..4, named A, B, C, D in the order given) of one queueing
    mailbox fanning out to ``ranks`` ranks (1 or 2) under ``policy``.

    ``engine_loss``: the last rank may become unroutable (``unplug R``) and may
    be declared lost (``lose R``), independently, at any time. ``max_tombstones``
    is the registry's bound (small, so eviction is exercised).

    ``mailbox=False``: no mailbox -- the callers run concurrently, as
    ``ControlClient.call`` and ``fan_out(mode="concurrent")`` do (their first
    step is ``register``; cancellation ``QUEUED`` never fires, ``ADMITTED``
    and ``ANY`` fire anywhere), so the registry holds several requests at once.
    """

    callers: tuple[CallerSpec, ...]
    ranks: int = 1
    policy: Policy = Policy.ALL
    engine_loss: bool = False
    max_tombstones: int = 2
    mailbox: bool = True
    name: str = ""

    def __post_init__(self) -> None:
        if not 1 <= len(self.callers) <= len(_NAMES):
            raise ValueError(f"a scenario has 1 to {len(_NAMES)} callers")
        if not 1 <= self.ranks <= 2:
            raise ValueError("a scenario has 1 or 2 ranks")
        for i, spec in enumerate(self.callers):
            if spec.reply in (ReplyMode.NEVER, ReplyMode.LATE) and not spec.timeout:
                raise ValueError(f"caller {_NAMES[i]}: reply={spec.reply.value} needs "
                                 "timeout=True (otherwise it legitimately waits forever)")
        if not self.name:
            object.__setattr__(self, "name", self.describe())

    @classmethod
    def uniform(cls, k: int, spec: CallerSpec = EVERY_KIND, **kwargs: Any) -> Scenario:
        """k callers with the same spec."""
        return cls(callers=(spec,) * k, **kwargs)

    def describe(self) -> str:
        specs = [s.describe() for s in self.callers]
        who = (f"{len(specs)} x [{specs[0]}]" if len(set(specs)) == 1
               else " ".join(f"{_NAMES[i]}[{s}]" for i, s in enumerate(specs)))
        extra = f", {self.ranks} ranks {self.policy.value}" if self.ranks > 1 else ""
        if self.engine_loss:
            extra += ", engine loss"
        if not self.mailbox:
            extra += ", no mailbox"
        return f"k={len(specs)}{extra}: {who}"


def standard_scenarios(max_callers: int = 3, max_callers_two_ranks: int = 2) -> list[Scenario]:
    """The scenario family run in CI.

    For k = 1..``max_callers`` callers of a mailbox to one rank: every event
    kind for every caller; the same without deadlines (so a lost wake-up shows
    as a hang rather than as a timeout); replies that never come, or come only
    late and as errors, mixed with every event kind; engine loss (the rank
    unroutable and/or declared lost, at any time); and concurrent callers
    without a mailbox (several requests in the registry at once: every event
    kind up to two callers; deadlines, cancellation and raising for three).
    For k = 1..``max_callers_two_ranks`` callers of a mailbox to two ranks:
    every event kind under policy ``all`` and under ``first``; engine loss of
    one rank.
    """
    out: list[Scenario] = []
    no_deadline = CallerSpec(reply=ReplyMode.DUPLICATE, cancel=CancelMode.ANY, raises=True)
    never = CallerSpec(reply=ReplyMode.NEVER, timeout=True, cancel=CancelMode.ANY, raises=True)
    late = CallerSpec(reply=ReplyMode.LATE, reply_ok=False, timeout=True,
                      cancel=CancelMode.QUEUED)
    loss = CallerSpec(timeout=True, cancel=CancelMode.ADMITTED)
    for k in range(1, max_callers + 1):
        out.append(Scenario.uniform(k, EVERY_KIND, name=f"k={k} every event kind"))
        out.append(Scenario.uniform(k, no_deadline, name=f"k={k} no deadlines"))
        mixed = tuple((never, late, EVERY_KIND, never)[i] for i in range(k))
        out.append(Scenario(mixed, name=f"k={k} never / late error / every kind"))
        out.append(Scenario.uniform(k, loss, engine_loss=True, name=f"k={k} engine loss"))
        concurrent = EVERY_KIND if k <= 2 else CallerSpec(timeout=True, cancel=CancelMode.ANY,
                                                          raises=True)
        out.append(Scenario.uniform(k, concurrent, mailbox=False,
                                    name=f"k={k} no mailbox (concurrent calls)"))
    for k in range(1, max_callers_two_ranks + 1):
        out.append(Scenario.uniform(k, EVERY_KIND, ranks=2,
                                    name=f"k={k} 2 ranks all, every event kind"))
        out.append(Scenario.uniform(k, EVERY_KIND, ranks=2, policy=Policy.FIRST,
                                    name=f"k={k} 2 ranks first, every event kind"))
        out.append(Scenario.uniform(k, loss, ranks=2, engine_loss=True,
                                    name=f"k={k} 2 ranks, engine loss"))
    return out


# -- violations and results ------------------------------------------------------------


class InvariantViolation(AssertionError):
    """A check failed. ``check`` is one of :data:`CHECKS` or ``"crash"``."""

    def __init__(self, check: str, detail: str) -> None:
        self.check = check
        self.detail = detail
        super().__init__(f"[{check}] {detail}")

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, InvariantViolation) and other.check == self.check
                and other.detail == self.detail)

    def __hash__(self) -> int:
        return hash((self.check, self.detail))


class ReplayError(ValueError):
    """A replayed event was not enabled at its point of the sequence."""


@dataclass(frozen=True)
class Counterexample:
    """A shortest failing event sequence, and what each event did."""

    scenario: Scenario
    events: tuple[str, ...]
    violation: InvariantViolation
    trace: tuple[str, ...]
    others: tuple[tuple[str, tuple[str, ...]], ...] = ()  # other checks failing as early

    def __len__(self) -> int:
        return len(self.events)

    def format(self) -> str:
        """A report whose ``events = [...]`` line can be pasted into a test."""
        lines = [f"counterexample, {len(self.events)} events, scenario {self.scenario.name!r}",
                 f"  violation: {self.violation}",
                 "  events = [" + ", ".join(f'"{e}"' for e in self.events) + "]"]
        width = max((len(e) for e in self.events), default=0)
        for i, (event, what) in enumerate(zip(self.events, self.trace, strict=False), 1):
            lines.append(f"  {i:3d}. {event:<{width}}  {what}")
        for what in self.trace[len(self.events):]:
            lines.append(f"       {'':<{width}}  {what}")
        for check, events in self.others:
            lines.append(f"  as short, also fails [{check}]: [" +
                         ", ".join(f'"{e}"' for e in events) + "]")
        return "\n".join(lines)


@dataclass
class ExplorationResult:
    """What :func:`explore` checked: every complete interleaving of ``scenario``
    (``interleavings``), each distinct state once (``states``), over
    ``transitions`` executed events; ``counterexample`` is None when every check
    held everywhere."""

    scenario: Scenario
    interleavings: int = 0
    states: int = 0
    transitions: int = 0
    max_depth: int = 0
    seconds: float = 0.0
    counterexample: Counterexample | None = None
    checks: tuple[str, ...] = CHECKS
    reduced: bool = False

    @property
    def ok(self) -> bool:
        return self.counterexample is None

    def summary(self) -> str:
        cx = self.counterexample
        status = "ok" if cx is None else f"FAILED {cx.violation}"
        kind = " (reduced)" if self.reduced else ""
        return (f"{self.scenario.name}: {self.interleavings:,} interleavings{kind}, "
                f"{self.states:,} states, {self.transitions:,} transitions, "
                f"depth {self.max_depth}, {self.seconds:.2f} s: {status}")


# -- the world the explorer drives ------------------------------------------------------


class _Flag:
    """A waiter (what the shells use an ``anyio.Event`` for)."""

    __slots__ = ("is_set",)

    def __init__(self) -> None:
        self.is_set = False

    def set(self) -> None:
        self.is_set = True


class _Pc(Enum):
    NEW = 0       # next: arrive
    QUEUED = 1    # awaiting its ticket's waiter; next: resume
    RESUME = 2    # admitted at once; next: resume
    REGISTER = 3  # next: register
    SEND = 4      # next: send (next_send / begin_wait)
    WAITING = 5   # awaiting its entry's waiter; next: wake
    FINISH = 6    # outcome read; next: finish
    DONE = 7      # finished


_RUNNING = (_Pc.RESUME, _Pc.REGISTER, _Pc.SEND, _Pc.WAITING)
_HOLDING = (_Pc.SEND, _Pc.WAITING, _Pc.FINISH)  # registered, not finished
_STEP = {_Pc.NEW: "arrive", _Pc.QUEUED: "resume", _Pc.RESUME: "resume",
         _Pc.REGISTER: "register", _Pc.SEND: "send", _Pc.WAITING: "wake", _Pc.FINISH: "finish"}


class _Caller:
    __slots__ = ("core", "deadline_fired", "deliveries", "entry", "entry_waiter", "frames",
                 "name", "outcome", "pc", "spec", "ticket_waiter")

    def __init__(self, name: str, spec: CallerSpec, core: CallCore) -> None:
        self.name = name
        self.spec = spec
        self.core = core
        self.pc = _Pc.NEW
        self.ticket_waiter = _Flag()
        self.entry_waiter = _Flag()
        self.entry: PendingRequest | None = None   # what register() returned
        self.frames: dict[int, int] = {}           # rank -> request id of the frame sent
        self.deliveries: dict[int, int] = {}       # rank -> replies delivered
        self.deadline_fired = False
        self.outcome: str | None = None


QueueFactory = Callable[..., AdmissionQueue]
CoreFactory = Callable[..., CallCore]
RegistryFactory = Callable[..., RequestRegistry]


class _World:
    __slots__ = ("admitted", "arrivals", "by_name", "callers", "checks", "liveness", "queue",
                 "reduce", "registry", "scenario", "twin_before", "unplugged")

    def __init__(self, scenario: Scenario, queue_cls: QueueFactory, call_core_cls: CoreFactory,
                 registry_cls: RegistryFactory, checks: frozenset[str], reduce: bool,
                 symmetric: bool = True) -> None:
        self.scenario = scenario
        self.checks = checks
        self.reduce = reduce
        self.registry = registry_cls(max_tombstones=scenario.max_tombstones,
                                     incarnation=_ENGINE_INCARNATION)
        self.queue: AdmissionQueue | None = queue_cls(_METHOD) if scenario.mailbox else None
        self.liveness = _Liveness()
        ranks = tuple(range(scenario.ranks))
        self.callers = [
            _Caller(_NAMES[i], spec,
                    call_core_cls(self.registry, _METHOD, ranks, scenario.policy, deadline=1.0,
                                  timeout=1.0, queue=self.queue, is_lost=self.liveness.is_lost))
            for i, spec in enumerate(scenario.callers)]
        self.by_name = {c.name: c for c in self.callers}
        # callers with equal specs are interchangeable until they arrive: they arrive in
        # list order (each complete path stands for the permutations of their names)
        self.twin_before: tuple[int, ...] = tuple(
            max((j for j in range(i) if scenario.callers[j] == spec), default=-1)
            if symmetric else -1 for i, spec in enumerate(scenario.callers))
        self.arrivals: list[str] = []
        self.admitted: list[str] = []
        self.unplugged: set[int] = set()

    @property
    def lost(self) -> set[int]:
        return self.liveness.lost


class _Liveness:
    """What the client's peer table says about ranks (``CallCore(is_lost=...)``). Kept
    apart from the world so that worlds hold no reference cycle: refcounting frees
    them at once, and the explorer can run with the cyclic collector paused."""

    __slots__ = ("lost",)

    def __init__(self) -> None:
        self.lost: set[int] = set()

    def is_lost(self, rank: int) -> bool:
        return rank in self.lost


# -- cloning (a deep copy that shares immutable things; ~5x faster than copy.deepcopy) ---

_ATOM = 0
_SEQ = 1
_OBJ = 2
_kinds: dict[type, int] = {}
_slots_of: dict[type, tuple[str, ...]] = {}
_ATOM_BASES: tuple[type, ...] = (int, float, str, bytes, type(None), Enum, frozenset, tuple,
                                 BaseException, StateTable, msgspec.Struct, msgspec.Raw, type,
                                 FunctionType, BuiltinFunctionType, Scenario, CallerSpec)
# tuples count as immutable: the cores keep only scalars in them (ranks, table keys)


def _kind(t: type) -> int:
    kind = _kinds.get(t)
    if kind is None:
        if issubclass(t, _ATOM_BASES):
            kind = _ATOM
        elif t in (list, dict, set, OrderedDict, MethodType):
            kind = _SEQ
        else:
            kind = _OBJ
            names: list[str] = []
            for klass in t.__mro__:
                slots = klass.__dict__.get("__slots__", ())
                for name in (slots,) if isinstance(slots, str) else slots:
                    if name not in ("__dict__", "__weakref__") and name not in names:
                        names.append(name)
            _slots_of[t] = tuple(names)
        _kinds[t] = kind
    return kind


def _clone(obj: Any, memo: dict[int, Any]) -> Any:
    t = type(obj)
    kind = _kinds.get(t)
    if kind is None:
        kind = _kind(t)
    if kind == _ATOM:
        return obj
    hit = memo.get(id(obj))
    if hit is not None:
        return hit
    kinds = _kinds
    if kind == _SEQ:
        if t is list:
            new_list: list[Any] = []
            memo[id(obj)] = new_list
            new_list.extend([x if kinds.get(type(x)) == _ATOM else _clone(x, memo) for x in obj])
            return new_list
        if t is dict or t is OrderedDict:
            new_map: dict[Any, Any] = t()
            memo[id(obj)] = new_map
            memo_get = memo.get
            for key, value in obj.items():
                if kinds.get(type(key)) != _ATOM:
                    key = _clone(key, memo)
                if kinds.get(type(value)) != _ATOM:
                    hit = memo_get(id(value))
                    value = hit if hit is not None else _clone(value, memo)
                new_map[key] = value
            return new_map
        if t is set:
            new_set: set[Any] = set()
            memo[id(obj)] = new_set
            new_set.update([x if kinds.get(type(x)) == _ATOM else _clone(x, memo) for x in obj])
            return new_set
        owner = obj.__self__  # a bound method
        if _kind(type(owner)) == _ATOM:
            return obj
        return MethodType(obj.__func__, _clone(owner, memo))
    copier = _copiers.get(t)
    if copier is None:
        copier = _copiers[t] = _make_copier(t)
    try:
        new = copier(obj, memo)
    except AttributeError:  # a slot left unset: the slow way
        new = object.__new__(t)
        memo[id(obj)] = new
        get, put = object.__getattribute__, object.__setattr__
        for name in _slots_of[t]:
            try:
                value = get(obj, name)
            except AttributeError:
                continue
            put(new, name, value if kinds.get(type(value)) == _ATOM else _clone(value, memo))
    attrs = getattr(obj, "__dict__", None)
    if attrs is not None:
        new_attrs = new.__dict__
        for key, value in attrs.items():
            new_attrs[key] = value if kinds.get(type(value)) == _ATOM else _clone(value, memo)
    return new


_Copier = Callable[[Any, "dict[int, Any]"], Any]
_copiers: dict[type, _Copier] = {}


def _make_copier(t: type) -> _Copier:
    """A function copying the slots of ``t`` (generated once per class: no loop, no
    per-slot lookups)."""
    lines = ["def copy(obj, memo):", "    new = new_object(T)", "    memo[id(obj)] = new",
             "    memo_get = memo.get"]
    for name in _slots_of[t]:
        if not name.isidentifier() or name.startswith("__"):
            return _no_copier
        lines += [f"    v = obj.{name}",
                  "    if kinds_get(type(v)) != 0:",
                  "        hit = memo_get(id(v))",
                  "        v = hit if hit is not None else clone(v, memo)",
                  f"    new.{name} = v"]
    lines.append("    return new")
    namespace: dict[str, Any] = {"new_object": object.__new__, "T": t, "kinds_get": _kinds.get,
                                 "clone": _clone}
    exec("\n".join(lines), namespace)
    copier: _Copier = namespace["copy"]
    return copier


def _no_copier(obj: Any, memo: dict[int, Any]) -> Any:
    raise AttributeError("no generated copier")


def _shared(world: _World) -> dict[int, Any]:
    """A memo seed sharing the registry's statistics between all clones: they are
    write-only counters, not state (everything reachable from ``registry.stats``)."""
    seed: dict[int, Any] = {}
    todo: list[Any] = [getattr(world.registry, "stats", None)]
    while todo:
        obj = todo.pop()
        t = type(obj)
        if _kind(t) == _ATOM or id(obj) in seed:
            continue
        seed[id(obj)] = obj
        if t in (list, set, tuple):
            todo.extend(obj)
        elif t is dict or t is OrderedDict:
            todo.extend(obj.keys())
            todo.extend(obj.values())
        elif t is not MethodType:
            todo.extend(getattr(obj, name, None) for name in _slots_of.get(t, ()))
            todo.extend(getattr(obj, "__dict__", {}).values())
    return seed


def _clone_world(world: _World, seed: dict[int, Any]) -> _World:
    cloned: _World = _clone(world, dict(seed))
    return cloned


# -- canonical state keys ------------------------------------------------------------------


_key_slots: dict[tuple[type, frozenset[str]], tuple[str, ...]] = {}


def _atoms(obj: object, skip: frozenset[str]) -> tuple[Any, ...]:
    """The scalar attributes of ``obj`` (covers subclasses' extra state generically)."""
    t = type(obj)
    names = _key_slots.get((t, skip))
    if names is None:
        _kind(t)
        names = _key_slots[(t, skip)] = tuple(n for n in _slots_of.get(t, ()) if n not in skip)
    kinds = _kinds
    out = [(name, value) for name in names
           if kinds.get(type(value := getattr(obj, name, None))) == _ATOM]
    attrs = getattr(obj, "__dict__", None)
    if attrs:
        out.extend((name, attrs[name]) for name in sorted(attrs)
                   if name not in skip and _kind(type(attrs[name])) == _ATOM)
    return tuple(out)


_CORE_SKIP = frozenset({"method", "deadline", "timeout", "policy"})
_QUEUE_SKIP = frozenset({"name", "admitted_total", "abandoned_total"})


def _entry_key(e: PendingRequest) -> tuple[Any, ...]:
    return (e.id, e.state, tuple(sorted((r, rep.ok) for r, rep in e.replies.items())),
            tuple(sorted(e.errors)), tuple(e.sent_ranks),
            tuple(sorted(e.late_ranks)) if e.late_ranks else (), e.refs, e.ok, e.answered,
            e.waiter is None)


def _key(w: _World) -> tuple[Any, ...]:
    """A canonical snapshot of everything the future depends on.

    A finished caller contributes only its frames and deliveries (its late
    replies are still to come) and whether it has an outcome: its ticket, entry
    and outcome cannot change any more, and the checks that read them ran on
    every path into the state (checks run before the memo lookup).
    """
    callers: list[tuple[Any, ...]] = []
    for c in w.callers:
        if c.pc is _Pc.DONE:
            callers.append((c.outcome is None, tuple(sorted(c.frames.items())),
                            tuple(sorted(c.deliveries.items()))))
            continue
        ticket = c.core.ticket
        callers.append((
            c.pc, c.deadline_fired, c.outcome, c.ticket_waiter.is_set, c.entry_waiter.is_set,
            None if ticket is None else (ticket.seq, ticket.state),
            None if c.entry is None else _entry_key(c.entry),
            _atoms(c.core, _CORE_SKIP),
            tuple(sorted(c.frames.items())), tuple(sorted(c.deliveries.items()))))
    reg = w.registry
    tombs: Any = getattr(reg, "_tombstones", {})
    q = w.queue
    return (tuple(callers),
            tuple(sorted(_entry_key(e) for e in reg.live())),
            tuple((rid, tuple(sorted(t.answered))) for rid, t in tombs.items()),
            None if q is None else (None if q.holder is None else q.holder.seq,
                                    tuple(t.seq for t in q.queued()), _atoms(q, _QUEUE_SKIP)),
            tuple(n for n in w.arrivals if w.by_name[n].pc is not _Pc.DONE),
            tuple(n for n in w.admitted if w.by_name[n].pc is not _Pc.DONE),
            tuple(sorted(w.unplugged)),
            tuple(sorted(w.lost)))


# -- enabled events ---------------------------------------------------------------------------


def _enabled(w: _World) -> list[str]:
    """Every event that can happen next, in a fixed order."""
    out: list[str] = []
    now: list[str] = []
    multi = w.scenario.ranks > 1
    first = "arrive" if w.queue is not None else "register"
    callers = w.callers
    for i, c in enumerate(callers):
        pc, spec, name = c.pc, c.spec, c.name
        if pc is _Pc.NEW:
            twin = w.twin_before[i]
            if twin < 0 or callers[twin].pc is not _Pc.NEW:
                out.append(f"{first} {name}")
        elif pc is _Pc.QUEUED:
            if c.ticket_waiter.is_set or c.deadline_fired:
                out.append(f"resume {name}")
        elif pc is _Pc.WAITING:
            if c.entry_waiter.is_set or c.deadline_fired:
                out.append(f"wake {name}")
        elif pc is not _Pc.DONE:
            out.append(f"{_STEP[pc]} {name}")
        if spec.reply is not ReplyMode.NEVER:
            # with the reduction, a finished caller's replies come before anything else
            sink = now if pc is _Pc.DONE and w.reduce else out
            for rank in c.frames:
                n = c.deliveries.get(rank, 0)
                suffix = f"@{rank}" if multi else ""
                if n == 0:
                    if (spec.reply is not ReplyMode.LATE or c.deadline_fired
                            or pc is _Pc.DONE):
                        sink.append(f"reply {name}{suffix}")
                elif n == 1 and spec.reply is ReplyMode.DUPLICATE:
                    sink.append(f"dup {name}{suffix}")
        if spec.timeout and not c.deadline_fired and pc in (_Pc.QUEUED, _Pc.WAITING):
            out.append(f"timeout {name}")
        if spec.cancel is not CancelMode.NEVER and (pc is _Pc.QUEUED or pc in _RUNNING):
            ticket = c.core.ticket
            state = None if ticket is None else ticket.state
            if (spec.cancel is CancelMode.ANY
                    or (spec.cancel is CancelMode.QUEUED and state is TicketState.QUEUED)
                    or (spec.cancel is CancelMode.ADMITTED
                        and (state is TicketState.ADMITTED or w.queue is None))):
                out.append(f"cancel {name}")
        if spec.raises and pc in (_Pc.REGISTER, _Pc.SEND, _Pc.WAITING):
            out.append(f"raise {name}")
    if w.scenario.engine_loss and any(c.pc is not _Pc.DONE for c in w.callers):
        rank = w.scenario.ranks - 1
        if rank not in w.unplugged:
            out.append(f"unplug {rank}")
        if rank not in w.lost:
            out.append(f"lose {rank}")
    if now:
        return now[:1]
    return out


# -- executing one event ---------------------------------------------------------------------


def _who(w: _World, request_id: int) -> str:
    for c in w.callers:
        if c.entry is not None and c.entry.id == request_id:
            return f"{c.name}'s request"
        if request_id in c.frames.values():
            return f"{c.name}'s request"
    return f"request {request_id}"


def _fail(w: _World, check: str, detail: str) -> None:
    if check in w.checks:
        raise InvariantViolation(check, detail)


def _wake(entry: PendingRequest | None) -> None:
    """What the shells' ``_wake`` does: set the entry's waiter, if it still has one."""
    if entry is not None and entry.waiter is not None:
        entry.waiter.set()


def _set_outcome(w: _World, c: _Caller, outcome: str) -> None:
    if c.outcome is not None:
        _fail(w, "outcomes", f"{c.name} got a second outcome {outcome!r} after {c.outcome!r}")
        return
    c.outcome = outcome
    entry = c.entry
    if outcome == "timed-out" and not c.deadline_fired:
        _fail(w, "outcomes", f"{c.name} timed out though its deadline never passed")
    if outcome == "result" and (entry is None or not entry.replies):
        _fail(w, "outcomes", f"{c.name} returned a result without any reply")
    if outcome == "failed" and (entry is None or not entry.errors):
        _fail(w, "outcomes", f"{c.name} failed without any failed rank")


def _read_outcome(w: _World, c: _Caller) -> str:
    """What ``fan_out_outcome`` makes of the entry: a result, FanOutFailed, RequestTimedOut."""
    entry = c.entry
    assert entry is not None
    state = entry.state
    if entry.is_open:
        _fail(w, "outcomes", f"{c.name} read its outcome while its request is still "
                             f"{state.name}")
    elif state not in (RequestState.DONE, RequestState.FAILED, RequestState.TIMED_OUT):
        _fail(w, "outcomes", f"{c.name} read its outcome from a {state.name} request")
    outcome = {RequestState.DONE: "result", RequestState.FAILED: "failed"}.get(state,
                                                                                "timed-out")
    _set_outcome(w, c, outcome)
    c.pc = _Pc.FINISH
    return f"outcome {outcome} ({state.name})"


def _finish(w: _World, c: _Caller) -> str:
    """The shell's ``finally``: core.finish(), then wake the ticket admitted by hand-off."""
    admitted = c.core.finish()
    c.pc = _Pc.DONE
    if admitted is None:
        return "finished"
    owner = next((d for d in w.callers if d.core.ticket is admitted), None)
    if owner is None:
        raise InvariantViolation("crash", f"{c.name}'s finish handed the mailbox to an "
                                          f"unknown ticket {admitted!r}")
    waiter = admitted.waiter
    if waiter is None:
        raise InvariantViolation("crash", f"ticket of {owner.name} has no waiter to wake")
    waiter.set()
    return f"finished; hands the mailbox to {owner.name}"


def _deliver(w: _World, c: _Caller, rank: int, first: bool) -> str:
    request_id = c.frames[rank]
    entry = c.entry
    must_accept = (first and c.pc is not _Pc.DONE and not c.deadline_fired
                   and (entry is None or (entry.is_open and rank not in entry.errors)))
    ok = c.spec.reply_ok
    reply = Reply(request_id, rank, _ENGINE_INCARNATION, ok, _NIL,
                  None if ok else ErrorInfo("EngineError", "failed on purpose", 7))
    disposition, found = w.registry.on_reply(reply)
    c.deliveries[rank] = c.deliveries.get(rank, 0) + 1
    if disposition is ReplyDisposition.COMPLETED:
        _wake(found)
    what = "reply" if first else "duplicate reply"
    if disposition in (ReplyDisposition.UNKNOWN, ReplyDisposition.STRAY):
        _fail(w, "replies", f"{what} from rank {rank} for {c.name}'s sent request classified "
                            f"{disposition.name}")
    elif not first and disposition in (ReplyDisposition.ACCEPTED, ReplyDisposition.COMPLETED):
        _fail(w, "replies", f"duplicate reply from rank {rank} for {c.name} applied twice "
                            f"({disposition.name})")
    elif must_accept and disposition not in (ReplyDisposition.ACCEPTED,
                                             ReplyDisposition.COMPLETED):
        _fail(w, "replies", f"reply from rank {rank} for {c.name}'s request (frame sent, "
                            f"deadline not passed, {c.name} still waiting) classified "
                            f"{disposition.name}: the reply is lost")
    return f"{what} -> {disposition.name}"


def _send(w: _World, c: _Caller) -> str:
    """One turn of ``send_all``'s loop; once no rank is left, its tail and ``begin_wait``."""
    core = c.core
    entry = c.entry
    assert entry is not None
    rank = core.next_send()
    if rank is None:
        if not entry.is_open:
            _wake(entry)
        if core.begin_wait():
            c.pc = _Pc.WAITING
            return f"nothing left to send; waits ({entry.state.name})"
        return "nothing left to send; " + _read_outcome(w, c)
    if rank in w.unplugged:
        if core.send_failed(rank, EngineDead(rank, "unroutable")):
            _wake(entry)
        return f"frame to rank {rank} refused (unroutable) -> {entry.state.name}"
    c.frames[rank] = entry.id
    live = w.registry.get(entry.id)
    if live is not entry or live.state is RequestState.REGISTERED or rank not in live.sent_ranks:
        where = ("not in the request map" if live is None
                 else f"{live.state.name}, sent to {live.sent_ranks}")
        _fail(w, "registry", f"{c.name}'s frame to rank {rank} left before its entry was "
                             f"registered and marked Sent ({where})")
    return f"frame to rank {rank} handed to the transport"


def _execute(w: _World, label: str) -> str:
    verb, _, arg = label.partition(" ")
    if verb in ("unplug", "lose"):
        rank = int(arg)
        if verb == "unplug":
            w.unplugged.add(rank)
            return f"sends to rank {rank} fail from now on"
        w.lost.add(rank)
        decided = w.registry.fail_rank(rank, lambda r: EngineDead(r, "lost"))
        for entry in decided:
            _wake(entry)
        names = [_who(w, e.id) for e in decided]
        return f"rank {rank} declared lost; decided {names or 'nothing'}"
    name, _, rank_text = arg.partition("@")
    c = w.by_name[name]
    if verb in ("reply", "dup"):
        rank = int(rank_text) if rank_text else 0
        return _deliver(w, c, rank, first=verb == "reply")
    if verb == "timeout":
        c.deadline_fired = True
        return "deadline passes"
    if verb in ("cancel", "raise"):
        _set_outcome(w, c, "cancelled" if verb == "cancel" else "raised")
        return f"{'cancelled' if verb == 'cancel' else 'raises'}; " + _finish(w, c)
    core = c.core
    if verb == "arrive":
        w.arrivals.append(name)
        if core.arrive(c.ticket_waiter):
            c.pc = _Pc.RESUME
            return "admitted at once"
        c.pc = _Pc.QUEUED
        return f"queued (depth {w.queue.depth if w.queue is not None else '?'})"
    if verb == "resume":
        if c.pc is _Pc.QUEUED and not core.admitted:
            ticket = core.ticket
            state = "?" if ticket is None else ticket.state.name
            if not c.deadline_fired:
                _fail(w, "handoff", f"{name} was woken but its ticket is {state}, not "
                                    "admitted (the shell raises a spurious RequestTimedOut)")
            _set_outcome(w, c, "timed-out")
            return f"not admitted ({state}): times out; " + _finish(w, c)
        core.resume()
        c.pc = _Pc.REGISTER
        return "resumes holding the mailbox"
    if verb == "register":
        if c.pc is _Pc.NEW:  # no mailbox: the call starts here
            w.arrivals.append(name)
        c.entry = core.register(c.entry_waiter)
        c.pc = _Pc.SEND
        return "registered"
    if verb == "send":
        return _send(w, c)
    if verb == "wake":
        held = c.entry
        assert held is not None
        if held.is_open and c.deadline_fired:
            core.deadline_passed()
        return _read_outcome(w, c)
    if verb == "finish":
        return _finish(w, c)
    raise ReplayError(f"unknown event {label!r}")


# -- checks --------------------------------------------------------------------------------


def _check_state(w: _World) -> None:
    checks = w.checks
    callers = w.callers
    # fifo: every newly admitted caller arrived before every caller still waiting
    for c in callers:
        ticket = c.core.ticket
        if (ticket is not None and c.name not in w.admitted
                and ticket.state in (TicketState.ADMITTED, TicketState.RELEASED)):
            if "fifo" in checks:
                for earlier in w.arrivals[:w.arrivals.index(c.name)]:
                    d = w.by_name[earlier]
                    dt = d.core.ticket
                    if (earlier not in w.admitted and d.pc is not _Pc.DONE and dt is not None
                            and dt.state is TicketState.QUEUED):
                        raise InvariantViolation(
                            "fifo", f"{c.name} was admitted while {earlier}, who arrived "
                                    "earlier, still waits")
            w.admitted.append(c.name)
    queue = w.queue
    if "fifo" in checks and queue is not None:
        try:
            queue.check_invariants()
        except AssertionError as exc:
            raise InvariantViolation("fifo", f"queue invariant: {exc}") from None
    if "exclusive" in checks and queue is not None:
        holders = [c.name for c in callers if c.core.ticket is not None
                   and c.core.ticket.state is TicketState.ADMITTED]
        if len(holders) > 1:
            raise InvariantViolation("exclusive", f"{holders} are admitted at once")
        active = [c for c in callers if c.pc in _HOLDING]
        if len(active) > 1:
            raise InvariantViolation("exclusive", f"{[c.name for c in active]} have requests "
                                                  "in flight at once")
        for c in active:
            ticket = c.core.ticket
            if ticket is None or ticket.state is not TicketState.ADMITTED:
                raise InvariantViolation("exclusive", f"{c.name} has a request in flight "
                                                      "without holding the mailbox")
    if "handoff" in checks:
        for c in callers:
            ticket = c.core.ticket
            if ticket is None:
                continue
            if c.ticket_waiter.is_set and ticket.state not in (TicketState.ADMITTED,
                                                               TicketState.RELEASED):
                raise InvariantViolation("handoff", f"{c.name} was woken but its ticket is "
                                                    f"{ticket.state.name}, not admitted")
            if (c.pc is _Pc.QUEUED and ticket.state is TicketState.ADMITTED
                    and not c.ticket_waiter.is_set):
                raise InvariantViolation("handoff", f"{c.name} was admitted by hand-off but "
                                                    "never woken")
    reg = w.registry
    if "registry" in checks:
        try:
            reg.check_invariants()
        except AssertionError as exc:
            raise InvariantViolation("registry", f"registry invariant: {exc}") from None
        held = {c.entry.id: c for c in callers if c.pc in _HOLDING and c.entry is not None}
        live = {e.id: e for e in reg.live()}
        for rid, c in held.items():
            if live.get(rid) is not c.entry:
                raise InvariantViolation("registry", f"{c.name} holds a request that is not "
                                                     "in the request map")
        for rid in live.keys() - held.keys():
            raise InvariantViolation("registry", f"{_who(w, rid)} is in the request map but "
                                                 "no unfinished caller holds it")
    if "cleanup" in checks:
        if reg.tombstone_count > reg.max_tombstones:
            raise InvariantViolation("cleanup", f"{reg.tombstone_count} tombstones, bound "
                                                f"{reg.max_tombstones}")
        unfinished = sum(c.pc is not _Pc.DONE for c in callers)
        if reg.live_count > unfinished:
            raise InvariantViolation("cleanup", f"{reg.live_count} live entries for "
                                                f"{unfinished} unfinished callers")
        for c in callers:
            if c.pc is not _Pc.DONE:
                continue
            ticket = c.core.ticket
            if ticket is not None and ticket.state not in (TicketState.RELEASED,
                                                           TicketState.ABANDONED):
                raise InvariantViolation("cleanup", f"{c.name} finished but its ticket is "
                                                    f"left {ticket.state.name}")
            if c.entry is not None and c.entry.state is not RequestState.CLEANED:
                raise InvariantViolation("cleanup", f"{c.name} finished but its request is "
                                                    f"left {c.entry.state.name}")
        depth = 0 if queue is None else queue.depth
        holder = None if queue is None else queue.holder
        if not unfinished and (reg.live_count or depth or holder is not None):
            raise InvariantViolation(
                "cleanup", f"every caller finished but {reg.live_count} entries, "
                           f"{depth} queued tickets and holder {holder} remain")


def _check_final(w: _World) -> None:
    """No event is enabled any more: everyone must have finished with one outcome."""
    stuck = [f"{c.name} ({c.pc.name.lower()})" for c in w.callers if c.pc is not _Pc.DONE]
    if stuck:
        _fail(w, "progress", f"no event can happen but {', '.join(stuck)} never finishes")
    missing = [c.name for c in w.callers if c.pc is _Pc.DONE and c.outcome is None]
    if missing:
        _fail(w, "outcomes", f"{missing} finished without an outcome")


def _step(w: _World, label: str, trace: list[str] | None = None) -> str:
    """Execute one event and check the state it leads to; ``trace`` gets what it did."""
    what = ""
    try:
        what = _execute(w, label)
        _check_state(w)
    except ReplayError:
        raise
    except Exception as exc:
        violation = (exc if isinstance(exc, InvariantViolation) else
                     InvariantViolation("crash", f"{label}: {type(exc).__name__}: {exc}"))
        if trace is not None:
            trace.append(f"{what + '  ' if what else ''}!! {violation}")
        if violation is exc:
            raise
        raise violation from exc
    if trace is not None:
        trace.append(what)
    return what


# -- exploration --------------------------------------------------------------------------------


def _checks(checks: Iterable[str]) -> frozenset[str]:
    chosen = frozenset(checks)
    unknown = chosen - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; known: {CHECKS}")
    return chosen


def explore(scenario: Scenario, *, queue_cls: QueueFactory = AdmissionQueue,
            call_core_cls: CoreFactory = CallCore, registry_cls: RegistryFactory = RequestRegistry,
            checks: Iterable[str] = CHECKS, reduce: bool = False,
            max_states: int = 5_000_000) -> ExplorationResult:
    """Check every interleaving of ``scenario`` against ``checks`` (see the module
    docstring), driving instances of ``queue_cls``, ``call_core_cls`` and
    ``registry_cls`` (the real cores by default; subclasses to test mutants).

    Returns the counts, or, at the first failure, a shortest counterexample
    (found breadth-first) instead of finishing the count. ``reduce``: deliver a
    finished caller's late replies first (fewer paths; see the module
    docstring). Raises RuntimeError past ``max_states`` distinct states.
    """
    chosen = _checks(checks)
    result = ExplorationResult(scenario, checks=tuple(c for c in CHECKS if c in chosen),
                               reduced=reduce)
    started = time.perf_counter()
    root = _World(scenario, queue_cls, call_core_cls, registry_cls, chosen, reduce)
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
        result.counterexample = _shortest(scenario, queue_cls, call_core_cls, registry_cls,
                                          chosen)
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


def _shortest(scenario: Scenario, queue_cls: QueueFactory, call_core_cls: CoreFactory,
              registry_cls: RegistryFactory, checks: frozenset[str]) -> Counterexample:
    """Breadth-first: the shortest failing sequences; among them, one per check,
    the first found of the most preferred check."""
    root = _World(scenario, queue_cls, call_core_cls, registry_cls, checks, reduce=False)
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
                replay(scenario, events, queue_cls=queue_cls, call_core_cls=call_core_cls,
                       registry_cls=registry_cls, checks=checks, trace=trace)
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
           call_core_cls: CoreFactory = CallCore, registry_cls: RegistryFactory = RequestRegistry,
           checks: Iterable[str] = CHECKS, trace: list[str] | None = None) -> list[str]:
    """Re-run exactly ``events`` (e.g. a counterexample's) from the initial state.

    Raises :class:`InvariantViolation` as the explorer saw it (including the
    end-of-run checks when no event is enabled after the last one), or
    :class:`ReplayError` when an event is not enabled where it appears. Returns
    what each event did (also appended to ``trace`` as it goes).
    """
    w = _World(scenario, queue_cls, call_core_cls, registry_cls, _checks(checks), reduce=False,
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
    """``python -m ctlwire.kernel.testing.interleaving [MAX_CALLERS [MAX_CALLERS_TWO_RANKS]]``:
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
