"""Socket options, addresses and identities shared by the ZeroMQ transports.

Defaults are defensive: explicit high-water marks, a bounded ``LINGER``,
``MAXMSGSIZE`` as a hard cap (libzmq drops the connection of a peer that
exceeds it) above the codec's own limit (which answers with a typed error),
ZMTP heartbeats so dead TCP connections are noticed by libzmq too,
``ROUTER_MANDATORY`` so an unroutable message is an error, ``ROUTER_HANDOVER``
so a restarted engine can take its identity back at once.

Addresses default to ipc in a private ``0700`` directory; ipc socket files are
made ``0600`` right after bind; tcp binds that are not loopback are refused
unless CURVE is on or ``allow_insecure_tcp`` is set.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import stat
import tempfile
from dataclasses import dataclass

import zmq

__all__ = [
    "InsecureBind",
    "ZmqOptions",
    "beacon_address_for",
    "beacon_identity",
    "check_bind_address",
    "ipc_path",
    "private_ipc_address",
    "rank_from_beacon_identity",
    "rank_from_identity",
    "rank_identity",
    "remove_ipc_file",
    "secure_ipc_file",
]


class InsecureBind(ValueError):
    """A tcp bind on a non-loopback interface without CURVE."""


@dataclass(frozen=True)
class ZmqOptions:
    """Socket options applied by every ZeroMQ transport."""

    sndhwm: int = 10_000
    rcvhwm: int = 10_000
    linger_ms: int = 200
    hard_max_message_size: int | None = None  # default: twice the codec's limit
    zmtp_heartbeat_ivl_ms: int = 1_000
    zmtp_heartbeat_timeout_ms: int = 3_000
    reconnect_ivl_ms: int = 100
    reconnect_ivl_max_ms: int = 1_000

    def apply(self, sock: zmq.Socket[bytes], codec_limit: int) -> None:
        hard = self.hard_max_message_size or 2 * codec_limit
        sock.setsockopt(zmq.SNDHWM, self.sndhwm)
        sock.setsockopt(zmq.RCVHWM, self.rcvhwm)
        sock.setsockopt(zmq.LINGER, self.linger_ms)
        sock.setsockopt(zmq.MAXMSGSIZE, hard)
        sock.setsockopt(zmq.HEARTBEAT_IVL, self.zmtp_heartbeat_ivl_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.zmtp_heartbeat_timeout_ms)
        sock.setsockopt(zmq.RECONNECT_IVL, self.reconnect_ivl_ms)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, self.reconnect_ivl_max_ms)
        if sock.type == zmq.ROUTER:
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            sock.setsockopt(zmq.ROUTER_HANDOVER, 1)


def rank_identity(rank: int) -> bytes:
    """The ZeroMQ routing identity of an engine rank."""
    if rank < 0:
        raise ValueError("rank must be >= 0")
    return b"rank-%d" % rank


def _canonical_rank(identity: bytes, prefix: bytes) -> int | None:
    digits = identity[len(prefix):]
    if not identity.startswith(prefix) or not digits.isdigit() or len(digits) > 9:
        return None
    rank = int(digits)
    # one spelling per rank: "rank-00" or "rank-+0" are not rank 0
    return rank if digits == b"%d" % rank else None


def rank_from_identity(identity: bytes) -> int | None:
    """The rank a request-socket identity names (exactly ``rank-N``), else None."""
    return _canonical_rank(identity, b"rank-")


def beacon_identity(rank: int) -> bytes:
    """The ZeroMQ routing identity of an engine rank's liveness beacon."""
    if rank < 0:
        raise ValueError("rank must be >= 0")
    return b"beat-%d" % rank


def rank_from_beacon_identity(identity: bytes) -> int | None:
    """The rank a beacon identity names (exactly ``beat-N``), else None."""
    return _canonical_rank(identity, b"beat-")


def beacon_address_for(address: str) -> str | None:
    """Where an engine that binds ``address`` binds its liveness beacon (a PUB),
    and where a client connecting to ``address`` finds it: ``ipc://P`` →
    ``ipc://P.beat``, ``inproc://N`` → ``inproc://N.beat``, ``tcp://H:PORT`` →
    ``tcp://H:PORT+1``. None where it cannot be derived (an ephemeral port):
    give the address explicitly then."""
    if address.startswith(("ipc://", "inproc://")):
        return address + ".beat"
    if address.startswith("tcp://"):
        host, sep, port = address[len("tcp://"):].rpartition(":")
        if sep and port.isdigit() and 0 < int(port) < 65535:
            return f"tcp://{host}:{int(port) + 1}"
    return None


def ipc_path(address: str) -> str | None:
    """The file of an ``ipc://`` address, else None."""
    return address[len("ipc://"):] if address.startswith("ipc://") else None


def private_ipc_address(name: str = "ctlwire") -> str:
    """A fresh ``ipc://`` address inside a new ``0700`` directory."""
    directory = tempfile.mkdtemp(prefix="ctlwire-")
    os.chmod(directory, 0o700)
    return f"ipc://{directory}/{name}.sock"


def secure_ipc_file(address: str) -> None:
    """Make a just-bound ipc socket file owner-only (``0600``)."""
    path = ipc_path(address)
    if path and not path.startswith("@") and os.path.exists(path):
        os.chmod(path, 0o600)


def remove_ipc_file(address: str, *, private_dir: bool = False) -> None:
    """After closing a bound ipc socket: remove its file (libzmq leaves it), and
    its directory when :func:`private_ipc_address` made it."""
    path = ipc_path(address)
    if not path or path.startswith("@"):
        return
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    except FileNotFoundError:
        pass
    if private_dir:
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))


def check_bind_address(address: str, *, curve: bool, allow_insecure_tcp: bool) -> None:
    """Refuse a tcp bind on anything but loopback unless CURVE is on (or insecure
    is explicitly allowed)."""
    if not address.startswith("tcp://") or curve or allow_insecure_tcp:
        return
    host = address[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if host in ("localhost",):
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise InsecureBind(
        f"refusing to bind {address} without CURVE: anyone on the network could send control "
        "requests; bind to 127.0.0.1, enable CURVE, or pass allow_insecure_tcp=True"
    )
