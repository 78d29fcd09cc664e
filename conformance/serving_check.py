"""The conformance harness's cases that depend on how an engine serves
(``docs/protocol.md``, What an engine does with a request: lanes, or one at a time).

An engine either receives while a request runs (its requests wait and run in lanes)
or runs one request at a time on its receiving thread. The harness sees which
(:func:`check_serving_model`: is ``ctlwire.metrics``, a read-only built-in, answered
while ``sleep`` runs?), holds the engine to that model's rules and reports the other
model's cases (:data:`LANE_CASES`, :data:`ONE_AT_A_TIME_CASES`) as skipped.
"""

from __future__ import annotations

import secrets
import time

from ctlwire.conformance.operation_check import (
    OPERATION_LANE_CASES,
    OPERATION_ONE_AT_A_TIME_CASES,
)
from ctlwire.conformance.report import CODEC, Report
from ctlwire.conformance.wire import HarnessClient

__all__ = ["LANE_CASES", "ONE_AT_A_TIME_CASES", "SERVING_CASES", "check_serving"]

_ORDER = "what-an-engine-does-with-a-request"
#: requests sent at once behind a held lane: more than a connection may queue (64)
_FLOOD = 300

#: every case of this module, in the order they run
SERVING_CASES: tuple[str, ...] = (
    f"{_ORDER}/serving-model",
    "error-codes/425-InProgress",
    f"{_ORDER}/8-in-progress-before-payload",
    "idempotency-keys/one-at-a-time-repeat-gets-recorded-outcome",
    "error-codes/429-Busy",
    f"{_ORDER}/busy-engine-keeps-receiving",
    "deadlines/checked-when-it-starts",
    f"{_ORDER}/one-method-in-arrival-order",
    f"{_ORDER}/methods-run-concurrently",
)
#: cases of an engine that receives while a request runs (skipped for one that runs one
#: request at a time)
LANE_CASES: frozenset[str] = frozenset({
    "error-codes/425-InProgress", f"{_ORDER}/8-in-progress-before-payload",
    "error-codes/429-Busy", f"{_ORDER}/busy-engine-keeps-receiving",
    f"{_ORDER}/methods-run-concurrently", *OPERATION_LANE_CASES})
#: cases of an engine that runs one request at a time (skipped for one that receives
#: while a request runs)
ONE_AT_A_TIME_CASES: frozenset[str] = frozenset({
    "idempotency-keys/one-at-a-time-repeat-gets-recorded-outcome",
    *OPERATION_ONE_AT_A_TIME_CASES})


def check_serving(engine: HarnessClient, report: Report) -> None:
    """Every case of this module against ``engine``, its serving model first."""
    for case in (check_serving_model, check_in_progress, check_busy, check_deadline_at_start):
        case(engine, report)


def check_serving_model(engine: HarnessClient, report: Report) -> None:
    """Does the engine receive while a request runs (is ``ctlwire.metrics``, a
    read-only built-in, answered while ``sleep`` runs), or does it run one request
    at a time? Either is allowed; the cases that depend on it follow its answer."""
    running = engine.send_request("sleep", 0.6)
    engine.idle(0.1)
    probe = engine.send_request("ctlwire.metrics")
    first, answered = engine.reply(running), engine.reply(probe)
    engine.receiving = engine.before(probe, running)
    report.add(f"{_ORDER}/serving-model", first is not None and first.ok
               and answered is not None and answered.ok, engine.serving_model)


