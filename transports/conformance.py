"""A conformance harness for the wire protocol (``docs/protocol.md``): it plays one side
over real sockets against any implementation of the other and prints a pass/fail
line per check.

::

    # check an engine: bind ADDR (the client's side), start the engine, run the checks
    python -m ctlwire.transports.conformance engine \\
        --spawn "node cli.js engine --connect {address} --rank {rank}"
    # check a client: play engines 0 and 1 (protocol 1.0) and 2 (announcing 2.0) at the
    # address the client program binds, run its conformance script, check both sides
    python -m ctlwire.transports.conformance client \\
        --spawn "node cli.js conformance-client --bind {address}"

Without ``--spawn`` the harness uses ``--address`` and waits for the other side
(started by hand). Exit status 0 when every check passed, 1 otherwise.

The harness uses raw pyzmq sockets and this package's envelopes and codec only
(NULL security): it checks the bytes and the behaviour the spec describes, not
another copy of the Python kernel. The methods an engine under test must serve,
and the script a client under test must run, are the spec's "Conformance" section.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq

from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Envelope, ErrorInfo, Heartbeat, Reply, Request
from ctlwire.transports.errors import MalformedFrame
from ctlwire.transports.protocol_version import (
    PROTOCOL_VERSION,
    UNSUPPORTED_VERSION_CODE,
    pack_version,
    supported_version,
)

__all__ = ["Check", "CheckClient", "CheckEngine", "main"]

CODEC = MsgpackCodec()
NIL = msgspec.Raw(b"\xc0")
#: what a conformance engine's ``fail`` method answers with
CONFORMANCE_ERROR = ("ConformanceError", 599)
INCARNATION_WINDOW_MS = 60_000
_CLIENT_INC = (1 << 30) | secrets.randbits(30)


@dataclass
class Check:
    """One check's outcome."""

    name: str
    passed: bool
    detail: str = ""

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.name}" + (
            f"  -- {self.detail}" if self.detail else "")


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, passed: bool, detail: str = "") -> bool:
        check = Check(name, passed, detail)
        self.checks.append(check)
        sys.stdout.write(check.line() + "\n")
        sys.stdout.flush()
        return passed

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.passed for c in self.checks)


def private_address(name: str) -> str:
    """An ipc address in a fresh 0700 directory."""
    return f"ipc://{tempfile.mkdtemp(prefix='ctlwire-conf-')}/{name}"


@contextmanager
def spawned(command: str | None, **values: Any) -> Iterator[subprocess.Popen[bytes] | None]:
    """``command`` (``{address}`` and the like filled in) as a process, ended on exit."""
    if not command:
        yield None
        return
    proc = subprocess.Popen(shlex.split(command.format(**values)), stdout=subprocess.PIPE)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


