"""An engine's metrics, as one snapshot: the engine side of the one metrics shape
(:meth:`~ctlwire.kernel.engine.endpoint.EngineEndpoint.metrics`, the built-in
``ctlwire.metrics``). The ids of running requests it lists are the caller's own
on an engine several clients reach (a peer never reads another's)."""

from __future__ import annotations

from typing import Any, Protocol

from ctlwire.kernel.core.inbound_core import InboundCore
from ctlwire.kernel.engine.liveness import EngineLiveness
from ctlwire.kernel.engine.outbox import ReplyOutbox
from ctlwire.kernel.engine.serve import QueuedRequests
from ctlwire.kernel.tracing import trace_contexts
from ctlwire.transports.transport import EngineTransport

__all__ = ["engine_snapshot"]


class Engine(Protocol):
    """What a snapshot reads: an :class:`~ctlwire.kernel.engine.endpoint.EngineEndpoint`."""

    @property
    def rank(self) -> int: ...
    @property
    def incarnation(self) -> int: ...
    @property
    def methods(self) -> list[str]: ...
    @property
    def counters(self) -> dict[str, int]: ...
    @property
    def core(self) -> InboundCore: ...
    @property
    def liveness(self) -> EngineLiveness: ...
    @property
    def outbox(self) -> ReplyOutbox: ...
    @property
    def transport(self) -> EngineTransport: ...
    @property
    def queued_requests(self) -> QueuedRequests: ...

_ENGINE_DROPS = ("duplicates", "dropped_malformed", "dropped_oversized", "dropped_framing",
                 "dropped_wrong_type", "reply_send_failures", "replies_too_large")


def engine_snapshot(ep: Engine) -> dict[str, Any]:
    """``ep``'s metrics, every part's, one dict."""
    counters = ep.counters
    live = ep.liveness
    core, cache, outbox, transport = ep.core, ep.core.results, ep.outbox, ep.transport
    queued = ep.queued_requests
    return {
        "role": "engine",
        "rank": ep.rank,
        "incarnation": ep.incarnation,
        "live_requests": len(live.running),
        "outcomes": {s.name: n for s, n in core.states.items() if n},
        "frames_dropped": {k.removeprefix("dropped_"): counters.get(k, 0)
                           for k in _ENGINE_DROPS},
        "methods": ep.methods,
        # ids of running requests: the caller's own (a peer never reads another's)
        "running": live.visible_running(),
        "beacon": ep.liveness.beacon_active,
        "loops": ep.liveness.loops,
        "fence_high": core.fences.high,
        "fence_window": core.fences.window,
        # request ids remembered per route to drop duplicates, bounded
        "duplicate_filter": {"ids": len(core.duplicates),
                             "peers_evicted": core.duplicates.peers_evicted},
        "idempotency_cache": {"entries": len(cache), "bytes": cache.bytes,
                              "max_bytes": cache.max_bytes, "hits": cache.hits,
                              "evicted": cache.evicted, "refused_full": cache.refused_full,
                              "results_not_kept": cache.results_not_kept,
                              # each sender's share (its connection)
                              "owners": cache.owners,
                              "max_entries_per_owner": cache.max_entries_per_owner,
                              "max_bytes_per_owner": cache.max_bytes_per_owner},
        # serve mode: requests taken and not started, against their budgets
        "queued_requests": {"bytes": queued.held, "peak_bytes": queued.peak,
                            "limit_bytes": queued.limit, "requests": queued.count,
                            "routes": len(queued.routes),
                            "limit_per_route": queued.per_route,
                            "limit_bytes_per_route": queued.per_route_bytes,
                            "refused_busy": counters["busy"]},
        # replies waiting for clients that do not read, bounded per route and in total
        "outbox": {"replies": outbox.replies, "bytes": outbox.bytes,
                   "peak_bytes": outbox.peak_bytes, "routes": outbox.routes,
                   "stalled_routes": len(outbox.stalled),
                   # what libzmq itself may hold per connection (both directions)
                   "transport_bound_bytes_per_connection": transport.queued_bytes_bound()},
        # connections open on the transport's listening sockets, and those refused
        # because max_connections were open (engines that bind)
        "connections": {"open": transport.open_connections,
                        "refused": transport.connections_refused},
        # the request connection dialed again after libzmq gave up on it (engines that dial)
        "redials": transport.redials,
        # client routes refused because the route table was full of live ones
        "routes_refused": transport.routes_refused,
        # a beacon that binds: routes refused (its table full of live ones) and frames
        # that were not a client's hello
        "beacon_refused": transport.beacon_refusals,
        "counters": counters,
        # trace contexts the process's traced handlers read: continued, absent, invalid
        "trace_contexts": trace_contexts.snapshot(),
        # client keys this engine's CURVE authenticator refused (engines that bind)
        "auth_rejections": transport.auth_rejections,
    }
