"""The world the interleaving explorer drives: the real cores and the callers' program
counters; a fast deep copy of it and its canonical key (for memoisation).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from enum import Enum
from types import BuiltinFunctionType, FunctionType, MethodType
from typing import Any

import msgspec

from ctlwire.kernel.core.admission_queue import AdmissionQueue, Ticket
from ctlwire.kernel.core.request_registry import PendingRequest, RequestRegistry
from ctlwire.kernel.primitives.coalescer import Coalescer
from ctlwire.states import StateTable
from ctlwire.testing.interleaving._scenario import (
    _ENGINE_INCARNATION,
    _KEY,
    _METHOD,
    _NAMES,
    CallerSpec,
    Scenario,
)

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
    SEND = 4      # next: send (plan_sends, a planned rank's frame / awaiting)
    WAITING = 5   # awaiting its entry's waiter; next: wake
    TURN = 6      # decided; awaiting its turn to return (its ticket's waiter); next: turn
    FINISH = 7    # outcome read; next: finish
    DONE = 8      # finished


_RUNNING = (_Pc.RESUME, _Pc.REGISTER, _Pc.SEND, _Pc.WAITING, _Pc.TURN)
_HOLDING = (_Pc.SEND, _Pc.WAITING, _Pc.TURN, _Pc.FINISH)  # registered, not finished
_STEP = {_Pc.NEW: "arrive", _Pc.QUEUED: "resume", _Pc.RESUME: "resume",
         _Pc.REGISTER: "register", _Pc.SEND: "send", _Pc.WAITING: "wake", _Pc.TURN: "turn",
         _Pc.FINISH: "finish"}


class _Caller:
    __slots__ = ("deadline_fired", "deliveries", "entry", "entry_waiter", "frames",
                 "name", "outcome", "pc", "plan", "spec", "started", "ticket", "ticket_waiter",
                 "turn_waiter")

    def __init__(self, name: str, spec: CallerSpec) -> None:
        self.name = name
        self.spec = spec
        self.pc = _Pc.NEW
        self.ticket: Ticket | None = None           # what queue.arrive() returned
        self.ticket_waiter = _Flag()
        self.entry_waiter = _Flag()
        self.turn_waiter = _Flag()                 # its ticket's waiter while in TURN
        self.entry: PendingRequest | None = None   # what register() returned
        self.plan: list[int] | None = None         # the planned ranks not sent yet
        self.frames: dict[int, int] = {}           # rank -> request id of the frame sent
        self.deliveries: dict[int, int] = {}       # rank -> replies delivered
        self.deadline_fired = False
        self.outcome: str | None = None
        self.started = True  # (watching) False: joined a request another caller started


QueueFactory = Callable[..., AdmissionQueue]
RegistryFactory = Callable[..., RequestRegistry]


class _World:
    __slots__ = ("admitted", "arrivals", "by_name", "callers", "checks", "coalescer",
                 "last_sent", "liveness", "queue", "ranks", "reduce", "registry", "scenario",
                 "twin_before", "unplugged")

    def __init__(self, scenario: Scenario, queue_cls: QueueFactory,
                 registry_cls: RegistryFactory, checks: frozenset[str], reduce: bool,
                 symmetric: bool = True) -> None:
        self.scenario = scenario
        self.checks = checks
        self.reduce = reduce
        self.registry = registry_cls(max_tombstones=scenario.max_tombstones,
                                     incarnation=_ENGINE_INCARNATION)
        self.queue: AdmissionQueue | None = (
            queue_cls(_METHOD, holders=scenario.depth) if scenario.mailbox else None)
        self.coalescer: Coalescer[PendingRequest] | None = (
            Coalescer() if scenario.watching else None)
        self.liveness = _Liveness()
        self.ranks = tuple(range(scenario.ranks))
        self.callers = [_Caller(_NAMES[i], spec) for i, spec in enumerate(scenario.callers)]
        self.by_name = {c.name: c for c in self.callers}
        # callers with equal specs are interchangeable until they arrive: they arrive in
        # list order (each complete path stands for the permutations of their names)
        self.twin_before: tuple[int, ...] = tuple(
            max((j for j in range(i) if scenario.callers[j] == spec), default=-1)
            if symmetric else -1 for i, spec in enumerate(scenario.callers))
        self.arrivals: list[str] = []
        self.admitted: list[str] = []
        #: rank -> the caller whose frame went to it last
        self.last_sent: dict[int, str] = {}
        self.unplugged: set[int] = set()

    @property
    def lost(self) -> set[int]:
        return self.liveness.lost


class _Liveness:
    """What the client's peer table says about ranks (``plan_sends``'s ``is_lost``). Kept
    apart from the world so that worlds hold no reference cycle: refcounting frees
    them at once, and the explorer can run with the cyclic collector paused."""

    __slots__ = ("lost",)

    def __init__(self) -> None:
        self.lost: set[int] = set()

    def is_lost(self, rank: int) -> bool:
        return rank in self.lost


# -- cloning (a deep copy that shares immutable things, cheaper than copy.deepcopy) -----

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


_QUEUE_SKIP = frozenset({"name", "admitted_total", "abandoned_total"})


def _entry_key(e: PendingRequest) -> tuple[Any, ...]:
    return (e.id, e.state,
            tuple(sorted((r, rep.ok) for r, rep in e.replies.items())),
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
        ticket = c.ticket
        callers.append((
            c.pc, c.deadline_fired, c.outcome, c.ticket_waiter.is_set, c.entry_waiter.is_set,
            c.turn_waiter.is_set, c.started, None if c.plan is None else tuple(c.plan),
            None if ticket is None else (ticket.seq, ticket.state),
            None if c.entry is None else _entry_key(c.entry),
            tuple(sorted(c.frames.items())), tuple(sorted(c.deliveries.items()))))
    reg = w.registry
    q = w.queue
    co = w.coalescer
    shared = co.get(_KEY) if co is not None else None
    # what a later frame's order is checked against: per rank, how many of the admitted
    # callers still running were admitted before the caller whose frame went last
    running = [n for n in w.admitted if w.by_name[n].pc is not _Pc.DONE]
    last_sent = tuple(sorted(
        (rank, sum(w.admitted.index(n) < w.admitted.index(last) for n in running))
        for rank, last in w.last_sent.items()))
    return (tuple(callers),
            None if co is None else (None if shared is None else shared.id, co.tracked),
            tuple(sorted(_entry_key(e) for e in reg.live())),
            tuple((rid, tuple(sorted(t.answered))) for rid, t in reg.tombstones.items()),
            None if q is None else (tuple((t.seq, t.state) for t in q.admitted()),
                                    tuple(t.seq for t in q.queued()), _atoms(q, _QUEUE_SKIP)),
            tuple(n for n in w.arrivals if w.by_name[n].pc is not _Pc.DONE),
            tuple(running), last_sent,
            tuple(sorted(w.unplugged)),
            tuple(sorted(w.lost)))
