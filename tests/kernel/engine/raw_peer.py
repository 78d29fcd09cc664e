"""A peer that knows the wire format and nothing else: a raw zmq DEALER connected
to an engine that binds (real engine processes over ipc), for the hostile-peer
tests of this folder."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import msgspec
import zmq

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Reply, Request

CODEC = MsgpackCodec()
NIL = CODEC.encode_value(None)
METRICS = "ctlwire.metrics"


def value(v: Any) -> msgspec.Raw:
    return CODEC.encode_value(v)


class RawPeer:
    """A DEALER that speaks the wire format and nothing else."""

    def __init__(self, address: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(address)
        self.next_id = 1
        self.unclaimed: dict[int, Reply] = {}  # replies read while waiting for others

    def send(self, method: str, payload: msgspec.Raw = NIL, **fields: Any) -> int:
        rid = fields.pop("id", None) or self.next_id
        self.next_id = max(self.next_id, rid) + 1
        self.sock.send(CODEC.encode(Request(rid, 0, method, payload, **fields)))
        return rid

    def replies(self, ids: set[int], timeout: float = 60.0) -> dict[int, Reply]:
        """The replies to ``ids`` (heartbeats skipped; replies to other ids are kept
        for a later call); fails on a timeout."""
        got = {i: self.unclaimed.pop(i) for i in ids & self.unclaimed.keys()}
        end = time.monotonic() + timeout
        while not ids <= got.keys():
            left = end - time.monotonic()
            assert left > 0, f"no reply to {sorted(ids - got.keys())[:5]}..."
            if self.sock.poll(int(left * 1000)):
                env = CODEC.decode(self.sock.recv())
                if type(env) is Reply:
                    if env.id in ids:
                        got[env.id] = env
                    else:
                        self.unclaimed[env.id] = env
        return got

    def call(self, method: str, payload: msgspec.Raw = NIL, timeout: float = 60.0,
             **fields: Any) -> Reply:
        rid = self.send(method, payload, **fields)
        return self.replies({rid}, timeout)[rid]

    def metrics(self, timeout: float = 60.0) -> dict[str, Any]:
        reply = self.call(METRICS, timeout=timeout)
        assert reply.ok, reply.error
        out: dict[str, Any] = CODEC.decode_value(reply.result)
        return out

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def ipc(tmp_path: Any) -> str:
    os.chmod(tmp_path, 0o700)
    return f"ipc://{tmp_path}/e.sock"


def engine(address: str, mode: str, extra: Sequence[str] = ()) -> EngineFleet:
    """One engine process binding ``address`` (a ROUTER), serving in ``mode``."""
    return EngineFleet(1, lambda r: ["--bind", address, "--mode", mode, *extra])


def attacker(peers: list[RawPeer], address: str) -> RawPeer:
    """A raw peer on ``address``, closed after the test (``peers``: the ``raw_peer``
    fixture of this folder's conftest)."""
    p = RawPeer(address)
    peers.append(p)
    return p


def error_type(reply: Reply) -> str:
    assert not reply.ok and reply.error is not None, reply
    return reply.error.type
