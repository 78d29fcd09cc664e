"""The interleaving explorer's events: which are enabled in a world, and executing one
(each call into the queue or the request map is its own step).
"""

from __future__ import annotations

from ctlwire.kernel.core.request_registry import PendingRequest, ReplyDisposition
from ctlwire.kernel.errors import EngineDead, NotDelivered
from ctlwire.kernel.primitives.admission_gate import HandOffWaiter
from ctlwire.states import RequestState, TicketState
from ctlwire.testing.interleaving._scenario import (
    _ENGINE_INCARNATION,
    _KEY,
    _METHOD,
    _NIL,
    CancelMode,
    InvariantViolation,
    ReplayError,
    ReplyMode,
)
from ctlwire.testing.interleaving._world import (
    _HOLDING,
    _RUNNING,
    _STEP,
    _Caller,
    _Flag,
    _Pc,
    _World,
)
from ctlwire.transports.envelope import ErrorInfo, Reply

_ADMITTED_STATES = (TicketState.ADMITTED, TicketState.STARTED, TicketState.DECIDED)

# -- enabled events ---------------------------------------------------------------------------


def _enabled(w: _World) -> list[str]:
    """Every event that can happen next, in a fixed order."""
    out: list[str] = []
    now: list[str] = []
    multi = w.scenario.ranks > 1
    first = ("arrive" if w.queue is not None
             else "join" if w.coalescer is not None else "register")
    callers = w.callers
    settling: list[str] | None = None  # (reduce) a decided holder's own events
    for i, c in enumerate(callers):
        pc, spec, name = c.pc, c.spec, c.name
        mark = len(out)
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
        elif pc is _Pc.TURN:
            if c.turn_waiter.is_set or c.deadline_fired:
                out.append(f"turn {name}")
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
        if spec.timeout and not c.deadline_fired and pc in (_Pc.QUEUED, _Pc.WAITING, _Pc.TURN):
            out.append(f"timeout {name}")
        if spec.cancel is not CancelMode.NEVER and (pc is _Pc.QUEUED or pc in _RUNNING):
            ticket = c.ticket
            state = None if ticket is None else ticket.state
            if (spec.cancel is CancelMode.ANY
                    or (spec.cancel is CancelMode.QUEUED and state is TicketState.QUEUED)
                    or (spec.cancel is CancelMode.ADMITTED
                        and (state in _ADMITTED_STATES or w.queue is None))):
                out.append(f"cancel {name}")
        if spec.raises and pc in (_Pc.REGISTER, _Pc.SEND, _Pc.WAITING):
            out.append(f"raise {name}")
        if (w.reduce and settling is None and pc in _HOLDING and c.entry is not None
                and not c.entry.is_open and c.ticket is not None
                and c.ticket.state is TicketState.DECIDED
                and f"{_STEP[pc]} {name}" in out[mark:]):
            # with the reduction, a decided holder that passed the mailbox on settles
            # (reads its outcome, is cancelled or raises, finishes) before anything
            # else, once it can (not while it waits for its turn)
            settling = [e for e in out[mark:] if not e.startswith(("reply ", "dup "))]
    if w.scenario.engine_loss and any(c.pc is not _Pc.DONE for c in w.callers):
        rank = w.scenario.ranks - 1
        if rank not in w.unplugged:
            out.append(f"unplug {rank}")
        if rank not in w.lost:
            out.append(f"lose {rank}")
    if now:
        return now[:1]
    if settling:
        return settling
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


def _wake(w: _World, entry: PendingRequest | None) -> str:
    """What the shells' ``_wake`` does: set the entry's waiter, if it still has one
    (a queueing holder's :class:`HandOffWaiter` passes its slot on when the entry
    is decided). Returns what the hand-off did, for the trace."""
    if entry is None or entry.waiter is None:
        return ""
    queue = w.queue
    if queue is None:
        entry.waiter.set()
        return ""
    admitted, in_flight = queue.admitted_total, queue.in_flight
    entry.waiter.set()
    return _handed(w, admitted, in_flight)


