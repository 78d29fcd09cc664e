"""Exhaustive interleaving checks of the request registry and the queueing fan-out mailbox.

Both production bugs ctlwire exists to prevent were ordering bugs: FastDeploy
registered a reply slot after sending (a fast reply found no slot), SGLang let a
caller arriving in the wake-up window overtake a queued one. Neither shows up
in ordinary tests; both show up in *some* interleaving. This package enumerates
all of them, up to a bound.

A :class:`Scenario` names k callers (k <= 4) of one queueing fan-out mailbox to
1 or 2 ranks (its pipeline ``depth``: up to 4 requests in flight) and, per
caller, which events may happen to it (:class:`CallerSpec`): its reply
arriving, arriving twice, arriving only late (after its deadline) or never;
its deadline passing; its cancellation (while queued, after admission, or
both); the admitted holder raising. Optionally an
engine rank becomes unroutable and/or is declared lost by liveness; optionally
there is no mailbox (concurrent ``call``/``fan_out``: several requests in the
registry at once), or the callers watch: they share requests through a
:class:`~ctlwire.kernel.primitives.coalescer.Coalescer` (``join``: start one, or
join the one in flight), as watching fan-outs do. Every such event is
*optional*: an exploration covers the paths where it fires at every possible
point and the paths where it never fires.

:func:`explore` drives the real cores --
:class:`~ctlwire.kernel.core.admission_queue.AdmissionQueue` (the order of the
public :class:`~ctlwire.kernel.primitives.admission_gate.AdmissionGate`),
:class:`~ctlwire.kernel.core.request_registry.RequestRegistry` and the
:class:`~ctlwire.kernel.primitives.coalescer.Coalescer`, or subclasses of the
first two passed in (the tests plug in deliberately broken ones) -- exactly the
way the anyio shells (the gate, the client's
:class:`~ctlwire.kernel.client.fan_out_mailbox.FanOutMailbox` and
:class:`~ctlwire.kernel.client.control_client.ControlClient`) drive them. Each caller
is a small sequential program of calls into the queue and the request map::

    arrive    queue.arrive(waiter)                 admitted at once, or queued
    resume    (queued: only once its waiter was woken by a hand-off, or its
              deadline passed; not admitted and deadline passed -> timed out)
              queue.resumed(ticket)
    register  registry.register(..., waiter)
    send      the first: registry.plan_sends(entry, is_lost); each: one planned
              rank's frame goes to the transport, registry.sent(entry, rank) (or the
              rank is unroutable: registry.rank_failed); the one after which
              nothing is left to send also does what the shell does next: a
              queueing caller starts (queue.start(ticket): the next caller may be
              admitted) and registers HandOffWaiter(queue, ticket, waiter), so that
              the request's decision (a reply, a lost rank) passes its slot on there
              and then (at once if it was decided while sending); once no rank is
              left: registry.awaiting(entry), and the outcome if nothing is left
              to wait for
    wake      (only once its waiter was woken by a decision, or its deadline
              passed) registry.expire(entry) if still open; read the outcome, or,
              a queueing caller whose turn has not come (queue.turn(ticket): a
              caller admitted before it has not finished), wait for its turn
    turn      (only once woken by the finish of the caller before it, or its
              deadline passed) read the outcome, or time out
    finish    registry.release(entry), queue.leave(ticket); wake the ticket
              admitted by hand-off and the caller whose turn to return came
              (queue.next_out())

(Without a mailbox a caller starts at ``register``, like ``ControlClient.call``.)
The "send" step that finds no rank left does what ``send_all``'s tail and
``wait_outcome``'s start do without an await in between, so a caller's event
list may show ``send A`` once more than it has ranks.

Environment events: ``reply X`` (any time after X's frame went to the
transport, even after X finished), ``dup X`` (the same reply again),
``timeout X`` (X's deadline passes while X waits: queued, awaiting its
outcome or its turn), ``cancel X`` (X jumps to ``finish``: at any step between arriving
and reading its outcome, as allowed by its :class:`CancelMode`), ``raise X``
(the holder raises after resuming and jumps to ``finish``), ``unplug R``
(sends to rank R fail from now on) and ``lose R`` (liveness declares R dead:
``registry.fail_rank``). With two ranks, reply events name the rank:
``reply A@1``. Each call is its own step, so the explorer checks more
interleavings than the shells can produce (they run several steps without an
await in between); that is deliberate -- releasing and leaving are claimed to
be safe at any point, and here they are checked at every point.

Checked after every event (each check has a name; :data:`CHECKS` lists them in
the order a counterexample is preferred when several are equally short):

``fifo``       admission strictly in arrival order among callers still waiting;
               the queue's own invariants.
``exclusive``  at most one ticket admitted to start (sending) and at most
               ``depth`` undecided requests in flight per queueing mailbox, each
               one a holder's (a decided holder's entry may still be in the map
               while the next holder sends: it only reads its outcome, waits for
               its turn and is cleaned up).
``order``      every rank gets the frames in admission order (a frame never goes
               out after one of a caller admitted later), and a caller returns a
               result or a failure only once every caller admitted before it
               finished (a timeout, a cancellation or a raising holder leaves
               at once).
``shared``     (watching) at most one undecided request in flight, the one the
               coalescer shares; a caller joins only an undecided request; once
               every caller finished, the coalescer holds nothing.
``handoff``    a queued caller is woken only once admitted, a caller admitted
               by hand-off is woken, and so is a caller whose turn to return came
               (no lost wake-up).
``registry``   the registry's live entries are exactly the requests held by
               callers that registered and have not finished; a frame leaves only
               for a registered entry already marked Sent; the registry's own
               invariants.
``replies``    a reply for a sent frame is never UNKNOWN or STRAY; the first
               delivery of a reply, before its caller's deadline passed and while
               its caller still waits for that rank, is ACCEPTED or COMPLETED
               (never lost, never "late"); a duplicate is never applied twice.
``outcomes``   every caller ends with exactly one outcome (result, failed,
               timed-out, cancelled, raised); it is read only from a decided
               request; timed-out only after its deadline passed, a result only
               with a reply, failed only with a failed rank.
``cleanup``    tombstones stay within their bound; no more live entries than
               unfinished callers; once every caller finished, no entry, no
               queued ticket and no holder remain, every entry is Cleaned.
``progress``   no path ends with a caller still waiting (a hang).

An exception escaping a core (``IllegalTransition``, an assertion) is reported
as ``crash``. Edge checks (a reply's classification, register-before-send,
admission order) run on every executed event and state checks on every state
reached, including states already seen by another path.

How the search stays small, and what the counts mean:

* **Memoisation.** Each world (the cores plus the callers' program counters)
  is deep-copied before an event is applied to it, and reduced to a canonical
  key: the cores' state (entries, tickets, queue, tombstones, scalar attributes
  of the core objects, which also covers the extra state of subclasses) and
  the callers' local state. A finished caller contributes only its pending
  replies: its ticket, entry and outcome can no longer change, and the checks
  that read them ran on every path into the state. The state graph is acyclic
  (every event makes progress), so a depth-first search memoises the number of
  complete paths below each state: ``interleavings`` counts every complete
  event order, each distinct state is expanded once.
* **Symmetry.** Callers with equal specs are interchangeable until they
  arrive, so they arrive in the order given (A before B ...) and the count is
  multiplied by the permutations of their names: exact, not an estimate.
* **Reduction** (``explore(..., reduce=True)``, off by default). A reply to a
  caller that already finished touches only its request's tombstone, so it
  commutes with every other event; with the reduction such replies are
  delivered before anything else. Likewise a holder whose request was decided
  and which passed the mailbox on has only its own steps left (the tail of its
  send loop, reading its outcome, being cancelled or raising, its deadline
  passing, finishing): they touch its own state, its decided entry and the
  tombstones (a reply to that request is classified late or duplicate alike
  before and after the entry is released, and leaves the same tombstone), so
  with the reduction they come before anything else but the replies above.
  ``interleavings`` then counts one representative per class of equivalent
  orders. What it gives up: a late reply arriving *after* its tombstone was
  evicted (classified through the id allocator instead), and orders in which a
  decided holder is cleaned up only after later callers' events (its entry
  still in the map next to the next holder's, tombstones in another order),
  are only explored without the reduction.
* The cyclic garbage collector is paused while exploring (worlds hold no
  reference cycle, so refcounting frees them at once). Cores must not keep
  closures over mutable state: functions are shared between copies (bound
  methods are re-bound to the copy).

When a check fails, a breadth-first search over the full model (no reduction)
finds a *shortest* failing event sequence -- among equally short ones, the
first of the most preferred check -- and prints it as a list of strings that
:func:`replay` re-runs deterministically, raising the same
:class:`InvariantViolation`.

::

    result = explore(Scenario.uniform(3, EVERY_KIND))
    print(result.summary())          # interleavings, states, transitions, seconds
    if result.counterexample:
        print(result.counterexample.format())   # events = ["arrive A", ...]
    replay(Scenario.uniform(3, EVERY_KIND), ["arrive A", "arrive B", "cancel A"])
"""
# The docstring above is the explorer's documentation; the modules behind this
# facade are private, one concern each: _scenario (what to explore, what comes
# back), _world (the cores and callers being explored, copied and keyed), _steps
# (the events), _checks (the invariants), _explorer (the search, replay and the
# command line). The tests reach into them; nothing else should.

from __future__ import annotations

from ctlwire.testing.interleaving._explorer import explore, main, replay
from ctlwire.testing.interleaving._scenario import (
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
    pipelined_scenarios,
    standard_scenarios,
)

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
    "pipelined_scenarios",
    "replay",
    "standard_scenarios",
]
