"""Errors of the transport layer. The kernel maps them to request outcomes.

:class:`CtlwireError`, the base class of every exception ctlwire raises on
purpose, is defined here, in the lowest layer that raises one; the kernel
re-exports it (``from ctlwire.kernel import CtlwireError``)."""

from __future__ import annotations

__all__ = [
    "AuthenticationFailed",
    "CtlwireError",
    "EndpointError",
    "ForeignThreadError",
    "MalformedFrame",
    "OversizedFrame",
    "PickleRefused",
    "ProtocolVersionRefused",
    "SocketClosed",
    "TransportClosed",
    "TransportError",
    "Unroutable",
    "WouldBlock",
]


class CtlwireError(Exception):
    """Base class of every exception ctlwire raises on purpose (an argument error
    is also a ``ValueError`` or ``TypeError``)."""


class TransportError(CtlwireError):
    """Base class of every transport error."""


class TransportClosed(TransportError):
    """The transport was closed; no more frames will be sent or received."""


class SocketClosed(TransportClosed):
    """The socket was closed while an operation was waiting on it."""


class Unroutable(TransportError):
    """No connected peer for this rank (ROUTER_MANDATORY, or no such engine)."""

    def __init__(self, rank: int, detail: str = "") -> None:
        self.rank = rank
        self.detail = detail
        super().__init__(f"rank {rank} is not reachable" + (f": {detail}" if detail else ""))


class AuthenticationFailed(Unroutable):
    """The peer refused this side's CURVE key during the handshake (its
    authenticator's allow-list does not hold it): nothing can be delivered
    until the key is allowed."""


class ProtocolVersionRefused(Unroutable):
    """The engine for this rank announced a protocol major version this side does
    not speak (``docs/protocol.md``, Versioning): nothing is sent to it until it
    announces a supported one. ``version`` is the wire integer it announced."""

    def __init__(self, rank: int, version: int, detail: str = "") -> None:
        self.version = version
        super().__init__(rank, detail)


class WouldBlock(TransportError):
    """A non-blocking send found the high-water mark reached."""


class MalformedFrame(TransportError):
    """A frame could not be decoded into an envelope."""


class OversizedFrame(MalformedFrame):
    """A frame is larger than the configured maximum message size."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"frame of {size} bytes exceeds the limit of {limit} bytes")


class PickleRefused(TransportError):
    """Pickle was asked for where it is not allowed (not enabled, or tcp without CURVE)."""


class ForeignThreadError(CtlwireError, RuntimeError):
    """A socket was used from a thread other than the one that owns it."""


class EndpointError(TransportError):
    """A bind or connect that libzmq refused (address in use, malformed, no port, ...).

    The socket is closed by the transport before this propagates, so closing the
    transport (and terminating its context) never hangs on it.
    """

    def __init__(self, operation: str, address: str, errno: int, detail: str) -> None:
        self.operation = operation
        self.address = address
        self.errno = errno
        super().__init__(f"cannot {operation} {address}: {detail}")
