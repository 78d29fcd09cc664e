"""The conformance harness as a client, checking an engine: a bound ROUTER (raw pyzmq,
NULL security, :class:`~ctlwire.conformance.wire.HarnessClient`) that sends
requests, frames and junk to the engine of one rank and checks its answers against
``docs/protocol.md``.

Every case is named ``SECTION/what``, SECTION being the anchor of the spec's section it
tests (``error-codes/425-InProgress``, ``what-an-engine-does-with-a-request/3-...``);
:data:`ENGINE_CASES` lists them in the order they run. A case that combines several
faults expects the refusal of the first step of the spec's decision order. Replies that
must never come (to id 0, to junk, to a request sent to the beacon) are checked once
at the end, over everything received during the run. The operation ledger's cases are
in :mod:`ctlwire.conformance.operation_check`, those that depend on how
the engine serves (lanes, or one request at a time) in
:mod:`ctlwire.conformance.serving_check`, those about frames in
:mod:`ctlwire.conformance.frame_check`; the cache-full case runs last (a
full idempotency cache refuses new keys for its retention, 600 s).
"""

from __future__ import annotations

import secrets
import time

import msgspec

from ctlwire.conformance.frame_check import FRAME_CASES, check_frames
from ctlwire.conformance.operation_check import OPERATION_CASES, check_operations
from ctlwire.conformance.report import CODEC, CONFORMANCE_ERROR, Report
from ctlwire.conformance.serving_check import (
    LANE_CASES,
    ONE_AT_A_TIME_CASES,
    SERVING_CASES,
    check_serving,
)
from ctlwire.conformance.wire import (
    CLIENT_INC,
    OTHER_INC,
    HarnessClient,
    malformed_frame,
    request_items,
)
from ctlwire.transports.envelope import Reply
from ctlwire.transports.protocol_version import PROTOCOL_VERSION, pack_version, supported_version

__all__ = ["ENGINE_CASES", "LANE_CASES", "ONE_AT_A_TIME_CASES", "CheckEngine"]

INCARNATION_WINDOW_MS = 60_000
_MAJOR_2 = pack_version((PROTOCOL_VERSION >> 8) + 1, 0)
_ORDER = "what-an-engine-does-with-a-request"
_NEVER = 0.3  # seconds of quiet, at the end, for replies that must never come

ENGINE_CASES: tuple[str, ...] = (
    "sockets/first-contact",
    "error-codes/any-handler-exception",
    f"{_ORDER}/11-served-once",
    "error-codes/404-UnknownMethod",
    "error-codes/421-WrongRank",
    "error-codes/408-DeadlineExpired",
    "error-codes/400-MalformedFrame",
    "error-codes/414-KeyTooLong",
    "error-codes/416-FenceOutOfRange",
    "error-codes/409-Fenced",
    "error-codes/422-InvalidPayload",
    "error-codes/505-UnsupportedProtocolVersion",
    "error-codes/413-ReplyTooLarge",
    "error-codes/500-ResultNotEncodable",
    f"{_ORDER}/1-undecodable-before-duplicate",
    f"{_ORDER}/2-duplicate-before-version",
    f"{_ORDER}/3-version-before-rank",
    f"{_ORDER}/4-rank-before-method",
    f"{_ORDER}/5-method-before-deadline",
    f"{_ORDER}/6-deadline-before-fence",
    f"{_ORDER}/6-expired-request-not-run",
    f"{_ORDER}/7-fence-range-before-key",
    f"{_ORDER}/7-stale-fence-before-key",
    f"{_ORDER}/8-key-length-before-payload",
    f"{_ORDER}/8-recorded-outcome-before-payload",
    f"{_ORDER}/9-payload-for-a-method-without-one",
    *SERVING_CASES,
    "fencing-tokens/admitted",
    "fencing-tokens/moves-only-when-validated",
    "fencing-tokens/read-only-methods-ignore-fences",
    "idempotency-keys/replayed-run-once",
    "idempotency-keys/failed-run-recorded",
    "idempotency-keys/read-only-methods-ignore-keys",
    "idempotency-keys/without-routes-the-client-field-is-the-scope",
    "request-ids/salvaged-id-not-seen",
    *FRAME_CASES,
    "operations-the-ledgers-messages/metrics-read-only",
    *OPERATION_CASES,
    "liveness/heartbeats-while-busy",
    "liveness/incarnation-stable",
    "sockets/reconnects-after-drop",
    "error-codes/507-CacheFull",
    f"{_ORDER}/9-payload-before-cache-full",
    f"{_ORDER}/10-cache-full-request-not-run",
    "request-ids/duplicate-answered-once",
    "request-ids/zero-not-answered",
    "request-ids/negative-not-answered",
    f"{_ORDER}/1-unreadable-id-not-answered",
    "sockets/request-to-beacon-ignored",
)


