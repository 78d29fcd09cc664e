"""Socket options, addresses and identities shared by the ZeroMQ transports.

Defaults are defensive: explicit high-water marks, a bounded ``LINGER``,
``MAXMSGSIZE`` as a backstop (libzmq drops the connection of a peer that
exceeds it) a sixteenth above the codec's own limit, the protocol's (an engine
answers a frame between the two with ``OversizedFrame``, 413),
``ROUTER_MANDATORY`` so an unroutable message is an error, and
``ROUTER_HANDOVER`` only on a client's ROUTER (a restarted engine takes its
identity back at once): an engine's ROUTER keeps a live route for the connection
that has it, so a peer naming itself after another's route is refused by libzmq
(never delivered to, never sent to).

**Routing ids.** A ROUTER's peer names itself, or gets an automatic id from
libzmq: ``0x00`` and a counter started from the C library's ``rand()``, which
nothing seeds, so it is the same in every process. A peer that claims the id
libzmq is about to assign makes libzmq abort the process (a duplicate in its
route table). :func:`make_socket` therefore seeds ``rand()`` from the operating
system's randomness before it makes a ROUTER, so the counter's start is
unpredictable, and ctlwire's own DEALERs that dial a ROUTER name themselves
with 128 random bits (:func:`new_client_identity`): their routes can be neither
guessed nor taken over.

ZMTP heartbeats (``HEARTBEAT_IVL``) are **off** by default: with them on, a peer
that fills a socket's receive pipe past ``RCVHWM`` while the owner is busy and
then disconnects makes libzmq 4.3.x abort the whole process
(``Assertion failed: !_io_error (stream_engine_base.cpp:310)``, libzmq issues
#4364 and #4767). Dead tcp connections are instead found by the kernel: TCP
keepalive probes on an idle connection and ``TCP_MAXRT`` (``TCP_USER_TIMEOUT``
on Linux) on unacknowledged data, which libzmq sees as an ordinary connection
error (the same path as a peer closing, which cannot abort). Process and link
liveness is the kernel's job (heartbeat envelopes), not libzmq's.

Addresses default to ipc in a private ``0700`` directory; ipc paths given by
the caller must be safe (:mod:`ctlwire.transports.ipc_path`); ipc socket files
are made ``0600`` right after bind (never through a link). tcp without CURVE,
loopback included (any local process can connect and speak as any rank), is
refused at construction, for binds and connects alike, unless
``allow_insecure_tcp=True`` is passed (:func:`check_address`,
:class:`InsecureTcp`); so is an abstract ipc name (``ipc://@name``: no file, no
permissions, any local process can connect) without CURVE, unless
``allow_abstract_ipc=True`` (:class:`InsecureAbstractIpc`).
Every bind and connect goes through :func:`bind_socket` / :func:`connect_socket`:
a refusal is an :class:`~ctlwire.transports.errors.EndpointError`, IPv6 is
enabled for IPv6 hosts (``tcp://[::1]:PORT``).
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import logging
import os
import secrets
import stat
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass

import zmq

from ctlwire.transports.errors import CtlwireError, EndpointError, TransportClosed
from ctlwire.transports.ipc_path import (
    check_ipc_connect,
    ipc_path,
    is_abstract,
    prepare_ipc_bind,
    secure_ipc_file,
)

__all__ = [
    "InsecureAbstractIpc",
    "InsecureAddress",
    "InsecureBind",
    "InsecureTcp",
    "TransportContext",
    "ZmqOptions",
    "beacon_address_for",
    "beacon_identity",
    "bind_socket",
    "check_address",
    "check_bind_address",
    "connect_socket",
    "ipc_path",
    "make_socket",
    "new_client_identity",
    "new_identity_tag",
    "private_ipc_address",
    "rank_from_beacon_identity",
    "rank_from_identity",
    "rank_identity",
    "remove_ipc_file",
    "request_route_of_beacon",
    "secure_ipc_file",
    "split_identity",
]


#: the backstop's margin over the protocol's limit: a sixteenth of it, at least this
_MIN_FRAMING_SLACK = 64 * 1024


class InsecureAddress(CtlwireError, ValueError):
    """An address any local process can reach unauthenticated, not explicitly allowed."""


class InsecureTcp(InsecureAddress):
    """tcp without CURVE that was not explicitly allowed (``allow_insecure_tcp=True``)."""


class InsecureBind(InsecureTcp):
    """A tcp bind without CURVE that was not explicitly allowed."""


class InsecureAbstractIpc(InsecureAddress):
    """An abstract ipc name (``ipc://@name``) without CURVE that was not explicitly
    allowed (``allow_abstract_ipc=True``)."""


@dataclass(frozen=True)
class ZmqOptions:
    """Socket options applied by every ZeroMQ transport.

    Bytes libzmq buffers for one peer are bounded. libzmq counts messages, not
    bytes, so the bound is ``HWM x MAXMSGSIZE`` per connection and direction:
    ``MAXMSGSIZE`` is the codec's limit (the protocol's) plus a sixteenth of it, at
    least 64 KiB (a frame up to that much over the codec's limit is read whole and
    answered ``OversizedFrame`` when its id is readable; a larger one makes libzmq
    drop the connection, and a socket that dials does not dial again after that:
    libzmq ends the session on a protocol error), and a high-water mark a peer can
    fill is lowered until that product fits in ``max_queued_bytes``
    (256 MiB / 17 MiB = 15 messages with the defaults):

    * ``RCVHWM`` on every socket (:meth:`effective_rcvhwm`): what a peer sends;
    * ``SNDHWM`` on an engine's socket that binds (:meth:`effective_sndhwm`):
      replies, whose size a peer chooses (an echo of its payload), to any peer
      that can connect, which may never read.

    Elsewhere ``SNDHWM`` stays ``sndhwm``: a client sends only the frames it
    encodes itself (10,000 requests can be pending at one engine that is not
    reading), and an engine that dials replies only to the client it chose (a
    small ``SNDHWM`` there would make bursts of replies wait for libzmq's I/O
    thread). So one connection of an engine that binds holds at most
    ``(effective_sndhwm + effective_rcvhwm + 2) x MAXMSGSIZE`` in libzmq (the two:
    the message each direction's stream engine is encoding or decoding); the
    engine's own reply outbox is bounded apart (``EngineEndpoint``'s
    ``max_outbox_bytes``), and a bound socket's connection count by its
    transport's ``max_connections``.
    """

    sndhwm: int = 10_000
    rcvhwm: int = 1_000
    #: the most bytes libzmq may queue per connection and direction where a peer
    #: chooses the sizes: caps RCVHWM, and SNDHWM on an engine's socket that binds
    max_queued_bytes: int = 256 * 1024 * 1024
    linger_ms: int = 200
    #: ``MAXMSGSIZE``; default: the codec's limit plus a sixteenth (at least 64 KiB)
    hard_max_message_size: int | None = None
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
    #: a connection that has not completed the ZMTP handshake after this long is
    #: dropped (libzmq's ``HANDSHAKE_IVL``, 30 s by default): how long a peer that
    #: opens connections and says nothing holds a descriptor
    handshake_ivl_ms: int = 10_000

    def hard_limit(self, codec_limit: int) -> int:
        """``MAXMSGSIZE``, the backstop above the protocol's ``codec_limit``: a larger
        frame makes libzmq drop the peer's connection (for good, on a socket that
        dials); one up to this size is read whole, so the codec can refuse it and the
        engine answer it."""
        return self.hard_max_message_size or codec_limit + max(_MIN_FRAMING_SLACK,
                                                               codec_limit // 16)

    def effective_rcvhwm(self, codec_limit: int) -> int:
        """``RCVHWM`` as set: ``rcvhwm``, lowered so that ``RCVHWM x MAXMSGSIZE`` stays
        within ``max_queued_bytes`` (at least 1)."""
        return self._byte_bounded(self.rcvhwm, codec_limit)

    def effective_sndhwm(self, codec_limit: int, *, peer_sized: bool) -> int:
        """``SNDHWM`` as set: ``sndhwm``; where any peer that connects chooses the
        size of what is sent (``peer_sized``: the replies of an engine that binds),
        lowered so that ``SNDHWM x MAXMSGSIZE`` stays within ``max_queued_bytes``
        (at least 1)."""
        return self._byte_bounded(self.sndhwm, codec_limit) if peer_sized else self.sndhwm

    def _byte_bounded(self, hwm: int, codec_limit: int) -> int:
        return max(1, min(hwm, self.max_queued_bytes // self.hard_limit(codec_limit)))

    def apply(self, sock: zmq.Socket[bytes], codec_limit: int, *,
              peer_sized_sends: bool = False, handover: bool = False) -> None:
        """Set every option on ``sock``. ``peer_sized_sends``: what ``sock`` sends is
        sized by any peer that connects (the replies of an engine that binds), so its
        ``SNDHWM`` is bounded in bytes. ``handover`` (a ROUTER): a peer naming an id
        in use takes the route over (a client's ROUTER, whose engines come back under
        their own names); without it libzmq refuses such a peer."""
        hard = self.hard_limit(codec_limit)
        sock.setsockopt(zmq.SNDHWM, self.effective_sndhwm(codec_limit,
                                                          peer_sized=peer_sized_sends))
        sock.setsockopt(zmq.RCVHWM, self.effective_rcvhwm(codec_limit))
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
        sock.setsockopt(zmq.HANDSHAKE_IVL, self.handshake_ivl_ms)
        if sock.type == zmq.ROUTER:
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            sock.setsockopt(zmq.ROUTER_HANDOVER, int(handover))


_log = logging.getLogger("ctlwire.transport")
_seed_lock = threading.Lock()


def _c_srand() -> Callable[[int], None] | None:
    try:
        srand = ctypes.CDLL(None).srand
    except (OSError, AttributeError):
        _log.warning("the C library's srand() is not reachable: a ROUTER's automatic "
                     "routing ids stay predictable")
        return None
    srand.argtypes = [ctypes.c_uint]
    srand.restype = None
    seed: Callable[[int], None] = srand
    return seed


_srand = _c_srand()


def make_socket(context: zmq.Context[zmq.Socket[bytes]], kind: int) -> zmq.Socket[bytes]:
    """A new socket of ``kind`` in ``context``. A ROUTER is made just after the C
    library's ``rand()`` is seeded from the operating system's randomness: libzmq
    draws the start of the ROUTER's automatic routing ids from it (see the module
    docstring), so a peer cannot predict them."""
    if kind != zmq.ROUTER or _srand is None:
        return context.socket(kind)
    with _seed_lock:
        _srand(secrets.randbits(32))
        return context.socket(kind)


def new_client_identity() -> bytes:
    """A routing identity for a client's DEALER that dials an engine's ROUTER:
    ``client-`` and 32 random hex digits (128 bits), fixed for the socket's life, so
    the engine's route for it can be neither guessed nor claimed by another peer."""
    return b"client-" + secrets.token_hex(16).encode()


