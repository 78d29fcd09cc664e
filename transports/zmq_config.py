"""Socket options, addresses and identities shared by the ZeroMQ transports.

Defaults are defensive: explicit high-water marks, a bounded ``LINGER``,
``MAXMSGSIZE`` as a hard cap (libzmq drops the connection of a peer that
exceeds it) above the codec's own limit (which answers with a typed error),
``ROUTER_MANDATORY`` so an unroutable message is an error, ``ROUTER_HANDOVER``
so a restarted engine can take its identity back at once.

ZMTP heartbeats (``HEARTBEAT_IVL``) are **off** by default: with them on, a peer
that fills a socket's receive pipe past ``RCVHWM`` while the owner is busy and
then disconnects makes libzmq 4.3.x abort the whole process
(``Assertion failed: !_io_error (stream_engine_base.cpp:310)``, libzmq issues
#4364 and #4767). Dead tcp connections are instead found by the kernel: TCP
keepalive probes on an idle connection and ``TCP_MAXRT`` (``TCP_USER_TIMEOUT``
on Linux) on unacknowledged data, which libzmq sees as an ordinary connection
error (the same path as a peer closing, which cannot abort). Process and link
liveness is the kernel's job (heartbeat envelopes), not libzmq's.

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
    "check_bind_address",
    "ipc_path",
    "private_ipc_address",
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
    #: ZMTP heartbeats: 0 (the default) leaves them off. Turning them on re-opens
    #: libzmq's abort on a full receive pipe plus a disconnect (see the module doc).
    zmtp_heartbeat_ivl_ms: int = 0
    zmtp_heartbeat_timeout_ms: int = 3_000
    #: tcp only: kernel keepalive on idle connections (first probe after
    #: ``tcp_keepalive_idle_s``, then every ``tcp_keepalive_intvl_s``, dead after
    #: ``tcp_keepalive_cnt`` unanswered) and ``TCP_MAXRT``: a connection whose sent
    #: data stays unacknowledged this long is dropped (the dialer redials). 0: off.
    tcp_keepalive_idle_s: int = 1
    tcp_keepalive_intvl_s: int = 1
    tcp_keepalive_cnt: int = 3
    tcp_max_retransmit_ms: int = 5_000
    reconnect_ivl_ms: int = 100
    reconnect_ivl_max_ms: int = 1_000

    def apply(self, sock: zmq.Socket[bytes], codec_limit: int) -> None:
        hard = self.hard_max_message_size or 2 * codec_limit
        sock.setsockopt(zmq.SNDHWM, self.sndhwm)
        sock.setsockopt(zmq.RCVHWM, self.rcvhwm)
        sock.setsockopt(zmq.LINGER, self.linger_ms)
        sock.setsockopt(zmq.MAXMSGSIZE, hard)
        if self.zmtp_heartbeat_ivl_ms > 0:
            sock.setsockopt(zmq.HEARTBEAT_IVL, self.zmtp_heartbeat_ivl_ms)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, self.zmtp_heartbeat_timeout_ms)
        if self.tcp_keepalive_idle_s > 0:
            sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
            sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, self.tcp_keepalive_idle_s)
            sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, self.tcp_keepalive_intvl_s)
            sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, self.tcp_keepalive_cnt)
        if self.tcp_max_retransmit_ms > 0:
            sock.setsockopt(zmq.TCP_MAXRT, self.tcp_max_retransmit_ms)
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


def rank_from_identity(identity: bytes) -> int | None:
    """The rank an identity names, or None for anything else."""
    if identity.startswith(b"rank-") and identity[5:].isdigit():
        return int(identity[5:])
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
