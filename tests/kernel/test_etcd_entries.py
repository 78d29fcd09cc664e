"""What a client takes from etcd, without etcd: a rank's key has one spelling, a
registration is strictly typed and bounded, and watch events of any shape are applied
or refused and counted — never a crash of the watcher."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.membership.etcd_gateway import EtcdGateway
from ctlwire.kernel.membership.etcd_membership import EtcdMembership
from ctlwire.kernel.membership.etcd_registration import decode_registration, rank_of_key
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytest.importorskip("httpx")
pytestmark = pytest.mark.anyio


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_a_rank_key_has_one_spelling_and_a_bounded_rank() -> None:
    assert rank_of_key("/p/0", "/p/") == 0 and rank_of_key("/p/17", "/p/") == 17
    for suffix in ("03", "+3", " 3", "3 ", "٣", "3.0", "-3", "", "1_0", "1234567890", "x"):
        assert rank_of_key(f"/p/{suffix}", "/p/") is None, suffix
    assert rank_of_key("/q/3", "/p/") is None
    assert rank_of_key("/p/70", "/p/", max_rank=64) is None


def test_a_registration_is_strictly_typed_and_bounded() -> None:
    reg = decode_registration(b64('{"rank": 3, "address": "a", "incarnation": 9, "x": 1}'), 3)
    assert (reg.rank, reg.address, reg.incarnation) == (3, "a", 9)  # later fields ignored
    for value in ('{"rank": true}', '{"rank": 3.0}', '{"rank": "3"}', '[3]', 'null',
                  '{"rank": 3, "incarnation": -1}', '{"rank": 3, "incarnation": 1e30}',
                  '{"rank": 3, "incarnation": 9223372036854775808}', '{"rank": 4}',
                  '{"rank": 3, "address": 3}', '{"address": "a"}'):
        with pytest.raises(ValueError):
            decode_registration(b64(value), 3)
    with pytest.raises(ValueError, match="larger"):
        decode_registration(b64(json.dumps({"rank": 3, "address": "x" * 5000})), 3)
    for raw in ("%%%", 3, None, base64.b64encode(b"\xff\xfe").decode()):
        with pytest.raises(ValueError):
            decode_registration(raw, 3)


async def test_watch_events_of_any_shape_are_applied_or_refused_and_counted() -> None:
    async with ControlClient(ZmqRouterClientTransport(), ranks=(), heartbeat_interval=None,
                             admit_on_join=True) as c:
        watcher = EtcdMembership(c, EtcdGateway("http://127.0.0.1:9"), "/p/")
        good = {"key": b64("/p/1"), "value": b64('{"rank": 1, "incarnation": 5}'),
                "mod_revision": "7", "create_revision": "7", "lease": "0"}
        events: list[Any] = [
            "garbage", None, 3, {"kv": "x"}, {"type": "PUT"},
            {"kv": {"key": b64("/p/2")}},  # no value, no revision
            {"kv": {**good, "mod_revision": "x"}},
            {"type": "DELETE", "kv": {"key": b64("/p/9")}},  # no revision
            {"type": "DELETE", "kv": {"key": "%%%", "mod_revision": "8"}},
            {"kv": good},
            {"type": "DELETE", "kv": {"key": b64("/p/5"), "mod_revision": "9"},
             "prev_kv": "not a key-value"},
        ]
        await watcher._events(events)
        assert c.ranks == (1,) and watcher.revision == 9
        assert watcher.counters["bad_entries"] == 8
