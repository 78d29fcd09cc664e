"""The interleaving explorer's invariants (CHECKS), checked on every state reached and at
the end of every path.
"""

from __future__ import annotations

from ctlwire.states import RequestState, TicketState
from ctlwire.testing.interleaving._scenario import _KEY, InvariantViolation, ReplayError
from ctlwire.testing.interleaving._steps import _execute, _fail, _who
from ctlwire.testing.interleaving._world import _HOLDING, _Pc, _World

# -- checks --------------------------------------------------------------------------------


def _check_state(w: _World) -> None:
    checks = w.checks
    callers = w.callers
    # fifo: every newly admitted caller arrived before every caller still waiting
    for c in callers:
        ticket = c.ticket
        if (ticket is not None and c.name not in w.admitted
                and ticket.state not in (TicketState.QUEUED, TicketState.ABANDONED)):
            if "fifo" in checks:
                for earlier in w.arrivals[:w.arrivals.index(c.name)]:
                    d = w.by_name[earlier]
                    dt = d.ticket
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
        depth = w.scenario.depth
        holding = [c.name for c in callers if c.ticket is not None
                   and c.ticket.state in (TicketState.ADMITTED, TicketState.STARTED)]
        if len(holding) > depth:
            raise InvariantViolation("exclusive", f"{holding} hold the mailbox at once "
                                                  f"(depth {depth})")
        starting = [c.name for c in callers if c.ticket is not None
                    and c.ticket.state is TicketState.ADMITTED]
        if len(starting) > 1:
            raise InvariantViolation("exclusive", f"{starting} are admitted to start at once")
        # in flight: registered, not finished, not decided (a decided holder has
        # passed its slot on and only reads its outcome and cleans up)
        active = [c for c in callers if c.pc in _HOLDING and c.entry is not None
                  and c.entry.is_open]
        if len(active) > depth:
            raise InvariantViolation("exclusive", f"{[c.name for c in active]} have undecided "
                                                  f"requests in flight at once (depth {depth})")
        for c in active:
            ticket = c.ticket
            if ticket is None or ticket.state not in (TicketState.ADMITTED,
                                                      TicketState.STARTED):
                raise InvariantViolation("exclusive", f"{c.name} has a request in flight "
                                                      "without holding the mailbox")
    coalescer = w.coalescer
    if "shared" in checks and coalescer is not None:
        # one request in flight for the key, and it is the one the coalescer shares
        open_ids = {c.entry.id for c in callers
                    if c.pc is not _Pc.DONE and c.entry is not None and c.entry.is_open}
        shared = coalescer.get(_KEY)
        if len(open_ids) > 1 or (open_ids and (shared is None or shared.id not in open_ids)):
            raise InvariantViolation("shared", f"requests {sorted(open_ids)} in flight at "
                                               f"once, the coalescer shares {shared}")
        if all(c.pc is _Pc.DONE for c in callers) and coalescer.tracked:
            raise InvariantViolation("shared", "every caller finished but the coalescer "
                                               f"still holds {coalescer.tracked} request(s)")
    if "handoff" in checks:
        for c in callers:
            ticket = c.ticket
            if ticket is None:
                continue
            if c.ticket_waiter.is_set and ticket.state is TicketState.QUEUED:
                raise InvariantViolation("handoff", f"{c.name} was woken but its ticket is "
                                                    f"{ticket.state.name}, not admitted")
            if (c.pc is _Pc.QUEUED and ticket.state is TicketState.ADMITTED
                    and not c.ticket_waiter.is_set):
                raise InvariantViolation("handoff", f"{c.name} was admitted by hand-off but "
                                                    "never woken")
            if (c.pc is _Pc.TURN and queue is not None and queue.turn(ticket)
                    and not c.turn_waiter.is_set):
                raise InvariantViolation("handoff", f"{c.name}'s turn to return came but it "
                                                    "was never woken")
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
            ticket = c.ticket
            if ticket is not None and ticket.state not in (TicketState.RELEASED,
                                                           TicketState.ABANDONED):
                raise InvariantViolation("cleanup", f"{c.name} finished but its ticket is "
                                                    f"left {ticket.state.name}")
            if (c.entry is not None and c.entry.state is not RequestState.CLEANED
                    and not any(d.pc is not _Pc.DONE and d.entry is c.entry for d in callers)):
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