def _handed(w: _World, admitted_before: int, in_flight_before: int) -> str:
    """The trace of a hand-off: whom the mailbox went to, or that it is free."""
    queue = w.queue
    assert queue is not None
    if queue.admitted_total > admitted_before:
        last = queue.admitted()[-1]
        owner = next((d.name for d in w.callers if d.ticket is last), "?")
        return f"; hands the mailbox to {owner}"
    if in_flight_before and not queue.in_flight:
        return "; the mailbox is free"
    return ""


def _start(w: _World, c: _Caller) -> str:
    """What ``issue`` does once ``send_all`` returned, for a queueing holder: it
    started (the next caller may be admitted), and the request's decision passes
    its slot on (its hand-off waiter is registered, or set at once when the request
    was decided while it sent)."""
    queue, ticket, entry = w.queue, c.ticket, c.entry
    if queue is None or ticket is None or entry is None or ticket.state is not TicketState.ADMITTED:
        return ""
    before = queue.admitted_total, queue.in_flight
    admitted = queue.start(ticket)
    if admitted is not None:
        admitted.waiter.set()
    hand_off = HandOffWaiter(queue, ticket, c.entry_waiter)
    if entry.is_open:
        entry.waiter = hand_off
    else:
        hand_off.set()
    return "; started" + _handed(w, *before)


def _set_outcome(w: _World, c: _Caller, outcome: str) -> None:
    if c.outcome is not None:
        _fail(w, "outcomes", f"{c.name} got a second outcome {outcome!r} after {c.outcome!r}")
        return
    c.outcome = outcome
    entry = c.entry
    # (a watcher that joined also times out with the request, at its starter's deadline)
    if outcome == "timed-out" and not c.deadline_fired and not (
            not c.started and entry is not None and entry.state is RequestState.TIMED_OUT):
        _fail(w, "outcomes", f"{c.name} timed out though its deadline never passed")
    if outcome == "result" and (entry is None or not entry.replies):
        _fail(w, "outcomes", f"{c.name} returned a result without any reply")
    if outcome == "failed" and (entry is None or not entry.errors):
        _fail(w, "outcomes", f"{c.name} failed without any failed rank")


def _turn_or_outcome(w: _World, c: _Caller) -> str:
    """``issue`` once the request is decided (or its deadline passed): a queueing
    holder returns only in its turn (every caller admitted before it returned), or
    times out at its deadline; it waits for its turn on its ticket's waiter."""
    queue, ticket = w.queue, c.ticket
    if queue is None or ticket is None or queue.turn(ticket):
        return _read_outcome(w, c)
    if c.deadline_fired:
        _set_outcome(w, c, "timed-out")
        c.pc = _Pc.FINISH
        return "not its turn and its deadline passed: times out"
    c.turn_waiter = _Flag()
    ticket.turn_waiter = c.turn_waiter
    c.pc = _Pc.TURN
    first = next((d.name for d in w.callers if d.ticket is queue.next_out()), "?")
    return f"waits for its turn ({first} has not returned)"


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
    if outcome != "timed-out" and w.queue is not None and c.name in w.admitted:
        earlier = [n for n in w.admitted[:w.admitted.index(c.name)]
                   if w.by_name[n].pc is not _Pc.DONE]
        if earlier:
            _fail(w, "order", f"{c.name} returned its outcome while {earlier[0]}, admitted "
                              "before it, had not returned")
    _set_outcome(w, c, outcome)
    c.pc = _Pc.FINISH
    return f"outcome {outcome} ({state.name})"


def _finish(w: _World, c: _Caller) -> str:
    """The shells' ``finally``: release the entry (a watcher: and tell the
    coalescer), leave the mailbox, wake the ticket admitted by hand-off and the
    holder whose turn to leave came."""
    handed = ""
    entry = c.entry
    if entry is not None:
        if w.coalescer is not None:
            handed = _abandon_unsent(w, c, entry)
        w.registry.release(entry)
        if w.coalescer is not None:
            w.coalescer.done(_KEY, entry)
    queue = w.queue
    admitted = out = None
    if queue is not None and c.ticket is not None:
        admitted = queue.leave(c.ticket)
        out = queue.next_out()
    c.pc = _Pc.DONE
    if admitted is not None:
        owner = next((d for d in w.callers if d.ticket is admitted), None)
        if owner is None:
            raise InvariantViolation("crash", f"{c.name}'s finish handed the mailbox to an "
                                              f"unknown ticket {admitted!r}")
        waiter = admitted.waiter
        if waiter is None:
            raise InvariantViolation("crash", f"ticket of {owner.name} has no waiter to wake")
        waiter.set()
        handed += f"; hands the mailbox to {owner.name}"
    if out is not None and out.turn_waiter is not None:
        out.turn_waiter.set()
        turn = next((d for d in w.callers if d.ticket is out and d.pc is _Pc.TURN), None)
        if turn is not None:
            handed += f"; {turn.name}'s turn"
    return f"finished{handed}"