# -- the harness as a client: checking an engine ---------------------------------------------
class CheckEngine:
    """Plays the client (a bound ROUTER) against the engine of ``rank``."""

    def __init__(self, address: str, rank: int = 0, *, timeout: float = 10.0) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(address)
        self.address = address
        self.rank = rank
        self.timeout = timeout
        self.heartbeats: list[tuple[float, Heartbeat]] = []
        self.incarnation = 0
        self._next_id = 1

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()

    def new_id(self) -> int:
        self._next_id += 1
        return (_CLIENT_INC << 32) | self._next_id

    def _take(self, timeout: float) -> Envelope | MalformedFrame | None:
        """The next frame from the engine (heartbeats are recorded and returned)."""
        if not self.sock.poll(int(timeout * 1000)):
            return None
        frames = self.sock.recv_multipart()
        data = frames[-1]
        try:
            env = CODEC.decode(data)
        except MalformedFrame as exc:
            return exc
        if isinstance(env, Heartbeat):
            self.heartbeats.append((time.monotonic(), env))
        return env

    def send(self, data: bytes) -> None:
        end = time.monotonic() + self.timeout
        while True:
            try:
                self.sock.send_multipart([b"rank-%d" % self.rank, data])
                return
            except zmq.ZMQError:  # not connected (yet)
                if time.monotonic() > end:
                    raise
                time.sleep(0.02)

    def replies(self, request_id: int, window: float) -> list[Reply]:
        """Every reply to ``request_id`` within ``window`` seconds."""
        got: list[Reply] = []
        end = time.monotonic() + window
        while (left := end - time.monotonic()) > 0:
            env = self._take(left)
            if isinstance(env, Reply) and env.id == request_id:
                got.append(env)
        return got

    def call(self, method: str, payload: Any = None, *, frame: bytes | None = None,
             request_id: int | None = None, **fields: Any) -> Reply | None:
        """Send a request (or ``frame``) and wait for its reply."""
        rid = self.new_id() if request_id is None else request_id
        if frame is None:
            fields.setdefault("rank", self.rank)
            fields.setdefault("deadline", time.time() + self.timeout)
            fields.setdefault("client", _CLIENT_INC)
            frame = CODEC.encode(Request(rid, fields.pop("rank"), method,
                                         CODEC.encode_value(payload), **fields))
        self.send(frame)
        end = time.monotonic() + self.timeout
        while (left := end - time.monotonic()) > 0:
            env = self._take(left)
            if isinstance(env, Reply) and env.id == rid:
                return env
        return None

    # -- checks ----------------------------------------------------------------------------
    def run(self, report: Report) -> None:
        if not self.first_contact(report):
            return
        for check in (self.echo, self.unknown_method, self.wrong_rank, self.deadline,
                      self.malformed, self.junk, self.duplicate, self.fences, self.keys,
                      self.version, self.minor_version, self.handler_error, self.metrics,
                      self.liveness):
            try:
                check(report)
            except Exception as exc:  # a check that broke is a failed check
                report.add(check.__name__, False, f"{type(exc).__name__}: {exc}")

    def first_contact(self, report: Report) -> bool:
        end = time.monotonic() + max(self.timeout, 20.0)
        while time.monotonic() < end and not self.heartbeats:
            self._take(0.1)
        if not self.heartbeats:
            return report.add("first-contact", False, "no heartbeat")
        hb = self.heartbeats[0][1]
        self.incarnation = hb.incarnation
        ahead_ms = (hb.incarnation >> 12) - time.time() * 1000
        problems = [p for p, bad in (
            (f"rank {hb.rank}, expected {self.rank}", hb.rank != self.rank),
            (f"version {hb.version:#x} unsupported", not supported_version(hb.version)),
            (f"incarnation {hb.incarnation} is {ahead_ms:.0f} ms ahead",
             ahead_ms > INCARNATION_WINDOW_MS or hb.incarnation <= 0)) if bad]
        return report.add("first-contact", not problems,
                          "; ".join(problems) or f"heartbeat of incarnation {hb.incarnation}")

    def _expect_error(self, report: Report, name: str, reply: Reply | None, type_name: str,
                      code: int) -> bool:
        if reply is None:
            return report.add(name, False, "no reply")
        err = reply.error
        ok = (not reply.ok and err is not None and err.type == type_name and err.code == code
              and reply.rank == self.rank)
        return report.add(name, ok, f"{err.type} {err.code}" if err else "ok reply")

    def echo(self, report: Report) -> None:
        payload = {"x": [1, "ü", 1.5, None, True], "big": 2**40}
        reply = self.call("echo", payload)
        ok = (reply is not None and reply.ok and CODEC.decode_value(reply.result) == payload
              and reply.rank == self.rank and reply.incarnation == self.incarnation)
        report.add("echo", ok, "" if ok else repr(reply))

    def unknown_method(self, report: Report) -> None:
        self._expect_error(report, "unknown-method-unicode", self.call("重みを更新_ü_🚀"),
                           "UnknownMethod", 404)

    def wrong_rank(self, report: Report) -> None:
        self._expect_error(report, "wrong-rank", self.call("echo", 1, rank=self.rank + 1),
                           "WrongRank", 421)

    def _count(self, **fields: Any) -> int:
        reply = self.call("count", None, **fields)
        if reply is None or not reply.ok:
            raise AssertionError(f"count failed: {reply!r}")
        value: int = CODEC.decode_value(reply.result, int)
        return value

    def deadline(self, report: Report) -> None:
        before = self._count()
        reply = self.call("count", None, deadline=time.time() - 5.0)
        self._expect_error(report, "deadline-expired", reply, "DeadlineExpired", 408)
        report.add("deadline-expired-not-run", self._count() == before + 1)

    def malformed(self, report: Report) -> None:
        rid = self.new_id()
        frame = msgspec.msgpack.encode(["q", rid, self.rank, 5, None])  # method not a string
        reply = self.call("", request_id=rid, frame=frame)
        self._expect_error(report, "malformed-salvaged-id", reply, "MalformedFrame", 400)

    def junk(self, report: Report) -> None:
        for frame in (b"\xc1\xc1", msgspec.msgpack.encode({"id": 1}), b"",
                      msgspec.msgpack.encode(["x", 1, 2]), b"\x93\xa1q"):
            self.send(frame)
        reply = self.call("echo", "still here")
        report.add("junk-survived", reply is not None and reply.ok)

    def duplicate(self, report: Report) -> None:
        rid = self.new_id()
        frame = CODEC.encode(Request(rid, self.rank, "count", NIL, time.time() + self.timeout,
                                     client=_CLIENT_INC))
        self.send(frame)
        self.send(frame)
        got = self.replies(rid, 1.5)
        report.add("duplicate-id-answered-once", len(got) == 1, f"{len(got)} replies")

    def fences(self, report: Report) -> None:
        now_us = int(time.time() * 1_000_000)
        ok = self.call("count", None, fence=now_us)
        report.add("fence-admitted", ok is not None and ok.ok)
        self._expect_error(report, "fence-stale", self.call("count", None, fence=now_us - 1),
                           "Fenced", 409)
        self._expect_error(report, "fence-out-of-range",
                           self.call("count", None, fence=now_us + 86_400 * 1_000_000),
                           "FenceOutOfRange", 416)

    def keys(self, report: Report) -> None:
        key = f"conformance-{secrets.token_hex(4)}"
        first, again = self._count(key=key), self._count(key=key)
        report.add("idempotency-key-replayed", first == again, f"{first}, {again}")
        self._expect_error(report, "idempotency-key-too-long", self.call("count", None,
                                                                          key="k" * 257),
                           "KeyTooLong", 414)

    def version(self, report: Report) -> None:
        reply = self.call("count", None, version=pack_version((PROTOCOL_VERSION >> 8) + 1, 0))
        self._expect_error(report, "version-major-refused", reply, "UnsupportedProtocolVersion",
                           UNSUPPORTED_VERSION_CODE)

    def minor_version(self, report: Report) -> None:
        rid = self.new_id()
        req = Request(rid, self.rank, "echo", CODEC.encode_value("newer"),
                      time.time() + self.timeout, 0, _CLIENT_INC, version=pack_version(1, 9))
        items = msgspec.msgpack.decode(CODEC.encode(req))
        reply = self.call("echo", request_id=rid,
                          frame=msgspec.msgpack.encode([*items, "a later field", {"x": 1}]))
        report.add("version-minor-unknown-fields", reply is not None and reply.ok
                   and CODEC.decode_value(reply.result) == "newer")

    def handler_error(self, report: Report) -> None:
        self._expect_error(report, "handler-error", self.call("fail", "boom"),
                           *CONFORMANCE_ERROR)

    def metrics(self, report: Report) -> None:
        reply = self.call("ctlwire.metrics", None, fence=1)  # read-only: the fence is ignored
        report.add("builtin-metrics", reply is not None and reply.ok)

    def liveness(self, report: Report) -> None:
        """Busy is not dead: heartbeats keep coming while a handler sleeps, and say so."""
        start = time.monotonic()
        reply = self.call("sleep", 1.5)
        during = [hb for t, hb in self.heartbeats if t >= start]
        busy = [hb for hb in during if hb.method == "sleep"]
        report.add("liveness-while-busy", reply is not None and reply.ok and len(during) >= 3
                   and bool(busy), f"{len(during)} heartbeats, {len(busy)} naming 'sleep'")
        incs = {hb.incarnation for _t, hb in self.heartbeats}
        report.add("incarnation-stable", incs == {self.incarnation}, f"{len(incs)} seen")


