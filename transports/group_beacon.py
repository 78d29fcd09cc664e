"""Group beacons on the wire: one message a beat for the ranks of one process.

A process hosting ranks ``F .. F+C-1`` may send their heartbeats from one beacon
with identity ``beats-F-C`` (``beats-F-C.TAG`` under CURVE), a heartbeat frame per
rank in one message, instead of a beacon per rank; every client of protocol 1.0
must accept them (there is no opt-in on the wire). The identity grammar is here,
and :class:`GroupBeaconReader`, which turns such a message into one event per
frame: a heartbeat of a rank the identity speaks for, else a counted drop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ctlwire.transports.codec import Codec
from ctlwire.transports.envelope import Heartbeat
from ctlwire.transports.memory import decode_event
from ctlwire.transports.transport import Dropped, Received, TransportEvent
from ctlwire.transports.zmq_config import split_identity

__all__ = [
    "MAX_BEACON_GROUP",
    "GroupBeaconReader",
    "group_beacon_identity",
    "ranks_of_group_beacon",
    "request_route_in_group",
]

MAX_BEACON_GROUP = 1024
"""The most ranks one group beacon may speak for."""

_PREFIX = b"beats-"
_CACHE_LIMIT = 4096


def group_beacon_identity(first: int, count: int, tag: bytes = b"") -> bytes:
    """The identity of one beacon speaking for ranks ``first .. first+count-1`` of one
    process (``beats-F-C``, or ``beats-F-C.TAG`` with the tag of those ranks' request
    connections)."""
    if first < 0 or not 0 < count <= MAX_BEACON_GROUP:
        raise ValueError(f"a group beacon speaks for 1 to {MAX_BEACON_GROUP} ranks from >= 0")
    return b"beats-%d-%d" % (first, count) + (b"." + tag if tag else b"")


def ranks_of_group_beacon(identity: bytes) -> tuple[range, bytes] | None:
    """The ranks a group beacon identity speaks for and its tag (``b""`` or
    ``b".TAG"``), when ``identity`` is exactly ``beats-F-C`` or ``beats-F-C.TAG``
    (numbers and tag spelled as in :func:`~ctlwire.transports.zmq_config.split_identity`)
    with ``0 < C <= MAX_BEACON_GROUP``; else None."""
    if not identity.startswith(_PREFIX):
        return None
    first, dash, rest = identity[len(_PREFIX):].partition(b"-")
    start = split_identity(first, b"")
    count = split_identity(dash + rest, b"-")
    if start is None or start[1] or count is None or not 0 < count[0] <= MAX_BEACON_GROUP:
        return None
    return range(start[0], start[0] + count[0]), count[1]


def request_route_in_group(rank: int, tag: bytes) -> bytes:
    """The request connection's identity of ``rank`` in a group beacon of tag ``tag``
    (``b""`` or ``b".TAG"``, as :func:`ranks_of_group_beacon` gives it)."""
    return b"rank-%d" % rank + tag


class GroupBeaconReader:
    """Reads group beacon messages ``[identity, heartbeat, ...]`` (the identity's
    parse cached, bounded). ``counters`` (the transport's) counts what is dropped."""

    def __init__(self, codec: Codec, counters: dict[str, int]) -> None:
        self.codec = codec
        self.counters = counters
        self._fast_decode = codec.fast_envelope_decoder()
        self._groups: dict[bytes, tuple[range, bytes]] = {}

    @staticmethod
    def speaks(identity: bytes) -> bool:
        """Whether ``identity`` claims to be a group beacon (then :meth:`events` judges it)."""
        return identity.startswith(_PREFIX)

    def events(self, msg: list[bytes], may_speak_for: Callable[[int], bool] | None = None
               ) -> tuple[list[TransportEvent], bytes]:
        """One event per heartbeat frame of ``msg``, in order, and the group's tag.

        A frame is delivered as the heartbeat of its ``rank`` when that rank is one the
        identity speaks for (and ``may_speak_for(rank)``, the sender's key binding);
        otherwise it is dropped and counted: ``impersonation``, ``wrong_type`` (not a
        heartbeat), ``malformed``/``oversized``. An identity that names no group, or
        more frames than its ranks: one ``Dropped`` for the whole message."""
        identity = msg[0]
        size = sum(len(f) for f in msg)
        group = self._groups.get(identity)
        if group is None:
            group = ranks_of_group_beacon(identity)
            if group is None:
                self.counters["unknown_peer"] += 1
                return [Dropped("unknown_peer", f"identity {identity[:32]!r} is not a rank",
                                size)], b""
            if len(self._groups) < _CACHE_LIMIT:
                self._groups[identity] = group
        ranks, tag = group
        if len(msg) - 1 > len(ranks):
            return [Dropped("framing", f"a group beacon for {len(ranks)} ranks sent "
                            f"{len(msg) - 1} heartbeats", size)], tag
        fast, limit = self._fast_decode, self.codec.max_message_size
        events: list[TransportEvent] = []
        for data in msg[1:]:
            hb: Any = None
            if fast is not None and len(data) <= limit:
                try:
                    hb = fast(data)
                except Exception:
                    hb = None  # not an envelope: decode_event gives the verdict
            if hb is None:
                event = decode_event(self.codec, data, None, identity)
                if type(event) is not Received:
                    events.append(event)
                    continue
                hb = event.envelope
            if type(hb) is not Heartbeat:
                self.counters["unknown_peer"] += 1
                events.append(Dropped("wrong_type", "a beacon sent something else", len(data)))
            elif hb.rank not in ranks or (may_speak_for is not None
                                          and not may_speak_for(hb.rank)):
                self.counters["impersonation"] = self.counters.get("impersonation", 0) + 1
                events.append(Dropped("impersonation", f"group beacon {identity[:32]!r} "
                                      f"spoke for rank {hb.rank}", len(data)))
            else:
                events.append(Received(hb, hb.rank, identity, len(data)))
        return events, tag
