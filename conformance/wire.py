"""The conformance harness's client side on the wire: a bound ROUTER (raw pyzmq, NULL
security) that sends requests, frames and junk to one engine rank and records every
heartbeat and reply it receives (:class:`HarnessClient`), and the frames it builds."""

from __future__ import annotations

import secrets
import struct
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from ctlwire.conformance.report import CODEC, Report
from ctlwire.transports.codec import DEFAULT_MAX_MESSAGE_SIZE
from ctlwire.transports.envelope import Heartbeat, Reply
from ctlwire.transports.errors import MalformedFrame
from ctlwire.transports.protocol_version import PROTOCOL_VERSION

__all__ = ["CLIENT_INC", "OTHER_INC", "HarnessClient", "float32_deadline", "malformed_frame",
           "request_items"]

#: the client incarnation the harness's request ids carry (``id >> 32``)
CLIENT_INC = (1 << 30) | secrets.randbits(30)
#: a second client incarnation (another controller's, or another ``client`` field)
OTHER_INC = CLIENT_INC ^ (1 + secrets.randbits(29))


def request_items(rid: int, rank: int, method: str, payload: Any = None, **fields: Any
                  ) -> list[Any]:
    """A request as the array it is on the wire (fields by name; any value allowed)."""
    values = {"deadline": time.time() + 30.0, "seq": 0, "client": CLIENT_INC, "trace": None,
              "key": "", "fence": 0, "version": PROTOCOL_VERSION, **fields}
    return ["q", rid, rank, method, payload, values["deadline"], values["seq"],
            values["client"], values["trace"], values["key"], values["fence"],
            values["version"]]


def malformed_frame(rid: int, rank: int) -> bytes:
    """A request whose method is an integer: malformed, its id readable."""
    return msgspec.msgpack.encode(["q", rid, rank, 5, None])


def float32_deadline(items: list[Any], seconds: float) -> bytes:
    """``items`` encoded with the deadline written as a float32 (``0xca``)."""
    mark = 1234.5678125  # a float64 found exactly once in the encoding
    data = msgspec.msgpack.encode([*items[:5], mark, *items[6:]])
    return data.replace(b"\xcb" + struct.pack(">d", mark), b"\xca" + struct.pack(">f", seconds))



