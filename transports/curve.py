"""CURVE encryption and authentication for tcp transports.

* :func:`generate_keypair` / :func:`write_keypair` / :func:`load_keypair` —
  z85 key pairs, stored as pyzmq certificate files (``ctlwire keys generate DIR``).
* :class:`CurveServerConfig` — for the binding side: its key pair and the
  allow-list of client public keys. A ZAP authenticator (pyzmq's
  ``ThreadAuthenticator``, a thread of its own, so it works under asyncio and
  trio alike) rejects every client whose key is not listed; a CURVE server
  *without* an authenticator would encrypt but accept any client key, so one
  is always installed.
* :class:`CurveClientConfig` — for the connecting side: its key pair and the
  server's public key.

**Ranks bound to keys.** A routing identity (``rank-N``, ``beat-N``) is bytes
a peer chooses. ``CurveServerConfig.allowing(keys, clients, ranks={0: key0})``
binds each rank to its public key(s): the authenticator gives every accepted
connection its key (z85) as ZAP ``User-Id``, which libzmq attaches to each
message, and the client's ROUTER drops and counts a frame whose identity names
a rank its key is not bound to (libzmq's ZAP request does not carry the
peer's routing id: its identity frame is the server socket's own, so the check
is per message, after the handshake). Rank N's requests go only to the
connection last heard authenticated with rank N's key (engines under CURVE tag
their identities, ``rank-N.TAG``), so another key connecting as ``rank-N`` never
receives them. A client's ROUTER requires ``ranks=``
(:meth:`CurveServerConfig.require_rank_binding`, :class:`RanksUnbound`) unless
``any_rank=True`` says explicitly that any allow-listed key may speak for any rank.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from ctlwire.transports.errors import CtlwireError
from ctlwire.transports.rate_limited_log import RateLimitedLog

__all__ = [
    "CurveAuthenticator",
    "CurveClientConfig",
    "CurveServerConfig",
    "KeyPair",
    "RanksUnbound",
    "generate_keypair",
    "load_keypair",
    "load_public_key",
    "write_keypair",
]

log = logging.getLogger("ctlwire.curve")


@dataclass(frozen=True)
class KeyPair:
    public: bytes
    secret: bytes

    def __repr__(self) -> str:
        """The public key only: a key pair printed or logged never shows its secret
        (nor does a config holding one, whose repr shows its fields' reprs)."""
        return f"KeyPair(public={self.public!r}, secret=<hidden>)"

    __str__ = __repr__


def generate_keypair() -> KeyPair:
    public, secret = zmq.curve_keypair()
    return KeyPair(public, secret)


def write_keypair(directory: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """Create ``NAME.key`` (public) and ``NAME.key_secret`` (mode 0600) in ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    public_file, secret_file = zmq.auth.create_certificates(str(d), name)
    os.chmod(secret_file, 0o600)
    return Path(public_file), Path(secret_file)


def load_keypair(secret_file: str | os.PathLike[str]) -> KeyPair:
    """The key pair in a ``.key_secret`` certificate file."""
    public, secret = zmq.auth.load_certificate(str(secret_file))
    if secret is None:
        raise ValueError(f"{secret_file} holds no secret key")
    return KeyPair(public, secret)


def load_public_key(public_file: str | os.PathLike[str]) -> bytes:
    public, _ = zmq.auth.load_certificate(str(public_file))
    return public


_NO_KEYS: frozenset[str] = frozenset()


class RanksUnbound(CtlwireError, ValueError):
    """A CURVE server for engine ranks whose keys are not bound to ranks (``ranks=``),
    without the explicit ``any_rank=True``."""


@dataclass(frozen=True)
class CurveServerConfig:
    """The binding side: its keys and the client public keys (z85) it accepts."""

    keys: KeyPair
    allowed_clients: frozenset[bytes] = field(default_factory=frozenset)
    #: rank -> the z85 public keys that may speak for it (empty: identities unchecked)
    rank_keys: tuple[tuple[int, frozenset[str]], ...] = ()
    #: explicitly: any allow-listed key may speak for any rank (no ``ranks=``)
    any_rank: bool = False
    _by_rank: dict[int, frozenset[str]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # a lookup per frame received: one dict access, not a scan of every rank
        object.__setattr__(self, "_by_rank", dict(self.rank_keys))

    @classmethod
    def allowing(cls, keys: KeyPair, clients: Iterable[bytes] = (), *,
                 ranks: Mapping[int, bytes | str | Iterable[bytes | str]] | None = None,
                 any_rank: bool = False) -> CurveServerConfig:
        """Accept ``clients``' keys; with ``ranks``, bind each rank to its key(s)
        (those keys are accepted too) so no other key can speak as that rank.

        A client's ROUTER (the server for engine ranks) requires ``ranks`` unless
        ``any_rank=True``: then any allow-listed key can send replies and heartbeats
        as any rank. An engine's ROUTER (the server for clients) needs neither."""
        if ranks and any_rank:
            raise ValueError("ranks= binds ranks to keys; any_rank=True says none is bound: "
                             "pass one of them")
        bound: dict[int, frozenset[str]] = {}
        for rank, given in (ranks or {}).items():
            many = [given] if isinstance(given, (bytes, str)) else list(given)
            bound[int(rank)] = frozenset(_z85(k) for k in many)
        allowed = frozenset(clients) | frozenset(
            k.encode() for ks in bound.values() for k in ks)
        return cls(keys, allowed, tuple(sorted(bound.items())), any_rank)

    @property
    def binds_ranks(self) -> bool:
        return bool(self.rank_keys)

    def require_rank_binding(self) -> None:
        """Raise :class:`RanksUnbound` unless ranks are bound to keys or ``any_rank``."""
        if not self.rank_keys and not self.any_rank:
            raise RanksUnbound(
                "a CURVE server for engine ranks needs ranks={rank: public_key, ...} so that "
                "only rank R's key can speak as rank R (without it, any allow-listed key can "
                "forge any rank's replies and heartbeats); pass any_rank=True to accept that")

    def keys_for_rank(self, rank: int) -> frozenset[str]:
        """The z85 keys that may speak as ``rank`` (empty: none may)."""
        return self._by_rank.get(rank, _NO_KEYS)

    def apply(self, sock: zmq.Socket[bytes]) -> None:
        sock.curve_secretkey = self.keys.secret
        sock.curve_publickey = self.keys.public
        sock.curve_server = True


@dataclass(frozen=True)
class CurveClientConfig:
    """The connecting side: its keys and the server's public key.

    A client that connects to several engine ranks (which bind) names each rank's
    own server key with :meth:`for_ranks`, so that only rank R's engine can answer
    and heartbeat as rank R; one ``server_key`` shared by several ranks lets any
    engine holding that secret pose as any of them, and needs ``any_rank=True``
    there (:meth:`require_rank_binding`)."""

    keys: KeyPair
    server_key: bytes = b""
    #: rank -> the public key of that rank's engine (overrides ``server_key``)
    rank_server_keys: tuple[tuple[int, bytes], ...] = ()
    #: explicitly: one server key for every rank
    any_rank: bool = False

    @classmethod
    def for_ranks(cls, keys: KeyPair, servers: Mapping[int, bytes]) -> CurveClientConfig:
        """Connect to rank R's engine only if it proves ``servers[R]``."""
        return cls(keys, b"", tuple(sorted((int(r), k) for r, k in servers.items())))

    def server_key_for(self, rank: int | None) -> bytes:
        """The server key rank ``rank``'s engine must prove (``server_key`` when none
        is named for it)."""
        for r, key in self.rank_server_keys:
            if r == rank:
                return key
        return self.server_key

    def require_rank_binding(self, ranks: Iterable[int]) -> None:
        """Raise :class:`RanksUnbound` unless each of ``ranks`` has a server key of its
        own (or there is one rank, or ``any_rank``); ValueError when one has none."""
        ranks = list(ranks)
        missing = [r for r in ranks if not self.server_key_for(r)]
        if missing:
            raise ValueError(f"no CURVE server key for ranks {missing}")
        keys = [self.server_key_for(r) for r in ranks]
        if len(set(keys)) < len(keys) and not self.any_rank:
            raise RanksUnbound(
                "several engine ranks share one CURVE server key: any engine holding it "
                "could answer and heartbeat as any of them; give each rank its own key "
                "(CurveClientConfig.for_ranks) or pass any_rank=True to accept that")

    def apply(self, sock: zmq.Socket[bytes], rank: int | None = None) -> None:
        sock.curve_secretkey = self.keys.secret
        sock.curve_publickey = self.keys.public
        sock.curve_serverkey = self.server_key_for(rank)


def _z85(key: bytes | str) -> str:
    return key.decode() if isinstance(key, bytes) else key


class _AllowList:
    def __init__(self, keys: frozenset[bytes]) -> None:
        self.keys = {k.decode() if isinstance(k, bytes) else k for k in keys}
        self.rejected = 0
        # a peer chooses how often it is refused: one line per interval, with a count
        self.refusals = RateLimitedLog(log)

    def callback(self, domain: str, key: bytes | str) -> bool:
        z85 = key.decode() if isinstance(key, bytes) else key
        if z85 in self.keys:
            return True
        self.rejected += 1
        self.refusals.warning("refused-key", "ctlwire: rejected CURVE client key %s", z85)
        return False


class CurveAuthenticator:
    """A ZAP handler on ``context`` that accepts only allow-listed client keys.

    One per context (ZAP is per context). Start before binding; stop after
    closing the sockets it guards.
    """

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]], config: CurveServerConfig
                 ) -> None:
        self._allow = _AllowList(config.allowed_clients)
        self._auth = ThreadAuthenticator(context, log=log)
        self._started = False

    @property
    def rejected(self) -> int:
        """Handshakes refused so far."""
        return self._allow.rejected

    def start(self) -> None:
        if self._started:
            return
        self._auth.start()
        self._auth.configure_curve_callback("*", credentials_provider=self._allow)
        self._started = True

    def stop(self) -> None:
        if self._started:
            self._auth.stop()
            self._started = False