class TransportContext:
    """The zmq Context a transport makes its sockets in: the caller's (never
    terminated here), or one of the transport's own, made on first use (when the
    transport opens) and terminated by :meth:`close`. A transport that is never
    opened, or whose constructor refuses its arguments, owns no context.
    """

    __slots__ = ("_closed", "_context", "_own")

    def __init__(self, given: zmq.Context[zmq.Socket[bytes]] | None) -> None:
        self._context = given
        self._own = given is None
        self._closed = False

    def get(self) -> zmq.Context[zmq.Socket[bytes]]:
        """The context (made now if it is the transport's own and not made yet).
        Raises :class:`~ctlwire.transports.errors.TransportClosed` for an own
        context never made before :meth:`close`."""
        context = self._context
        if context is None:
            if self._closed:
                raise TransportClosed("transport is closed")
            context = self._context = zmq.Context()
        return context

    def close(self) -> None:
        """Terminate the transport's own context, once its sockets are closed."""
        self._closed = True
        if self._own and self._context is not None:
            self._context.term()


def rank_identity(rank: int, tag: bytes = b"") -> bytes:
    """The ZeroMQ routing identity of an engine rank: ``rank-N``, or ``rank-N.TAG``
    for a connection tagged with :func:`new_identity_tag` (under CURVE: a route a
    peer cannot name without knowing the tag)."""
    if rank < 0:
        raise ValueError("rank must be >= 0")
    return b"rank-%d" % rank + (b"." + tag if tag else b"")