class CheckEngine(HarnessClient):
    """Plays the client (a bound ROUTER) against the engine of ``rank``: every case."""

    # -- the run -------------------------------------------------------------------------
    def run(self, report: Report) -> None:
        if self.first_contact(report):
            for case in (self.served, self.refusals, self.decision_order, self.serving,
                         self.fences, self.keys, self.ids, self.frames, self.metrics,
                         self.operations, self.liveness, self.reconnect, self.cache_full,
                         self.probes):
                try:
                    case(report)
                except Exception as exc:  # a case that broke is a failed case
                    report.add(f"{case.__name__}: broke", False, f"{type(exc).__name__}: {exc}")
            self.idle(_NEVER)
            for check in self._at_end:
                check(report)
        report.missing(ENGINE_CASES)

    def first_contact(self, report: Report) -> bool:
        end = time.monotonic() + max(self.timeout, 20.0)
        while time.monotonic() < end and not self.heartbeats:
            self._take(0.1)
        if not self.heartbeats:
            return report.add("sockets/first-contact", False, "no heartbeat")
        hb = self.heartbeats[0][1]
        self.incarnation = hb.incarnation
        ahead_ms = (hb.incarnation >> 12) - time.time() * 1000
        problems = [p for p, bad in (
            (f"rank {hb.rank}, expected {self.rank}", hb.rank != self.rank),
            (f"version {hb.version:#x} unsupported", not supported_version(hb.version)),
            (f"incarnation {hb.incarnation} is {ahead_ms:.0f} ms ahead",
             ahead_ms > INCARNATION_WINDOW_MS or hb.incarnation <= 0)) if bad]
        return report.add("sockets/first-contact", not problems,
                          "; ".join(problems) or f"heartbeat of incarnation {hb.incarnation}")

    def served(self, report: Report) -> None:
        self.expect_error(report, "error-codes/any-handler-exception", self.call("fail", "boom"),
                          *CONFORMANCE_ERROR)
        payload = {"x": [1, "ü", 1.5, None, True], "big": 2**40, "重み": "🚀"}
        reply = self.call("echo", payload)
        ok = (reply is not None and reply.ok and CODEC.decode_value(reply.result) == payload
              and reply.rank == self.rank and reply.incarnation == self.incarnation)
        report.add(f"{_ORDER}/11-served-once", ok, "" if ok else repr(reply))

    def refusals(self, report: Report) -> None:
        """One row of the error table each, alone."""
        expect = self.expect_error
        expect(report, "error-codes/404-UnknownMethod", self.call("重みを更新_ü_🚀"),
               "UnknownMethod", 404)
        expect(report, "error-codes/421-WrongRank", self.call("echo", 1, rank=self.rank + 1),
               "WrongRank", 421)
        expect(report, "error-codes/408-DeadlineExpired",
               self.call("echo", 1, deadline=time.time() - 5.0), "DeadlineExpired", 408)
        rid = self.new_id()
        bad = malformed_frame(rid, self.rank)
        expect(report, "error-codes/400-MalformedFrame", self.call("", frame=bad, request_id=rid),
               "MalformedFrame", 400)
        expect(report, "error-codes/414-KeyTooLong", self.call("count", key="k" * 257),
               "KeyTooLong", 414)
        expect(report, "error-codes/416-FenceOutOfRange",
               self.call("count", fence=int(time.time() * 1e6) + 86_400_000_000),
               "FenceOutOfRange", 416)
        high = self.fence()
        self.value(self.call("count", fence=high))
        expect(report, "error-codes/409-Fenced", self.call("count", fence=high - 1),
               "Fenced", 409)
        expect(report, "error-codes/422-InvalidPayload", self.call("sleep", "not a number"),
               "InvalidPayload", 422)
        expect(report, "error-codes/505-UnsupportedProtocolVersion",
               self.call("echo", 1, version=_MAJOR_2), "UnsupportedProtocolVersion", 505)
        expect(report, "error-codes/413-ReplyTooLarge", self.call("blob", self.limit),
               "ReplyTooLarge", 413)
        expect(report, "error-codes/500-ResultNotEncodable", self.call("unencodable"),
               "ResultNotEncodable", 500)

    def decision_order(self, report: Report) -> None:
        """Each step's refusal wins over every later step's."""
        expect = self.expect_error
        past = time.time() - 5.0
        answered = self.send_request("echo", 1)
        self.reply(answered)
        bad = malformed_frame(answered, self.rank)
        self.send(bad)
        expect(report, f"{_ORDER}/1-undecodable-before-duplicate", self.nth_reply(answered, 2),
               "MalformedFrame", 400)
        rid = self.new_id()
        twice = msgspec.msgpack.encode(request_items(rid, self.rank, "echo", 1,
                                                     version=_MAJOR_2))
        self.send(twice)
        self.send(twice)

        def once(r: Report) -> None:
            got = [a.error.type if a.error else "ok" for a in self.answers.get(rid, [])]
            r.add(f"{_ORDER}/2-duplicate-before-version",
                  got == ["UnsupportedProtocolVersion"], f"replies: {got}")

        self._at_end.append(once)
        expect(report, f"{_ORDER}/3-version-before-rank",
               self.call("nope", 1, version=_MAJOR_2, rank=self.rank + 1, deadline=past),
               "UnsupportedProtocolVersion", 505)
        expect(report, f"{_ORDER}/4-rank-before-method",
               self.call("nope", 1, rank=self.rank + 1, deadline=past), "WrongRank", 421)
        expect(report, f"{_ORDER}/5-method-before-deadline",
               self.call("nope", 1, deadline=past, fence=-1), "UnknownMethod", 404)
        before = self.count()
        expect(report, f"{_ORDER}/6-deadline-before-fence",
               self.call("count", deadline=past, fence=-1, key="k" * 257),
               "DeadlineExpired", 408)
        after = self.count()
        report.add(f"{_ORDER}/6-expired-request-not-run", after == before + 1,
                   f"count {before} then {after}")
        expect(report, f"{_ORDER}/7-fence-range-before-key",
               self.call("count", 5, fence=-1, key="k" * 257), "FenceOutOfRange", 416)
        high = self.fence()
        self.value(self.call("count", fence=high))
        expect(report, f"{_ORDER}/7-stale-fence-before-key",
               self.call("count", 5, fence=high - 1, key="k" * 257), "Fenced", 409)
        expect(report, f"{_ORDER}/8-key-length-before-payload",
               self.call("count", 5, key="k" * 257), "KeyTooLong", 414)
        key = f"order-{secrets.token_hex(4)}"
        first = self.count(key=key)
        again = self.call("count", 5, key=key)
        report.add(f"{_ORDER}/8-recorded-outcome-before-payload",
                   again is not None and again.ok and CODEC.decode_value(again.result) == first,
                   repr(again.error if again is not None and again.error else again))
        expect(report, f"{_ORDER}/9-payload-for-a-method-without-one", self.call("count", 5),
               "InvalidPayload", 422)

    def fences(self, report: Report) -> None:
        """The fence moves only for a fully validated request of a state-changing method."""
        low = self.fence()
        high = self._last_fence = low + 1000
        refused = self.call("count", 5, fence=high)  # invalid payload: the fence stays
        admitted = self.call("count", fence=low)
        report.add("fencing-tokens/admitted", admitted is not None and admitted.ok,
                   repr(admitted.error if admitted else None))
        report.add("fencing-tokens/moves-only-when-validated",
                   refused is not None and refused.error is not None
                   and refused.error.code == 422 and admitted is not None and admitted.ok,
                   f"{refused.error if refused else None}, then a lower token "
                   f"{'admitted' if admitted is not None and admitted.ok else 'refused'}")
        ahead = self.fence() + 60_000_000
        metrics = self.call("ctlwire.metrics", fence=ahead)
        after = self.call("count", fence=self.fence())
        report.add("fencing-tokens/read-only-methods-ignore-fences",
                   metrics is not None and metrics.ok and after is not None and after.ok,
                   f"metrics {metrics.error if metrics else None}, then "
                   f"{after.error if after else None}")

    def keys(self, report: Report) -> None:
        key = f"conformance-{secrets.token_hex(4)}"
        first, again = self.count(key=key), self.count(key=key)
        plain = self.count()
        report.add("idempotency-keys/replayed-run-once", first == again and plain == first + 1,
                   f"{first}, {again}, then {plain}")
        key = f"failing-{secrets.token_hex(4)}"
        one, two = self.call("fail", "first", key=key), self.call("fail", "second", key=key)
        report.add("idempotency-keys/failed-run-recorded",
                   one is not None and two is not None and one.error is not None
                   and two.error == one.error, f"{two.error if two else None}")
        reply = self.call("ctlwire.metrics", key="k" * 300)
        report.add("idempotency-keys/read-only-methods-ignore-keys",
                   reply is not None and reply.ok, repr(reply.error if reply else None))
        # the engine dials this harness: no routes, its one client named by `client`
        key = f"scope-{secrets.token_hex(4)}"
        mine = self.count(key=key)
        other = self.count(key=key, client=OTHER_INC, request_id=self.new_id(CLIENT_INC))
        again = self.count(key=key, request_id=self.new_id(OTHER_INC))
        report.add("idempotency-keys/without-routes-the-client-field-is-the-scope",
                   other == mine + 1 and again == mine,
                   f"{mine}; another client field {other} (runs); the same client field "
                   f"under another id's incarnation {again} (replayed)")

    def ids(self, report: Report) -> None:
        rid = self.new_id()
        bad = malformed_frame(rid, self.rank)
        first = self.call("", frame=bad, request_id=rid)
        self.send_request("echo", "served", request_id=rid)
        again = self.nth_reply(rid, 2)
        report.add("request-ids/salvaged-id-not-seen",
                   first is not None and first.error is not None and again is not None
                   and again.ok, f"{again!r}")
        dup = self.new_id()
        before = self.count()
        frame = msgspec.msgpack.encode(request_items(dup, self.rank, "count"))
        self.send(frame)
        self.send(frame)
        self.reply(dup)
        after = self.count()

        def once(r: Report) -> None:
            got = len(self.answers.get(dup, []))
            r.add("request-ids/duplicate-answered-once", got == 1 and after == before + 2,
                  f"{got} replies; count {before} then {after}")

        self._at_end.append(once)
        zero = msgspec.msgpack.encode(request_items(0, self.rank, "echo", 1))
        negative = msgspec.msgpack.encode(request_items(-7, self.rank, "echo", 1))
        self.send(zero)
        self.send(negative)
        self.never_answered("request-ids/zero-not-answered", [0], "a request of id 0")
        self.never_answered("request-ids/negative-not-answered", [-7], "a request of id -7")

    def metrics(self, report: Report) -> None:
        reply = self.call("ctlwire.metrics", None, fence=1)  # read-only: the fence is ignored
        report.add("operations-the-ledgers-messages/metrics-read-only",
                   reply is not None and reply.ok)

    def serving(self, report: Report) -> None:
        check_serving(self, report)

    def frames(self, report: Report) -> None:
        check_frames(self, report)

    def operations(self, report: Report) -> None:
        check_operations(self, report)

    def liveness(self, report: Report) -> None:
        """Busy is not dead: heartbeats keep coming while a handler sleeps, and say so."""
        start = time.monotonic()
        reply = self.call("sleep", 1.2)
        during = [hb for t, hb in self.heartbeats if t >= start]
        busy = [hb for hb in during if hb.method == "sleep"]
        report.add("liveness/heartbeats-while-busy", reply is not None and reply.ok
                   and len(during) >= 3 and bool(busy),
                   f"{len(during)} heartbeats, {len(busy)} naming 'sleep'")
        incs = {hb.incarnation for _t, hb in self.heartbeats}
        report.add("liveness/incarnation-stable", incs == {self.incarnation}, f"{len(incs)} seen")

    def reconnect(self, report: Report) -> None:
        """The harness drops the engine's connections (it closes its bound socket) and
        binds again: the engine, the side that connects, reconnects on its own."""
        self.rebind(0.5)
        since = time.monotonic()
        heard = self.heard_after(since, max(self.timeout, 10.0))
        reply = self.call("echo", "reconnected")
        report.add("sockets/reconnects-after-drop", heard and reply is not None and reply.ok
                   and reply.incarnation == self.incarnation,
                   f"{'heard' if heard else 'not heard'} within {max(self.timeout, 10.0):g} s; "
                   f"{'served' if reply is not None and reply.ok else 'not served'}")

    def cache_full(self, report: Report) -> None:
        """New keys until the idempotency cache refuses one (CacheFull); the refused one
        does not run. Last: the cache stays full for its retention."""
        before = self.count()
        ran = 0
        refused: Reply | None = None
        pending: list[int] = []
        for n in range(4200):
            pending.append(self.send_request("count", key=f"fill-{CLIENT_INC}-{n}"))
            if len(pending) < 32 and n < 4199:
                continue
            for rid in pending:
                reply = self.reply(rid)
                if reply is not None and reply.ok:
                    ran += 1
                elif refused is None:
                    refused = reply
            pending.clear()
            if refused is not None:
                break
        self.expect_error(report, "error-codes/507-CacheFull", refused, "CacheFull", 507)
        self.expect_error(report, f"{_ORDER}/9-payload-before-cache-full",
                          self.call("count", 5, key="one-more"), "InvalidPayload", 422)
        after = self.count()
        report.add(f"{_ORDER}/10-cache-full-request-not-run", after == before + ran + 1,
                   f"{ran} keyed runs; count {before} then {after}")

    def probes(self, report: Report) -> None:
        """Frames that must never be answered, checked at the end."""
        for junk in (b"\xc1\xc1", msgspec.msgpack.encode({"id": 1}), b"",
                     msgspec.msgpack.encode(["x", 1, 2]), b"\x93\xa1q"):
            self.send(junk)
        reply = self.call("echo", "still here")
        report.add(f"{_ORDER}/1-unreadable-id-not-answered", reply is not None and reply.ok,
                   "junk frames, then a request answered")
        rid = self.new_id()
        sent = time.monotonic()
        self.send(msgspec.msgpack.encode(request_items(rid, self.rank, "echo", "beacon")),
                  identity=self.beacon_identity)
        served = self.call("echo", "after the beacon")

        def beacon(r: Report) -> None:
            beats = [t for t, _hb in self.heartbeats if t > sent]
            r.add("sockets/request-to-beacon-ignored", not self.answers.get(rid)
                  and served is not None and served.ok and bool(beats),
                  f"{len(self.answers.get(rid, []))} replies; {len(beats)} heartbeats after")

        self._at_end.append(beacon)
