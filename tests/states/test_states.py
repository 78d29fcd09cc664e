"""Every machine in ctlwire.states: exhaustive (state x event) checks against transitions."""

from __future__ import annotations

import ast
import subprocess
import sys
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from transitions import MachineError

from ctlwire.states import (
    CONTROL_REQUEST_TABLE,
    MACHINES,
    TABLES,
    IllegalTransition,
    MachineSpec,
    RequestEvent,
    RequestState,
    StateTable,
    build_machine,
)

ROOT = Path(__file__).resolve().parents[2]
PAIRS = [
    pytest.param(table, state, event, id=f"{table.name}-{state.name}-{event.name}")
    for table in TABLES
    for state in table.states
    for event in table.events
]


def declared_edges(spec: MachineSpec[Any, Any]) -> dict[tuple[Enum, Enum], Enum]:
    """The spec's declaration read directly (independently of derive_table)."""
    edges: dict[tuple[Enum, Enum], Enum] = {}
    for event, sources, dest in spec.transitions:
        for src in sources:
            assert (src, event) not in edges, f"duplicate edge {src} {event}"
            edges[(src, event)] = dest
    return edges


class _Model:
    state: Enum


def transitions_outcome(spec: MachineSpec[Any, Any], state: Enum, event: Enum) -> Enum | None:
    """What transitions itself does: the state reached, or None when it refuses."""
    model = _Model()
    machine = build_machine(spec, model)
    machine.set_state(state, model)
    try:
        getattr(model, event.value)()
    except MachineError:
        return None
    return model.state


@pytest.mark.parametrize(("table", "state", "event"), PAIRS)
def test_table_agrees_with_transitions_for_every_pair(
    table: StateTable[Any, Any], state: Enum, event: Enum
) -> None:
    expected = transitions_outcome(table.spec, state, event)
    declared = declared_edges(table.spec).get((state, event))
    assert expected == declared
    if expected is None:
        with pytest.raises(IllegalTransition) as info:
            table.apply(state, event, request_id=7)
        assert info.value.machine == table.name
        assert info.value.state is state
        assert info.value.event is event
        assert info.value.request_id == 7
        assert not table.can(state, event)
    else:
        assert table.apply(state, event) is expected
        assert table.can(state, event)


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.name)
def test_every_state_reachable_from_initial(table: StateTable[Any, Any]) -> None:
    seen = {table.initial}
    frontier = [table.initial]
    while frontier:
        state = frontier.pop()
        for nxt in table.allowed(state).values():
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen == set(table.states)


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.name)
def test_final_states_have_no_exit_and_terminal_states_are_declared(
    table: StateTable[Any, Any],
) -> None:
    for state in table.final:
        assert dict(table.allowed(state)) == {}
    assert table.terminal <= set(table.states)
    # every non-terminal, non-final state has a way forward
    for state in set(table.states) - table.final - table.terminal:
        assert table.allowed(state), state


@pytest.mark.parametrize(
    "table", [t for t in TABLES if t.spec.cleanup is not None], ids=lambda t: t.name
)
def test_cleanup_reachable_from_every_terminal_and_only_from_them(
    table: StateTable[Any, Any],
) -> None:
    cleanup = table.spec.cleanup
    sources = {src for (src, _), dst in table if dst is cleanup}
    assert sources == set(table.terminal)
    for state in table.terminal:
        assert cleanup in table.allowed(state).values()


def test_reply_may_beat_the_wait() -> None:
    table = CONTROL_REQUEST_TABLE
    state = table.apply(RequestState.REGISTERED, RequestEvent.SEND)
    assert table.apply(state, RequestEvent.COMPLETE) is RequestState.DONE
    with pytest.raises(IllegalTransition):
        table.apply(RequestState.REGISTERED, RequestEvent.COMPLETE)


def test_a_running_request_ends_only_with_its_reply() -> None:
    """The engine expires or rejects a request only before it runs: once its
    handler started, only its reply ends it."""
    from ctlwire.states import INBOUND_REQUEST_TABLE, InboundEvent, InboundState

    table = INBOUND_REQUEST_TABLE
    assert dict(table.allowed(InboundState.RUNNING)) == {
        InboundEvent.REPLY: InboundState.REPLIED}
    for event in (InboundEvent.EXPIRE, InboundEvent.REJECT, InboundEvent.START):
        with pytest.raises(IllegalTransition):
            table.apply(InboundState.RUNNING, event)
    assert table.apply(InboundState.RECEIVED, InboundEvent.EXPIRE) is InboundState.EXPIRED


