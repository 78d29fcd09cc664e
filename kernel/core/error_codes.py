"""The ``code`` of each error an engine produces itself (the protocol's error table,
``docs/protocol.md``); a handler's own errors carry their exception's ``code``."""

from __future__ import annotations

from ctlwire.kernel.errors import BUSY_CODE, FENCED_CODE
from ctlwire.transports.protocol_version import UNSUPPORTED_VERSION_CODE

__all__ = ["ErrorCode"]


class ErrorCode:
    """``code`` values of the errors the endpoint itself produces."""

    UNKNOWN_METHOD = 404
    INVALID_PAYLOAD = 422
    DEADLINE_EXPIRED = 408
    MALFORMED_FRAME = 400
    OVERSIZED_FRAME = 413
    WRONG_RANK = 421
    RESULT_NOT_ENCODABLE = 500
    ASYNC_HANDLER_IN_POLL = 501
    FENCED = FENCED_CODE
    IN_PROGRESS = 425
    BUSY = BUSY_CODE
    FENCE_OUT_OF_RANGE = 416
    KEY_TOO_LONG = 414
    CACHE_FULL = 507
    UNSUPPORTED_PROTOCOL_VERSION = UNSUPPORTED_VERSION_CODE
