"""The state the parts of an :class:`~ctlwire.kernel.engine_endpoint.EngineEndpoint`
share (declared here, set in ``EngineEndpoint.__init__``).

The endpoint is composed of parts, one module each: the allow-list
(:mod:`~ctlwire.kernel.engine_registry`), liveness and progress
(:mod:`~ctlwire.kernel.engine_liveness`), admission and running of a request
(:mod:`~ctlwire.kernel.engine_admission`), the reply outbox
(:mod:`~ctlwire.kernel.engine_outbox`) and the serve loop
(:mod:`~ctlwire.kernel.engine_serve`). Each part declares what it reads;
what more than one part reads is declared here."""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec

from ctlwire.kernel.core.result_cache import ResultCache
from ctlwire.kernel.engine_registry import MethodRegistry
from ctlwire.states import InboundState
from ctlwire.transports.envelope import ErrorInfo, Reply
from ctlwire.transports.transport import EngineTransport

__all__ = ["EngineBase", "log"]

log = logging.getLogger("ctlwire.engine")


class EngineBase(MethodRegistry):
    """What every part of the endpoint reads (see the module docstring)."""

    transport: EngineTransport
    rank: int
    incarnation: int
    clock: Callable[[], float]
    heartbeat_interval: float | None
    mailbox_size: int
    counters: dict[str, int]
    states: dict[InboundState, int]
    results: ResultCache
    running: dict[int, tuple[str, float]]
    _progress: dict[int, tuple[float, str]]
    _last_loop: float
    _polling: bool
    _nil: msgspec.Raw
    # the fast path's encoded OK reply (engine_outbox.ok_reply_encoder), or None
    _ok_reply: Callable[[int, bytes], bytes] | None
    _max_reply_size: int

    def _error_reply(self, request_id: int, type_name: str, message: str, code: int) -> Reply:
        return Reply(request_id, self.rank, self.incarnation, False, self.codec.encode_value(None),
                     ErrorInfo(type_name, message, code))