def check_in_progress(engine: HarnessClient, report: Report) -> None:
    """A keyed request repeated while its first run runs: an engine that receives
    meanwhile refuses it ``InProgress`` at once (before the first run's reply); one
    that runs one request at a time reads it after the first run and answers the
    recorded outcome."""
    key = f"slow-{secrets.token_hex(4)}"
    first = engine.send_request("sleep", 1.0, key=key)
    engine.idle(0.1)
    repeat = engine.send_request("sleep", 1.0, key=key)
    bad_payload = engine.send_request("sleep", "not a number", key=key)
    probe = engine.send_request("ctlwire.metrics")
    done = engine.reply(first)
    again, refused = engine.reply(repeat), engine.reply(bad_payload)
    engine.reply(probe)
    if engine.before(probe, first):  # it received while the first ran
        engine.skip_other_model(
            report, {"idempotency-keys/one-at-a-time-repeat-gets-recorded-outcome"})
        for name, reply, rid in (("error-codes/425-InProgress", again, repeat),
                                 (f"{_ORDER}/8-in-progress-before-payload", refused,
                                  bad_payload)):
            if reply is not None and not engine.before(rid, first):
                report.add(name, False, "answered only once the first run ended: "
                           f"{reply.error.type if reply.error else 'ok'}")
            else:
                engine.expect_error(report, name, reply, "InProgress", 425)
        return
    engine.skip_other_model(report, {"error-codes/425-InProgress",
                                     f"{_ORDER}/8-in-progress-before-payload"})
    outcome = engine.value(done)
    ok = all(r is not None and r.ok and CODEC.decode_value(r.result) == outcome
             for r in (again, refused)) and engine.before(first, repeat)
    report.add("idempotency-keys/one-at-a-time-repeat-gets-recorded-outcome", ok,
               f"first {outcome!r}; repeats {again!r:.80}, {refused!r:.80}")


def check_busy(engine: HarnessClient, report: Report) -> None:
    """A flood of one method on one connection while its lane is held: each request
    is answered, run or refused Busy (429) at once, and the engine keeps receiving
    (another method is answered before the lane frees). An engine that runs one
    request at a time queues nothing: it never answers Busy."""
    if not engine.receiving:
        engine.skip_other_model(report, {"error-codes/429-Busy",
                                         f"{_ORDER}/busy-engine-keeps-receiving"})
        return
    held = engine.send_request("sleep", 1.0)
    flood = [engine.send_request("sleep", 0.0) for _ in range(_FLOOD)]
    other = engine.reply(engine.send_request("echo", "meanwhile"), timeout=0.8)
    replies = [engine.reply(rid) for rid in flood]
    busy = [r for r in replies if r is not None and not r.ok]
    refused = busy[0] if busy else None
    if refused is None:
        report.add("error-codes/429-Busy", False,
                   f"{_FLOOD} requests queued behind a held lane, none refused Busy")
    else:
        engine.expect_error(report, "error-codes/429-Busy", refused, "Busy", 429)
    report.add(f"{_ORDER}/busy-engine-keeps-receiving",
               other is not None and other.ok and all(
                   r is not None and (r.ok or (r.error is not None
                                               and r.error.code == 429)) for r in replies),
               "echo answered while the lane was full" if other is not None else
               "echo not answered while the lane was full (the engine stopped receiving)")
    engine.reply(held)


def check_deadline_at_start(engine: HarnessClient, report: Report) -> None:
    """Requests of one method start in arrival order, one at a time, and a queued one's
    deadline is checked when it starts; other methods run meanwhile."""
    busy = engine.send_request("sleep", 0.4)
    queued = engine.send_request("sleep", 0.0)
    late = engine.send_request("sleep", 0.0, deadline=time.time() + 0.2)
    other = engine.call("echo", "meanwhile")
    engine.expect_error(report, "deadlines/checked-when-it-starts", engine.reply(late),
                      "DeadlineExpired", 408)
    first, second = engine.reply(busy), engine.reply(queued)
    times = [engine.arrived.get(i, 0.0) for i in (busy, queued, late)]
    report.add(f"{_ORDER}/one-method-in-arrival-order", first is not None and first.ok
               and second is not None and second.ok and times == sorted(times),
               "replies in the order sent" if times == sorted(times) else "out of order")
    if not engine.receiving:
        engine.skip_other_model(report, {f"{_ORDER}/methods-run-concurrently"})
        return
    report.add(f"{_ORDER}/methods-run-concurrently", other is not None and other.ok
               and engine.arrived.get(other.id, 1e18) < engine.arrived.get(busy, 0.0),
               "echo answered while sleep ran")
