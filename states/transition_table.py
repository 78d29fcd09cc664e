"""Immutable ``(state, event) -> state`` tables derived from transitions machines.

Each machine in this package is declared once, as a :class:`MachineSpec` whose
transitions are handed verbatim to :class:`transitions.Machine`. At import,
:func:`derive_table` builds that machine and reads its events back into a frozen
lookup table. The table, not the transitions machine, is what the kernel drives
on its hot path: :meth:`StateTable.apply` is two dict lookups and never
allocates. transitions stays the single source of truth and the diagram
generator; nothing here repeats the declared transitions by hand.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from transitions import Machine

from ctlwire.states.errors import IllegalTransition

__all__ = ["MachineSpec", "StateTable", "build_machine", "derive_table"]

S = TypeVar("S", bound=Enum)
E = TypeVar("E", bound=Enum)


@dataclass(frozen=True)
class MachineSpec(Generic[S, E]):
    """The one declaration of a machine.

    ``transitions`` is a sequence of ``(event, sources, dest)`` triples; it is
    passed to transitions as its ``transitions=`` argument and read nowhere
    else. ``terminal`` names the states where the work is over (outcome known);
    ``final`` the states with no way out; ``cleanup`` the state every terminal
    state must lead to, when the machine has one.
    """

    name: str
    states: type[S]
    events: type[E]
    initial: S
    transitions: Sequence[tuple[E, Sequence[S], S]]
    terminal: frozenset[S]
    final: frozenset[S]
    cleanup: S | None = None
    description: str = ""
    _declared: tuple[dict[str, Any], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        declared = tuple(
            {"trigger": event.value, "source": list(sources), "dest": dest}
            for event, sources, dest in self.transitions
        )
        object.__setattr__(self, "_declared", declared)

    def machine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for a transitions ``Machine`` (or ``GraphMachine``)."""
        return {
            "states": list(self.states),
            "transitions": [dict(t) for t in self._declared],
            "initial": self.initial,
            "auto_transitions": False,
            "ignore_invalid_triggers": False,
        }


def build_machine(spec: MachineSpec[Any, Any], model: object | None = None) -> Machine:
    """A transitions ``Machine`` for ``spec`` (strict: invalid triggers raise)."""
    return Machine(model=model if model is not None else Machine.self_literal,
                   **spec.machine_kwargs())


class StateTable(Generic[S, E]):
    """An immutable transition table with an O(1) driver.

    ``apply(state, event)`` returns the next state or raises
    :class:`IllegalTransition`; it has no side effects.
    """

    __slots__ = ("_next", "events", "final", "initial", "name", "spec", "states", "table",
                 "terminal")

    def __init__(self, spec: MachineSpec[S, E], table: Mapping[tuple[S, E], S]) -> None:
        self.spec = spec
        self.name = spec.name
        self.states: tuple[S, ...] = tuple(spec.states)
        self.events: tuple[E, ...] = tuple(spec.events)
        self.initial: S = spec.initial
        self.terminal: frozenset[S] = spec.terminal
        self.final: frozenset[S] = spec.final
        self.table: Mapping[tuple[S, E], S] = MappingProxyType(dict(table))
        nxt: dict[S, dict[E, S]] = {s: {} for s in self.states}
        for (src, ev), dst in table.items():
            nxt[src][ev] = dst
        self._next: dict[S, Mapping[E, S]] = {s: MappingProxyType(d) for s, d in nxt.items()}

    def apply(self, state: S, event: E, request_id: object | None = None) -> S:
        """The state ``event`` leads to from ``state``; raises IllegalTransition."""
        try:
            return self._next[state][event]
        except KeyError:
            raise IllegalTransition(self.name, state, event, request_id) from None

    def allowed(self, state: S) -> Mapping[E, S]:
        """The events legal in ``state`` and where each leads."""
        return self._next[state]

    def can(self, state: S, event: E) -> bool:
        return event in self._next[state]

    def __iter__(self) -> Iterator[tuple[tuple[S, E], S]]:
        return iter(self.table.items())

    def __repr__(self) -> str:
        return f"<StateTable {self.name}: {len(self.table)} transitions>"


def derive_table(spec: MachineSpec[S, E]) -> StateTable[S, E]:
    """Build the transitions machine for ``spec`` and read its events into a table.

    Raises ``ValueError`` if the declaration is outside what a plain table can
    express (conditions, several transitions for one (state, event), internal
    transitions).
    """
    machine = build_machine(spec)
    by_name = {s.name: s for s in spec.states}
    ev_by_value = {e.value: e for e in spec.events}
    table: dict[tuple[S, E], S] = {}
    for trigger, event in machine.events.items():
        if trigger not in ev_by_value:
            raise ValueError(f"{spec.name}: trigger {trigger!r} is not in {spec.events.__name__}")
        ev = ev_by_value[trigger]
        for source, candidates in event.transitions.items():
            if len(candidates) != 1:
                raise ValueError(f"{spec.name}: {source} --{trigger}--> is ambiguous")
            (transition,) = candidates
            if transition.conditions or transition.dest is None:
                raise ValueError(f"{spec.name}: {source} --{trigger}--> is not a plain edge")
            table[(by_name[source], ev)] = by_name[transition.dest]
    missing = set(spec.events) - {ev for (_, ev) in table}
    if missing:
        raise ValueError(f"{spec.name}: events never used: {sorted(e.value for e in missing)}")
    return StateTable(spec, table)
