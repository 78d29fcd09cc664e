"""The conformance harness as engines, checking a client: engines 0 and 1 (this
protocol version) and 2 (announcing 2.0), played over raw pyzmq sockets while the
client under test runs its conformance script (``docs/protocol.md``, Conformance
harness). Engine 1 sends its heartbeats from a group beacon (``beats-1-1``), which
every client must accept; engine 0's ``fail`` answers an ErrorInfo with elements after
its code, which every client must ignore. Engine 0 also answers ``error_table()`` with
every row of the error table and ``error([type, code])`` with that error, so the
client's class for every row is checked (``error-codes/client-...``)."""

from __future__ import annotations

import json
import secrets
import subprocess
import threading
import time
from contextlib import suppress
from typing import Any

import msgspec
import zmq

from ctlwire.conformance.report import CODEC, CONFORMANCE_ERROR, ERROR_TABLE, Report
from ctlwire.transports.envelope import ErrorInfo, Heartbeat, Reply, Request
from ctlwire.transports.errors import MalformedFrame
from ctlwire.transports.protocol_version import PROTOCOL_VERSION, pack_version, supported_version

__all__ = ["CLIENT_CASES", "CheckClient", "PlayedEngine", "read_outcomes"]

_SCRIPT = "conformance-harness"


def _row_case(code: int, type_name: str) -> str:
    return f"error-codes/client-{code}-{type_name}"


#: every check of a client, by the spec section it tests
CLIENT_CASES: tuple[str, ...] = (
    f"{_SCRIPT}/client-script-finished",
    *(f"{_SCRIPT}/client-{step}" for step in (
        "echo", "unknown-method", "fail", "timeout", "fan-out", "version", "idempotency-key",
        "frames-valid", "version-announced", "ids-unique", "ranks-addressed",
        "deadlines-carried", "major-2-engine-untouched", "heartbeats")),
    "sockets/client-accepts-group-beacons",
    "envelopes/client-ignores-error-info-elements-after-its-code",
    "request-ids/client-field-is-the-ids-incarnation",
    *(_row_case(code, type_name) for code, type_name, _cls in ERROR_TABLE),
)


