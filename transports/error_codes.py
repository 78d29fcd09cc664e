"""The ``code`` of every error an engine answers with itself (``docs/protocol.md``,
Error codes): the one table of them, kept with the transports because codes cross
the wire. The engine, the client's typed errors and the conformance harness all
read it; a handler's own errors carry their exception's ``code`` attribute."""

from __future__ import annotations

from typing import Final

__all__ = ["ErrorCode"]


class ErrorCode:
    """Each error's ``code``, named after its wire type (``UnknownMethod``:
    :attr:`UNKNOWN_METHOD`). Several types share a code (its HTTP meaning); the
    type tells them apart."""

    MALFORMED_FRAME: Final = 400
    OPERATION_OWNED: Final = 403
    UNKNOWN_METHOD: Final = 404
    UNKNOWN_STEP_METHOD: Final = 404
    DEADLINE_EXPIRED: Final = 408
    FENCED: Final = 409
    STEP_IN_FLIGHT: Final = 409
    OPERATION_ABORTED: Final = 410
    STEP_NOT_APPLIED: Final = 412
    OVERSIZED_FRAME: Final = 413
    REPLY_TOO_LARGE: Final = 413
    KEY_TOO_LONG: Final = 414
    FENCE_OUT_OF_RANGE: Final = 416
    WRONG_RANK: Final = 421
    INVALID_PAYLOAD: Final = 422
    INVALID_STEP: Final = 422
    IN_PROGRESS: Final = 425
    STEP_OUT_OF_ORDER: Final = 425
    BUSY: Final = 429
    RESULT_NOT_ENCODABLE: Final = 500
    ASYNC_HANDLER_IN_POLL: Final = 501
    UNSUPPORTED_PROTOCOL_VERSION: Final = 505
    CACHE_FULL: Final = 507
    RESULT_NOT_RETAINED: Final = 507