def new_identity_tag() -> bytes:
    """A fresh random tag for an engine's routing identities (16 hex digits)."""
    return secrets.token_hex(8).encode()


_TAG_CHARS = frozenset(b"0123456789abcdef")


def split_identity(identity: bytes, prefix: bytes) -> tuple[int, bytes] | None:
    """The number and tag (``b""`` or ``b".TAG"``) of an identity spelled exactly
    ``PREFIX N`` or ``PREFIX N.TAG``: N in decimal, at most 9 digits, without sign or
    leading zeros; TAG 1 to 32 lowercase hex digits. None for any other spelling."""
    if not identity.startswith(prefix):
        return None
    digits, dot, tag = identity[len(prefix):].partition(b".")
    if not digits.isdigit() or len(digits) > 9:
        return None
    if dot and not (0 < len(tag) <= 32 and _TAG_CHARS.issuperset(tag)):
        return None
    number = int(digits)
    # one spelling per number: "rank-00" or "rank-+0" are not rank 0
    return (number, dot + tag) if digits == b"%d" % number else None


def _canonical_rank(identity: bytes, prefix: bytes) -> int | None:
    split = split_identity(identity, prefix)
    return None if split is None else split[0]


def rank_from_identity(identity: bytes) -> int | None:
    """The rank a request-socket identity names (exactly ``rank-N`` or ``rank-N.TAG``,
    TAG 1 to 32 lowercase hex digits), else None."""
    return _canonical_rank(identity, b"rank-")


def beacon_identity(rank: int, tag: bytes = b"") -> bytes:
    """The ZeroMQ routing identity of an engine rank's liveness beacon (``beat-N``,
    or ``beat-N.TAG`` with the tag of the rank's request connection)."""
    if rank < 0:
        raise ValueError("rank must be >= 0")
    return b"beat-%d" % rank + (b"." + tag if tag else b"")


