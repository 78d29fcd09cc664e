"""The wire protocol's version (``docs/protocol.md``), announced in every request and heartbeat.

A version is ``major.minor``, carried as one integer ``major << 8 | minor``
(``1.0`` is 256) in the last field of :class:`~ctlwire.transports.envelope.Request`
and :class:`~ctlwire.transports.envelope.Heartbeat`; a frame without that field
is version 1.0 (it was written before versions were announced).

* A **minor** version only adds optional trailing fields, which older peers
  ignore: any minor of a supported major is accepted.
* A peer announcing another **major** version is refused: a client drops its
  heartbeats and replies (counted) and fails calls to that rank with a typed error;
  an engine answers its requests with ``UnsupportedProtocolVersion``
  (:attr:`~ctlwire.transports.error_codes.ErrorCode.UNSUPPORTED_PROTOCOL_VERSION`)
  without running them and drops its heartbeats (counted).
"""

from __future__ import annotations

__all__ = [
    "PROTOCOL_MAJOR",
    "PROTOCOL_MINOR",
    "PROTOCOL_VERSION",
    "pack_version",
    "supported_version",
    "version_text",
]

PROTOCOL_MAJOR = 1
PROTOCOL_MINOR = 0


def pack_version(major: int, minor: int) -> int:
    """The wire integer of ``major.minor`` (each 0..255)."""
    if not (0 <= major <= 255 and 0 <= minor <= 255):
        raise ValueError(f"protocol version {major}.{minor}: each part is 0..255")
    return major << 8 | minor


PROTOCOL_VERSION = pack_version(PROTOCOL_MAJOR, PROTOCOL_MINOR)
"""This implementation's version, as it goes on the wire."""

def supported_version(version: int) -> bool:
    """Whether a peer announcing ``version`` (the wire integer) is spoken to."""
    return version >> 8 == PROTOCOL_MAJOR


def version_text(version: int) -> str:
    """``"major.minor"`` of a wire integer (any integer a peer may send)."""
    if not 0 <= version <= 0xFFFF:
        return f"invalid ({version})"
    return f"{version >> 8}.{version & 0xFF}"