def _abandon_unsent(w: _World, c: _Caller, entry: PendingRequest) -> str:
    """What a watching starter's ``finally`` does when it leaves others waiting on a
    request it has not sent to every rank: those ranks fail NotDelivered."""
    if not (c.started and entry.is_open and entry.refs > 1):
        return ""
    decided = False
    for rank in entry.outstanding():
        if rank not in entry.sent_ranks:
            decided = w.registry.rank_failed(
                entry, rank, NotDelivered(rank, "not sent: its sender left")) or decided
    return "; unsent ranks fail" + (_wake(w, entry) or " (decided)" if decided else "")


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
    handed = ""
    if disposition is ReplyDisposition.COMPLETED:
        handed = _wake(w, found)
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
    return f"{what} -> {disposition.name}{handed}"


def _send(w: _World, c: _Caller) -> str:
    """One turn of ``send_all``: its first plans the ranks (``plan_sends``), each hands
    one planned rank's frame over (and reports it sent) or has it refused; the one
    after which nothing is left to send (the last rank, or the request decided) also
    does what ``issue`` does next without an await: a queueing holder starts
    (:func:`_start`). Once no rank is left, ``send_all``'s tail and the start of
    ``wait_outcome``."""
    registry = w.registry
    entry = c.entry
    assert entry is not None
    if c.plan is None:
        c.plan = registry.plan_sends(entry, w.liveness.is_lost)
    while c.plan and c.plan[0] in entry.errors:
        c.plan.pop(0)  # lost since the plan (the shell sends the plan at once: never)
    if not c.plan or not entry.is_open:
        c.plan = []
        started = _start(w, c)
        handed = _wake(w, entry) if not entry.is_open and w.queue is None else ""
        if registry.awaiting(entry) or entry.is_open:
            c.pc = _Pc.WAITING
            return f"nothing left to send{started}{handed}; waits ({entry.state.name})"
        return f"nothing left to send{started}{handed}; " + _turn_or_outcome(w, c)
    rank = c.plan.pop(0)
    if rank in w.unplugged:
        what = f"frame to rank {rank} refused (unroutable)"
        if registry.rank_failed(entry, rank, EngineDead(rank, "unroutable")):
            what += f" -> {entry.state.name}" + _wake(w, entry)
        else:
            what += f" -> {entry.state.name}"
    else:
        c.frames[rank] = entry.id
        live = w.registry.get(entry.id)
        if live is not entry or live.state is RequestState.REGISTERED:
            where = "not in the request map" if live is None else live.state.name
            _fail(w, "registry", f"{c.name}'s frame to rank {rank} left before its entry was "
                                 f"registered and marked Sent ({where})")
        last = w.last_sent.get(rank)
        if (last is not None and c.name in w.admitted
                and w.admitted.index(last) > w.admitted.index(c.name)):
            _fail(w, "order", f"{c.name}'s frame to rank {rank} went out after {last}'s, "
                              f"who was admitted after {c.name}")
        w.last_sent[rank] = c.name
        registry.sent(entry, rank)
        what = f"frame to rank {rank} handed to the transport"
    if not c.plan or not entry.is_open:
        what += _start(w, c)
    return what


