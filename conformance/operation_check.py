"""The conformance harness's cases for an engine's operation ledger (``docs/protocol.md``,
Operations: the ledger's messages): ``ctlwire.step`` with the step methods a
conformance engine's ledger runs (``mark(x)`` returns ``x``; ``hold(s)`` returns ``s``
after ``s`` seconds), ``ctlwire.take_over``, ``ctlwire.last_operation`` and
``ctlwire.step_methods``, and every ledger row of the error table.

Each case uses an operation of its own and fencing tokens newer than any sent before
(a step's request carries its token, which the engine's request fence checks too). The
engine under test dials the harness: it has no routes, and the request's ``client``
field names its one client, the owner of the operations it begins.
"""

from __future__ import annotations

import secrets
from typing import Any

from ctlwire.conformance.report import CODEC, Report
from ctlwire.conformance.wire import OTHER_INC, HarnessClient
from ctlwire.transports.envelope import Reply

__all__ = ["OPERATION_CASES", "OPERATION_LANE_CASES", "OPERATION_ONE_AT_A_TIME_CASES",
           "check_operations"]

_OPS = "operations-the-ledgers-messages"

OPERATION_CASES: tuple[str, ...] = (
    f"{_OPS}/step-applied",
    f"{_OPS}/step-methods",
    f"{_OPS}/successor-replays-applied-step",
    f"{_OPS}/last-operation",
    "error-codes/404-UnknownStepMethod",
    "error-codes/422-InvalidStep",
    "error-codes/425-StepOutOfOrder",
    "error-codes/412-StepNotApplied",
    "error-codes/410-OperationAborted",
    "error-codes/403-OperationOwned",
    f"{_OPS}/without-routes-the-client-field-is-the-owner",
    "error-codes/409-StepInFlight",
    f"{_OPS}/one-at-a-time-take-over-after-step",
    f"{_OPS}/take-over",
    f"{_OPS}/take-over-older-fence-refused",
)
#: of an engine that receives while a step runs
OPERATION_LANE_CASES = frozenset({"error-codes/409-StepInFlight"})
#: of an engine that runs one request at a time
OPERATION_ONE_AT_A_TIME_CASES = frozenset({f"{_OPS}/one-at-a-time-take-over-after-step"})


class _Steps:
    """Sends ``ctlwire.step`` requests of one operation."""

    def __init__(self, engine: HarnessClient) -> None:
        self.engine = engine
        self.client = engine.client
        self.op = f"op-{secrets.token_hex(4)}"

    def send(self, step: str, phase: str = "apply", *, index: int = 0, method: str = "mark",
             args: Any = None, fence: int | None = None, key: str | None = None,
             client: int | None = None, id_client: int | None = None) -> int:
        """Send a step; ``client``: the request's ``client`` field, ``id_client``: the
        client incarnation its id carries (default: the same)."""
        engine = self.engine
        client = self.client if client is None else client
        fence = engine.fence() if fence is None else fence
        own_key = f"{self.op}:{step}" + (":undo" if phase == "compensate" else "")
        payload = {"op": self.op, "step": step, "phase": phase, "fence": fence,
                   "key": own_key if key is None else key, "method": method, "args": args,
                   "index": index, "ranks": [engine.rank]}
        return engine.send_request("ctlwire.step", payload, key=payload["key"], fence=fence,
                                   client=client, request_id=engine.new_id(
                                       client if id_client is None else id_client))

    def call(self, step: str, phase: str = "apply", **kw: Any) -> Reply | None:
        return self.engine.reply(self.send(step, phase, **kw))