# -- the harness as engines: checking a client ---------------------------------------------
class _Engine:
    """One engine rank played by the harness: request DEALER and beacon DEALER."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], address: str, rank: int,
                 version: int) -> None:
        self.rank, self.version = rank, version
        self.incarnation = (int(time.time() * 1000) << 12) | secrets.randbits(12)
        self.req = ctx.socket(zmq.DEALER)
        self.req.setsockopt(zmq.IDENTITY, b"rank-%d" % rank)
        self.beat = ctx.socket(zmq.DEALER)
        self.beat.setsockopt(zmq.IDENTITY, b"beat-%d" % rank)
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
        elif env.method == "fail":
            out = self.reply(env, False, None, ErrorInfo(*CONFORMANCE_ERROR[:1], str(value),
                                                         CONFORMANCE_ERROR[1]))
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
        self.engines = [_Engine(self.ctx, address, 0, PROTOCOL_VERSION),
                        _Engine(self.ctx, address, 1, PROTOCOL_VERSION),
                        _Engine(self.ctx, address, 2, pack_version(2, 0))]
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
            report.add(f"client-{step}", ok, json.dumps(o, ensure_ascii=False)[:200])

        o = outcome("echo")
        report.add("client-echo", o.get("ok") is True and o.get("value") == {"x": [1, "ü"]},
                   json.dumps(o, ensure_ascii=False)[:200])
        failed_with("unknown-method", type_name="UnknownMethod", code=404)
        failed_with("fail", type_name=CONFORMANCE_ERROR[0], code=CONFORMANCE_ERROR[1])
        failed_with("timeout", cls="RequestTimedOut")
        o = outcome("fan-out")
        report.add("client-fan-out", o.get("ok") is True and o.get("value") == {"0": "all",
                                                                              "1": "all"},
                   json.dumps(o)[:200])
        failed_with("version", cls="UnsupportedProtocolVersion")
        o = outcome("key")
        report.add("client-idempotency-key", o.get("ok") is True
                   and len(set(o.get("value") or [0, 1])) == 1
                   and self.engines[0].key_runs.get("k1") == 1, json.dumps(o)[:200])
        # what the engines saw
        requests = [r for e in self.engines for _t, r in e.requests]
        bad = [b for e in self.engines for b in e.bad_frames]
        report.add("client-frames-valid", not bad and bool(requests),
                   f"{len(requests)} requests, {len(bad)} malformed")
        versions = {r.version for r in requests} | {
            h.version for e in self.engines for h in e.client_heartbeats}
        report.add("client-version-announced", bool(versions) and all(
            supported_version(v) for v in versions), str(sorted(versions)))
        ids = [(r.id, r.rank) for r in requests]
        report.add("client-ids-unique", len(ids) == len(set(ids)) and all(
            0 < i < 2**64 for i, _ in ids))
        report.add("client-ranks-addressed", all(
            r.rank == e.rank for e in self.engines for _t, r in e.requests))
        late = [(t, r) for e in self.engines for t, r in e.requests
                if not r.deadline or not t - 5 < r.deadline < t + 60]
        report.add("client-deadlines-carried", not late,
                   f"{len(late)} requests without a plausible wall-clock deadline")
        report.add("client-major-2-engine-untouched", not self.engines[2].requests,
                   f"{len(self.engines[2].requests)} requests reached it")
        hbs = [h for e in self.engines[:2] for h in e.client_heartbeats]
        report.add("client-heartbeats", bool(hbs) and all(h.rank == -1 for h in hbs),
                   f"{len(hbs)} heartbeats")


def _read_outcomes(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, dict[str, Any]]:
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


@contextmanager
def _address(address: str | None, name: str) -> Iterator[str]:
    """``address``, or a private ipc address removed afterwards."""
    if address:
        yield address
        return
    private = private_address(name)
    try:
        yield private
    finally:
        shutil.rmtree(os.path.dirname(private[len("ipc://"):]), ignore_errors=True)


def check_engine(address: str | None, rank: int, spawn: str | None, timeout: float) -> Report:
    """Every engine check against the engine of ``rank`` (``spawn``: its command), the
    harness bound at ``address`` (None: a private ipc address)."""
    report = Report()
    with _address(address, "engine") as where:
        harness = CheckEngine(where, rank, timeout=timeout)
        try:
            with spawned(spawn, address=where, rank=rank):
                harness.run(report)
        finally:
            harness.close()
    return report


def check_client(address: str | None, spawn: str, timeout: float) -> Report:
    """Every client check against the conformance program ``spawn`` (binding ``address``,
    None: a private ipc address), its script bounded by ``timeout`` seconds."""
    report = Report()
    with _address(address, "client") as where, spawned(spawn, address=where) as proc:
        assert proc is not None
        with CheckClient(where) as engines:
            outcomes = _read_outcomes(proc, timeout)
            report.add("client-script-finished", "done" in outcomes,
                       f"{len(outcomes)} steps reported")
            engines.check(outcomes, report)
    return report


def main(argv: list[str] | None = None, *, out: Callable[[str], Any] = sys.stdout.write) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ctlwire.transports.conformance",
        description="Check an implementation of the ctlwire wire protocol over real sockets.")
    sub = parser.add_subparsers(dest="role", required=True)
    eng = sub.add_parser("engine", help="play the client; check an engine")
    eng.add_argument("--address", help="where to bind (default: a private ipc address)")
    eng.add_argument("--rank", type=int, default=0)
    eng.add_argument("--spawn", help="the engine's command ({address}, {rank} filled in)")
    eng.add_argument("--timeout", type=float, default=10.0, help="seconds per reply")
    cli = sub.add_parser("client", help="play engines 0, 1 and 2; check a client")
    cli.add_argument("--address", help="where the client binds (default: a private ipc "
                                       "address)")
    cli.add_argument("--spawn", required=True,
                     help="the client's conformance program ({address} filled in)")
    cli.add_argument("--timeout", type=float, default=60.0, help="seconds for its script")
    args = parser.parse_args(argv)
    out(f"ctlwire conformance: checking a{'n' if args.role == 'engine' else ''} "
        f"{args.role}\n")
    if args.role == "engine":
        report = check_engine(args.address, args.rank, args.spawn, args.timeout)
    else:
        report = check_client(args.address, args.spawn, args.timeout)
    failed = [c for c in report.checks if not c.passed]
    out(f"{len(report.checks) - len(failed)} passed, {len(failed)} failed\n")
    return 0 if report.passed else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