def test_one_task_receives_at_a_time() -> None:
    """A caller takes the turn to receive only when no one receives; once a receiver
    saw the transport close, no one receives again."""
    from ctlwire.states import RECEIVE_TURN_TABLE, TurnEvent, TurnState

    table = RECEIVE_TURN_TABLE
    receiving = {s for s in TurnState if s is not TurnState.IDLE}
    for state in receiving:
        for event in (TurnEvent.CALLER_TAKES, TurnEvent.LOOP_RECEIVES):
            assert not table.can(state, event), (state, event)
    assert dict(table.allowed(TurnState.CLOSED)) == {
        TurnEvent.CALLER_GIVES_BACK: TurnState.CLOSED}
    # a decision only ends a caller's receive while it waits: handing on, it must
    # hand on before it can give the turn back
    assert dict(table.allowed(TurnState.HANDING_ON)) == {
        TurnEvent.CALLER_HANDED_ON: TurnState.CALLER}


def test_table_is_immutable() -> None:
    with pytest.raises(TypeError):
        CONTROL_REQUEST_TABLE.table[(RequestState.DONE, RequestEvent.SEND)] = RequestState.SENT  # type: ignore[index]


def test_illegal_transition_is_picklable_and_readable() -> None:
    import pickle

    err = IllegalTransition("ControlRequest", RequestState.DONE, RequestEvent.SEND, 42)
    again = pickle.loads(pickle.dumps(err))
    assert (again.machine, again.state, again.event, again.request_id) == (
        "ControlRequest", RequestState.DONE, RequestEvent.SEND, 42)
    assert "send" in str(err) and "DONE" in str(err) and "42" in str(err)


FORBIDDEN = ("anyio", "zmq", "trio", "asyncio", "time", "socket", "threading",
             "ctlwire.kernel", "ctlwire.transports")


def test_states_source_imports_nothing_impure() -> None:
    offenders = []
    for path in sorted((ROOT / "states").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if any(name == f or name.startswith(f + ".") for f in FORBIDDEN):
                    offenders.append(f"{path.name}:{node.lineno} {name}")
    assert offenders == []


def test_importing_states_loads_no_io_library() -> None:
    code = (
        "import sys, ctlwire.states, ctlwire.states.diagram\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('anyio','zmq','trio','asyncio')"
        " or m.startswith(('ctlwire.kernel','ctlwire.transports'))]\n"
        "print(','.join(sorted(bad)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd="/")
    assert out.stdout.strip() == ""


def test_machines_and_tables_line_up() -> None:
    assert [t.spec for t in TABLES] == list(MACHINES)
    assert len({spec.name for spec in MACHINES}) == len(MACHINES)


def test_operation_rank_ends_only_in_a_named_outcome() -> None:
    from ctlwire.states import OPERATION_RANK_TABLE, RankState

    ends = {RankState.COMMITTED, RankState.COMPENSATED, RankState.ABORTED,
            RankState.QUARANTINED, RankState.SUPERSEDED}
    assert OPERATION_RANK_TABLE.final == ends
    # a rank whose step may have applied never ends committed
    seen = {RankState.UNKNOWN}
    frontier = [RankState.UNKNOWN]
    while frontier:
        for nxt in OPERATION_RANK_TABLE.allowed(frontier.pop()).values():
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    assert seen & ends == {RankState.COMPENSATED, RankState.ABORTED, RankState.QUARANTINED,
                           RankState.SUPERSEDED}


def test_operation_commits_only_from_running() -> None:
    from ctlwire.states import OPERATION_TABLE, OperationEvent, OperationState

    sources = {s for (s, e), _ in OPERATION_TABLE if e is OperationEvent.COMMIT}
    assert sources == {OperationState.RUNNING}
    assert not OPERATION_TABLE.can(OperationState.ABORTING, OperationEvent.COMMIT)