def check_operations(engine: HarnessClient, report: Report) -> None:
    """Every ledger case against ``engine``; the cases of the serving model it does not
    follow are reported skipped."""
    expect = engine.expect_error
    ops = _Steps(engine)
    applied = ops.call("s0", args="a")
    report.add(f"{_OPS}/step-applied", applied is not None and applied.ok
               and CODEC.decode_value(applied.result) == "a",
               repr(applied.error if applied else None))
    methods = engine.call("ctlwire.step_methods")
    report.add(f"{_OPS}/step-methods", methods is not None and methods.ok
               and sorted(CODEC.decode_value(methods.result)) == ["hold", "mark"],
               repr(CODEC.decode_value(methods.result) if methods and methods.ok else methods))
    # a successor (another client, a newer token) repeating an applied step: its recorded
    # result, not a second run
    again = ops.call("s0", args="b", client=OTHER_INC)
    last = engine.call("ctlwire.last_operation")
    view = CODEC.decode_value(last.result) if last is not None and last.ok else {}
    report.add(f"{_OPS}/successor-replays-applied-step", again is not None and again.ok
               and CODEC.decode_value(again.result) == "a" and view.get("applied") == ["s0"],
               f"{again.error if again else None}; applied {view.get('applied')}")
    report.add(f"{_OPS}/last-operation", view.get("op") == ops.op
               and view.get("steps") == ["s0"] and view.get("ranks") == [engine.rank]
               and view.get("fence", 0) > 0 and view.get("highest_fence", 0) >= view["fence"],
               repr(view))

    expect(report, "error-codes/404-UnknownStepMethod",
           _Steps(engine).call("s0", method="nope"), "UnknownStepMethod", 404)
    expect(report, "error-codes/422-InvalidStep",
           _Steps(engine).call("s0", "sideways"), "InvalidStep", 422)
    expect(report, "error-codes/425-StepOutOfOrder",
           _Steps(engine).call("s1", index=1), "StepOutOfOrder", 425)
    expect(report, "error-codes/412-StepNotApplied",
           _Steps(engine).call("s0", "compensate"), "StepNotApplied", 412)
    aborted = _Steps(engine)
    aborted.call("s0")
    aborted.call("s0", "compensate")
    expect(report, "error-codes/410-OperationAborted", aborted.call("s1", index=1),
           "OperationAborted", 410)
    owned = _Steps(engine)
    token = engine.fence()
    owned.call("s0", fence=token)
    expect(report, "error-codes/403-OperationOwned",
           owned.call("s1", index=1, fence=token, client=OTHER_INC), "OperationOwned", 403)

    # the owner is the request's client field (an engine without routes), not its id
    mine = _Steps(engine)
    token = engine.fence()
    mine.call("s0", fence=token)
    own = mine.call("s1", index=1, fence=token, id_client=OTHER_INC)
    other = mine.call("s2", index=2, fence=token, client=OTHER_INC, id_client=engine.client)
    report.add(f"{_OPS}/without-routes-the-client-field-is-the-owner",
               own is not None and own.ok and other is not None and other.error is not None
               and other.error.type == "OperationOwned",
               f"own client field: {own.error if own else None}; another: "
               f"{other.error if other else None}")

    # a take-over while a step runs: an engine that receives meanwhile refuses it (ask
    # again); one that runs one request at a time reads it after the step, and accepts it
    held = _Steps(engine)
    running = held.send("s0", method="hold", args=0.6)
    engine.idle(0.1)  # the step starts meanwhile
    token = engine.fence()
    asked = engine.send_request("ctlwire.take_over", {"fence": token})
    probe = engine.send_request("ctlwire.metrics")
    engine.reply(running)
    answer = engine.reply(asked)
    engine.reply(probe)
    if engine.before(probe, running):  # it received while the step ran
        engine.skip_other_model(report, OPERATION_ONE_AT_A_TIME_CASES)
        if answer is not None and not engine.before(asked, running):
            report.add("error-codes/409-StepInFlight", False,
                       "the take-over was answered only once the step returned")
        else:
            expect(report, "error-codes/409-StepInFlight", answer, "StepInFlight", 409)
    else:
        engine.skip_other_model(report, OPERATION_LANE_CASES)
        view = CODEC.decode_value(answer.result) if answer is not None and answer.ok else {}
        report.add(f"{_OPS}/one-at-a-time-take-over-after-step",
                   view.get("highest_fence") == token and engine.before(running, asked),
                   repr(answer.error if answer is not None and answer.error else view))
    successor = engine.fence()
    taken = engine.call("ctlwire.take_over", {"fence": successor})
    view = CODEC.decode_value(taken.result) if taken is not None and taken.ok else {}
    report.add(f"{_OPS}/take-over", view.get("highest_fence") == successor,
               repr(taken.error if taken is not None and taken.error else view))
    expect(report, f"{_OPS}/take-over-older-fence-refused",
           engine.call("ctlwire.take_over", {"fence": successor - 1}), "Fenced", 409)