class PlayedEngine:
    """One engine rank played by the harness: request DEALER and beacon DEALER (its
    identity ``beat-N``, or ``beats-N-1``: a group beacon of this one rank)."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], address: str, rank: int,
                 version: int, *, group_beacon: bool = False) -> None:
        self.rank, self.version = rank, version
        self.incarnation = (int(time.time() * 1000) << 12) | secrets.randbits(12)
        self.req = ctx.socket(zmq.DEALER)
        self.req.setsockopt(zmq.IDENTITY, b"rank-%d" % rank)
        self.beat = ctx.socket(zmq.DEALER)
        self.beat.setsockopt(zmq.IDENTITY, b"beats-%d-1" % rank if group_beacon
                             else b"beat-%d" % rank)
        for s in (self.req, self.beat):
            s.setsockopt(zmq.LINGER, 0)
            s.connect(address)
        self.requests: list[tuple[float, Request]] = []
        self.bad_frames: list[str] = []
        self.client_heartbeats: list[Heartbeat] = []
        self.counts = 0
        self.key_runs: dict[str, int] = {}
        self.keys: dict[str, Reply] = {}
        self.later: list[tuple[float, Reply]] = []
        self.seq = 0

    def heartbeat(self) -> None:
        self.seq += 1
        with suppress(zmq.ZMQError):
            self.beat.send(CODEC.encode(Heartbeat(self.rank, self.incarnation, self.seq,
                                                  version=self.version)), zmq.NOBLOCK)

    def reply(self, req: Request, ok: bool, value: Any, error: ErrorInfo | None = None
              ) -> Reply:
        return Reply(req.id, self.rank, self.incarnation, ok, CODEC.encode_value(value), error)

    def handle(self, data: bytes) -> None:
        try:
            env = CODEC.decode(data)
        except MalformedFrame as exc:
            self.bad_frames.append(str(exc))
            return
        if isinstance(env, Heartbeat):
            self.client_heartbeats.append(env)
            return
        if not isinstance(env, Request):
            self.bad_frames.append(f"a {type(env).__name__} sent to an engine")
            return
        self.requests.append((time.time(), env))
        if env.key and env.key in self.keys:
            self.req.send(CODEC.encode(msgspec.structs.replace(self.keys[env.key], id=env.id)))
            return
        value = CODEC.decode_value(env.payload)
        out: Reply | None
        if env.method == "echo":
            out = self.reply(env, True, value)
        elif env.method == "count":
            self.counts += 1
            out = self.reply(env, True, self.counts)
            if env.key:
                self.keys[env.key] = out
                self.key_runs[env.key] = self.key_runs.get(env.key, 0) + 1
        elif env.method == "sleep":
            self.later.append((time.monotonic() + float(value), self.reply(env, True, value)))
            out = None
        elif env.method == "fail":  # an ErrorInfo with elements after its code
            self.req.send(msgspec.msgpack.encode(
                ["r", env.id, self.rank, self.incarnation, False, None,
                 [CONFORMANCE_ERROR[0], str(value), CONFORMANCE_ERROR[1], "later", {"x": 1}]]))
            return
        elif env.method == "error_table":
            out = self.reply(env, True, [[t, c] for c, t, _cls in ERROR_TABLE])
        elif env.method == "error" and isinstance(value, list) and len(value) == 2:
            out = self.reply(env, False, None, ErrorInfo(str(value[0]), "as asked", int(value[1])))
        else:
            out = self.reply(env, False, None, ErrorInfo(
                "UnknownMethod", f"no control method {env.method!r} on this engine", 404))
        if out is not None:
            self.req.send(CODEC.encode(out))

    def due(self, now: float) -> None:
        for item in [i for i in self.later if i[0] <= now]:
            self.later.remove(item)
            self.req.send(CODEC.encode(item[1]))


class CheckClient:
    """Plays engines 0 and 1 (this protocol version) and 2 (announcing 2.0) at the
    address a client under test binds, while it runs its conformance script."""

    def __init__(self, address: str, *, interval: float = 0.25) -> None:
        self.address = address
        self.interval = interval
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.engines = [PlayedEngine(self.ctx, address, 0, PROTOCOL_VERSION),
                        PlayedEngine(self.ctx, address, 1, PROTOCOL_VERSION,
                                     group_beacon=True),
                        PlayedEngine(self.ctx, address, 2, pack_version(2, 0))]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CheckClient:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for e in self.engines:
            e.req.close(0)
            e.beat.close(0)
        self.ctx.term()

    def _run(self) -> None:
        poller = zmq.Poller()
        for e in self.engines:
            poller.register(e.req, zmq.POLLIN)
        next_beat = 0.0
        by_sock = {e.req: e for e in self.engines}
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + self.interval
                for e in self.engines:
                    e.heartbeat()
            for sock, _ in poller.poll(20):
                engine = by_sock[sock]
                while engine.req.poll(0):
                    data = engine.req.recv()
                    try:
                        engine.handle(data)
                    except Exception as exc:  # a frame the harness cannot serve: a finding
                        engine.bad_frames.append(f"{type(exc).__name__}: {exc}")
            for e in self.engines:
                e.due(time.monotonic())

    def check(self, outcomes: dict[str, dict[str, Any]], report: Report) -> None:
        def outcome(step: str) -> dict[str, Any]:
            return outcomes.get(step, {"missing": True})

        def failed_with(step: str, cls: str | None = None, type_name: str | None = None,
                        code: int | None = None) -> None:
            o = outcome(step)
            ok = (o.get("ok") is False and (cls is None or o.get("class") == cls)
                  and (type_name is None or o.get("type") == type_name)
                  and (code is None or o.get("code") == code))
            report.add(f"{_SCRIPT}/client-{step}", ok, json.dumps(o, ensure_ascii=False)[:200])

        o = outcome("echo")
        report.add(f"{_SCRIPT}/client-echo",
                   o.get("ok") is True and o.get("value") == {"x": [1, "ü"]},
                   json.dumps(o, ensure_ascii=False)[:200])
        failed_with("unknown-method", type_name="UnknownMethod", code=404)
        failed_with("fail", type_name=CONFORMANCE_ERROR[0], code=CONFORMANCE_ERROR[1])
        failed_with("timeout", cls="RequestTimedOut")
        o = outcome("fan-out")
        report.add(f"{_SCRIPT}/client-fan-out",
                   o.get("ok") is True and o.get("value") == {"0": "all", "1": "all"},
                   json.dumps(o)[:200])
        failed_with("version", cls="UnsupportedProtocolVersion")
        o = outcome("key")
        report.add(f"{_SCRIPT}/client-idempotency-key", o.get("ok") is True
                   and len(set(o.get("value") or [0, 1])) == 1
                   and self.engines[0].key_runs.get("k1") == 1, json.dumps(o)[:200])
        # what the engines saw
        requests = [r for e in self.engines for _t, r in e.requests]
        bad = [b for e in self.engines for b in e.bad_frames]
        report.add(f"{_SCRIPT}/client-frames-valid", not bad and bool(requests),
                   f"{len(requests)} requests, {len(bad)} malformed")
        versions = {r.version for r in requests} | {
            h.version for e in self.engines for h in e.client_heartbeats}
        report.add(f"{_SCRIPT}/client-version-announced", bool(versions) and all(
            supported_version(v) for v in versions), str(sorted(versions)))
        ids = [(r.id, r.rank) for r in requests]
        report.add(f"{_SCRIPT}/client-ids-unique", len(ids) == len(set(ids)) and all(
            0 < i < 2**64 for i, _ in ids))
        report.add(f"{_SCRIPT}/client-ranks-addressed", all(
            r.rank == e.rank for e in self.engines for _t, r in e.requests))
        late = [(t, r) for e in self.engines for t, r in e.requests
                if not r.deadline or not t - 5 < r.deadline < t + 60]
        report.add(f"{_SCRIPT}/client-deadlines-carried", not late,
                   f"{len(late)} requests without a plausible wall-clock deadline")
        report.add(f"{_SCRIPT}/client-major-2-engine-untouched", not self.engines[2].requests,
                   f"{len(self.engines[2].requests)} requests reached it")
        hbs = [h for e in self.engines[:2] for h in e.client_heartbeats]
        report.add(f"{_SCRIPT}/client-heartbeats", bool(hbs) and all(h.rank == -1 for h in hbs),
                   f"{len(hbs)} heartbeats")
        fan = outcome("fan-out")
        report.add("sockets/client-accepts-group-beacons", fan.get("ok") is True
                   and bool(self.engines[1].requests),
                   f"rank 1 (heard only through beats-1-1) got "
                   f"{len(self.engines[1].requests)} requests")
        o = outcome("fail")
        report.add("envelopes/client-ignores-error-info-elements-after-its-code",
                   o.get("ok") is False and o.get("type") == CONFORMANCE_ERROR[0]
                   and o.get("code") == CONFORMANCE_ERROR[1],
                   json.dumps(o, ensure_ascii=False)[:200])
        odd = [(r.id, r.client) for r in requests
               if not (1 << 30 <= r.client < 1 << 31 and r.client == r.id >> 32)]
        report.add("request-ids/client-field-is-the-ids-incarnation",
                   bool(requests) and not odd,
                   f"{len(odd)} requests whose client field is not 2**30 <= C < 2**31 and "
                   "the id's top bits")
        # the client's class for every row of the error table
        rows = outcome("errors").get("value") or []
        for (code, type_name, cls), got in zip(ERROR_TABLE, [*rows, *[{}] * len(ERROR_TABLE)],
                                               strict=False):
            want = {"type": type_name, "code": code, "class": cls}
            if cls not in ("RemoteError", "Fenced"):  # a client error of its own: no type
                want["type"] = got.get("type", "")
            report.add(_row_case(code, type_name), got == want,
                       json.dumps(got, ensure_ascii=False)[:200])


def read_outcomes(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, dict[str, Any]]:
    """The JSON lines a client program prints, by step, until ``done`` or ``timeout``."""
    assert proc.stdout is not None
    outcomes: dict[str, dict[str, Any]] = {}
    lines: list[bytes] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            with suppress(ValueError):
                obj = json.loads(line)
                if isinstance(obj, dict) and "step" in obj:
                    outcomes[str(obj["step"])] = obj
                    if obj["step"] == "done":
                        return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    return outcomes
