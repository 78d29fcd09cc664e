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
import os
import secrets
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import zmq

from ctlwire.transports.conformance_client_check import CheckClient, read_outcomes
from ctlwire.transports.conformance_report import CODEC, CONFORMANCE_ERROR, Check, Report
from ctlwire.transports.envelope import Envelope, Heartbeat, Reply, Request
from ctlwire.transports.errors import MalformedFrame
from ctlwire.transports.protocol_version import (
    PROTOCOL_VERSION,
    UNSUPPORTED_VERSION_CODE,
    pack_version,
    supported_version,
)

__all__ = ["Check", "CheckClient", "CheckEngine", "main"]

NIL = msgspec.Raw(b"\xc0")
INCARNATION_WINDOW_MS = 60_000
_CLIENT_INC = (1 << 30) | secrets.randbits(30)


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
            outcomes = read_outcomes(proc, timeout)
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