def _join(w: _World, c: _Caller) -> str:
    """A watching fan-out's first steps: join the request in flight (retain it; its
    wait starts with ``awaiting``), or register one and start sending it."""
    coalescer = w.coalescer
    assert coalescer is not None
    registry = w.registry
    w.arrivals.append(c.name)
    entry, started = coalescer.share(_KEY, lambda: registry.register(
        _METHOD, w.ranks, w.scenario.policy, deadline=1.0, timeout=1.0, waiter=c.entry_waiter))
    c.entry, c.started = entry, started
    if started:
        c.pc = _Pc.SEND
        return "starts a request"
    if not entry.is_open:
        _fail(w, "shared", f"{c.name} joined {_who(w, entry.id)}, already {entry.state.name}")
    registry.retain(entry)
    waiter = entry.waiter
    assert isinstance(waiter, _Flag)
    c.entry_waiter = waiter  # the request's shared event
    registry.awaiting(entry)
    c.pc = _Pc.WAITING
    return f"joins {_who(w, entry.id)} ({entry.state.name})"


def _execute(w: _World, label: str) -> str:
    verb, _, arg = label.partition(" ")
    if verb in ("unplug", "lose"):
        rank = int(arg)
        if verb == "unplug":
            w.unplugged.add(rank)
            return f"sends to rank {rank} fail from now on"
        w.lost.add(rank)
        decided = w.registry.fail_rank(rank, lambda r: EngineDead(r, "lost"),
                                       lambda r: EngineDead(r, "lost"))
        handed = "".join([_wake(w, entry) for entry in decided])
        names = [_who(w, e.id) for e in decided]
        return f"rank {rank} declared lost; decided {names or 'nothing'}{handed}"
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
    queue = w.queue
    if verb == "arrive":
        assert queue is not None
        w.arrivals.append(name)
        c.ticket = queue.arrive(c.ticket_waiter)
        if c.ticket.state is TicketState.ADMITTED:
            c.pc = _Pc.RESUME
            return "admitted at once"
        c.pc = _Pc.QUEUED
        return f"queued (depth {queue.depth})"
    if verb == "resume":
        ticket = c.ticket
        assert queue is not None and ticket is not None
        if c.pc is _Pc.QUEUED and ticket.state is not TicketState.ADMITTED:
            state = ticket.state.name
            if not c.deadline_fired:
                _fail(w, "handoff", f"{name} was woken but its ticket is {state}, not "
                                    "admitted (the shell raises a spurious RequestTimedOut)")
            _set_outcome(w, c, "timed-out")
            return f"not admitted ({state}): times out; " + _finish(w, c)
        queue.resumed(ticket)
        c.pc = _Pc.REGISTER
        return "resumes holding the mailbox"
    if verb == "register":
        if c.pc is _Pc.NEW:  # no mailbox: the call starts here
            w.arrivals.append(name)
        # a queueing holder registers its hand-off waiter once it started (_start)
        waiter = c.entry_waiter if queue is None or c.ticket is None else None
        c.entry = w.registry.register(_METHOD, w.ranks, w.scenario.policy, deadline=1.0,
                                      timeout=1.0, waiter=waiter)
        c.pc = _Pc.SEND
        return "registered"
    if verb == "join":
        return _join(w, c)
    if verb == "send":
        return _send(w, c)
    if verb == "wake":
        held = c.entry
        assert held is not None
        if held.is_open and c.deadline_fired:
            if c.started:
                w.registry.expire(held)
                if w.coalescer is not None:  # the reaper wakes every watcher
                    return f"expires it{_wake(w, held)}; " + _read_outcome(w, c)
            else:  # a joiner's own deadline: it stops waiting alone
                _set_outcome(w, c, "timed-out")
                c.pc = _Pc.FINISH
                return f"its own deadline passed; times out alone ({held.state.name})"
        return _turn_or_outcome(w, c)
    if verb == "turn":
        ticket = c.ticket
        assert queue is not None and ticket is not None
        if queue.turn(ticket):
            return "its turn: " + _read_outcome(w, c)
        if not c.deadline_fired:
            _fail(w, "handoff", f"{name} was woken for its turn but a caller admitted "
                                "before it has not returned")
        _set_outcome(w, c, "timed-out")
        c.pc = _Pc.FINISH
        return "not its turn and its deadline passed: times out"
    if verb == "finish":
        return _finish(w, c)
    raise ReplayError(f"unknown event {label!r}")