class HarnessClient:
    """A bound ROUTER playing the client of the engine of ``rank``: every reply it
    receives is kept by id, every heartbeat with its arrival time."""

    def __init__(self, address: str, rank: int = 0, *, timeout: float = 10.0,
                 max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.address = address
        self.sock = self._bind()
        self.rank = rank
        self.timeout = timeout
        self.limit = max_message_size
        self.heartbeats: list[tuple[float, Heartbeat]] = []
        self.answers: defaultdict[int, list[Reply]] = defaultdict(list)  # every reply, by id
        self.arrived: dict[int, float] = {}  # when the first reply to an id came
        self.incarnation = 0
        #: where the engine's heartbeats come from (``beat-N``, or a group beacon's identity)
        self.beacon_identity = b"beat-%d" % rank
        self.client = CLIENT_INC  # the client incarnation of this harness's ids
        #: whether the engine receives while a request runs (lanes), or runs one request
        #: at a time; None until seen
        self.receiving: bool | None = None
        self._next_id = 1
        self._last_fence = 0
        self._at_end: list[Callable[[Report], None]] = []

    def _bind(self) -> zmq.Socket[bytes]:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.address)
        return sock

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()

    def rebind(self, pause: float) -> None:
        """Drop every connection (close the bound socket), wait ``pause`` seconds, and
        bind the same address again: the engine, the side that connects, must come back."""
        self.sock.close(0)
        time.sleep(pause)
        self.sock = self._bind()

    # -- the wire ------------------------------------------------------------------------
    def new_id(self, client: int = CLIENT_INC) -> int:
        self._next_id += 1
        return (client << 32) | self._next_id

    def fence(self) -> int:
        """A fencing token newer than any the harness sent (microseconds since the epoch)."""
        self._last_fence = max(int(time.time() * 1_000_000), self._last_fence + 1)
        return self._last_fence

    def _take(self, timeout: float) -> None:
        """Receive one message (or none within ``timeout``): heartbeats and replies
        recorded; a group beacon's message (``beats-F-C``) is a heartbeat a frame, of
        which only this harness's rank's are kept."""
        if not self.sock.poll(int(timeout * 1000)):
            return
        identity, *frames = self.sock.recv_multipart()
        group = identity.startswith(b"beats-")
        for data in frames if group else frames[-1:]:
            try:
                env = CODEC.decode(data)
            except MalformedFrame:
                continue
            if isinstance(env, Heartbeat):
                if group and env.rank != self.rank:
                    continue  # another rank of the engine's process
                self.heartbeats.append((time.monotonic(), env))
                if group or identity.startswith(b"beat-"):
                    self.beacon_identity = identity
            elif isinstance(env, Reply):
                self.answers[env.id].append(env)
                self.arrived.setdefault(env.id, time.monotonic())

    def send(self, data: bytes, identity: bytes | None = None) -> None:
        end = time.monotonic() + self.timeout
        while True:
            try:
                self.sock.send_multipart([identity or b"rank-%d" % self.rank, data])
                return
            except zmq.ZMQError:  # not connected (yet)
                if time.monotonic() > end:
                    raise
                time.sleep(0.02)

    def idle(self, seconds: float) -> None:
        """Receive (heartbeats, replies) for ``seconds``."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self._take(left)

    def heard_after(self, since: float, timeout: float) -> bool:
        """Whether a heartbeat arrives after ``since`` (``time.monotonic``), waiting up to
        ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while not (self.heartbeats and self.heartbeats[-1][0] > since) and (
                left := end - time.monotonic()) > 0:
            self._take(left)
        return bool(self.heartbeats) and self.heartbeats[-1][0] > since

    def before(self, first: int, then: int) -> bool:
        """Whether the reply to ``first`` arrived before the reply to ``then`` (one that
        never came arrives last)."""
        never = float("inf")
        return self.arrived.get(first, never) < self.arrived.get(then, never)

    def reply(self, rid: int, timeout: float | None = None) -> Reply | None:
        """The first reply to ``rid``, waiting up to ``timeout`` (default: the harness's)."""
        end = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.answers.get(rid) and (left := end - time.monotonic()) > 0:
            self._take(left)
        got = self.answers.get(rid)
        return got[0] if got else None

    def nth_reply(self, rid: int, n: int) -> Reply | None:
        """The ``n``-th reply to ``rid`` (waiting up to the harness's timeout)."""
        end = time.monotonic() + self.timeout
        while len(self.answers.get(rid, [])) < n and (left := end - time.monotonic()) > 0:
            self._take(left)
        got = self.answers.get(rid, [])
        return got[n - 1] if len(got) >= n else None

    def send_request(self, method: str, payload: Any = None, *, request_id: int | None = None,
                     **fields: Any) -> int:
        """Send a request (fields by name, any value) without waiting; its id."""
        rid = self.new_id() if request_id is None else request_id
        self.send(msgspec.msgpack.encode(request_items(rid, fields.pop("rank", self.rank),
                                                       method, payload, **fields)))
        return rid

    def call(self, method: str, payload: Any = None, *, frame: bytes | None = None,
             request_id: int | None = None, **fields: Any) -> Reply | None:
        """Send a request (or ``frame``, of id ``request_id``) and wait for its reply."""
        if frame is None:
            return self.reply(self.send_request(method, payload, request_id=request_id,
                                                **fields))
        assert request_id is not None
        self.send(frame)
        return self.reply(request_id)

    def value(self, reply: Reply | None) -> Any:
        if reply is None or not reply.ok:
            raise AssertionError(f"no result: {reply!r}")
        return CODEC.decode_value(reply.result)

    def count(self, **fields: Any) -> int:
        value: int = self.value(self.call("count", None, **fields))
        return value

    def never_answered(self, name: str, ids: list[int], why: str) -> None:
        """At the end of the run: ``ids`` got no reply (``why``: what they were)."""
        def check(report: Report) -> None:
            got = [i for i in ids if self.answers.get(i)]
            report.add(name, not got, f"{why}: {len(got)} of {len(ids)} answered")

        self._at_end.append(check)

    @property
    def serving_model(self) -> str:
        """How the engine serves, as the harness saw it (:attr:`receiving`)."""
        return ("receives while a request runs" if self.receiving else
                "runs one request at a time")

    def skip_other_model(self, report: Report, names: frozenset[str] | set[str]) -> None:
        """Report ``names``, the cases of the model this engine does not follow, skipped."""
        other = ("runs one request at a time" if self.receiving else
                 "receives while a request runs")
        for name in sorted(names):
            report.skip(name, f"this engine {self.serving_model}: the rule of an engine "
                        f"that {other} does not apply")

    def expect_error(self, report: Report, name: str, reply: Reply | None, type_name: str,
                     code: int) -> bool:
        if reply is None:
            return report.add(name, False, "no reply")
        err = reply.error
        ok = (not reply.ok and err is not None and err.type == type_name and err.code == code
              and reply.rank == self.rank and reply.incarnation == self.incarnation)
        return report.add(name, ok, f"{err.type} {err.code}: {err.message[:80]}" if err
                          else "ok reply")