def rank_from_beacon_identity(identity: bytes) -> int | None:
    """The rank a beacon identity names (exactly ``beat-N`` or ``beat-N.TAG``), else None."""
    return _canonical_rank(identity, b"beat-")


def request_route_of_beacon(identity: bytes) -> bytes:
    """The request connection's identity of the engine whose beacon is ``identity``
    (``beat-N.TAG`` -> ``rank-N.TAG``)."""
    return b"rank-" + identity[len(b"beat-"):]


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


def private_ipc_address(name: str = "ctlwire") -> str:
    """A fresh ``ipc://`` address inside a new ``0700`` directory."""
    directory = tempfile.mkdtemp(prefix="ctlwire-")
    os.chmod(directory, 0o700)
    return f"ipc://{directory}/{name}.sock"


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


def check_address(address: str, *, curve: bool, allow_insecure_tcp: bool = False,
                  allow_abstract_ipc: bool = False, bind: bool = False) -> None:
    """Refuse an address any local process reaches unauthenticated, unless allowed.

    Without CURVE nothing authenticates a peer on tcp (any process that can reach
    the port, on loopback every local user) or on an abstract ipc name (no file, so
    no permissions: every local process): it can send requests, replies and
    heartbeats under any rank's name. Raises :class:`InsecureBind` for a tcp bind,
    :class:`InsecureTcp` for a tcp connect (unless ``allow_insecure_tcp``), and
    :class:`InsecureAbstractIpc` for an abstract name (unless ``allow_abstract_ipc``);
    every other address passes."""
    if curve:
        return
    side = "bind" if bind else "connect to"
    if address.startswith("tcp://") and not allow_insecure_tcp:
        host = _tcp_host(address) or ""
        where = "on loopback " if _is_loopback(host) else ""
        error = InsecureBind if bind else InsecureTcp
        raise error(
            f"refusing to {side} {address} without CURVE: any process that can reach it "
            f"{where}is unauthenticated and can speak for any rank; use ipc (the default), "
            "enable CURVE, or pass allow_insecure_tcp=True")
    path = ipc_path(address)
    if path is not None and is_abstract(path) and not allow_abstract_ipc:
        raise InsecureAbstractIpc(
            f"refusing to {side} {address}: an abstract ipc name has no file permissions, "
            "so every local process can connect and speak for any rank; use an ipc path "
            "in a private directory (the default), enable CURVE, or pass "
            "allow_abstract_ipc=True")


def check_bind_address(address: str, *, curve: bool, allow_insecure_tcp: bool = False,
                       allow_abstract_ipc: bool = False) -> None:
    """:func:`check_address` for a bind."""
    check_address(address, curve=curve, allow_insecure_tcp=allow_insecure_tcp,
                  allow_abstract_ipc=allow_abstract_ipc, bind=True)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tcp_host(address: str) -> str | None:
    if not address.startswith("tcp://"):
        return None
    rest = address[len("tcp://"):]
    if rest.startswith("["):
        return rest[1:rest.find("]")] if "]" in rest else rest[1:]
    host = rest.rsplit(":", 1)[0] if rest.count(":") == 1 else rest
    return host.split(";", 1)[-1]


def _enable_ipv6_if_needed(sock: zmq.Socket[bytes], address: str) -> None:
    host = _tcp_host(address)
    if host is not None and ":" in host:
        sock.setsockopt(zmq.IPV6, 1)


def bind_socket(sock: zmq.Socket[bytes], address: str) -> str:
    """Bind ``sock`` at ``address`` and return the address actually bound (the port
    libzmq chose for ``:0``/``:*``). ipc: the path is checked first
    (:func:`~ctlwire.transports.ipc_path.prepare_ipc_bind`) and the socket file made
    ``0600`` after. Raises :class:`EndpointError` (or ``IpcPathUnsafe``) and leaves
    ``sock`` for the caller to close."""
    prepare_ipc_bind(address)
    _enable_ipv6_if_needed(sock, address)
    try:
        sock.bind(address)
    except zmq.ZMQError as exc:
        raise EndpointError("bind", address, exc.errno or 0, exc.strerror) from None
    if address.endswith((":0", ":*")):
        address = str(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    secure_ipc_file(address)
    return address


def connect_socket(sock: zmq.Socket[bytes], address: str) -> None:
    """Connect ``sock`` to ``address``; ipc: the path's directory is checked first
    (:func:`~ctlwire.transports.ipc_path.check_ipc_connect`). Raises
    :class:`EndpointError` (or ``IpcPathUnsafe``) and leaves ``sock`` for the caller
    to close."""
    check_ipc_connect(address)
    _enable_ipv6_if_needed(sock, address)
    try:
        sock.connect(address)
    except zmq.ZMQError as exc:
        raise EndpointError("connect", address, exc.errno or 0, exc.strerror) from None
