"""An engine transport that forwards every member of :class:`EngineTransport` to the
one it wraps: the tests' wrappers derive from it and override what they intercept."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

from ctlwire.transports.envelope import Envelope, Heartbeat
from ctlwire.transports.transport import EngineTransport, Route, TransportEvent


class Forwarding(EngineTransport):
    def __init__(self, inner: EngineTransport) -> None:
        self.inner = inner
        self.codec = inner.codec
        self.rank = inner.rank
        self.routed = inner.routed

    def try_receive(self) -> TransportEvent | None:
        return self.inner.try_receive()

    async def receive(self) -> TransportEvent:
        return await self.inner.receive()

    def receive_one(self, timeout: float = 0.0) -> TransportEvent | None:
        return self.inner.receive_one(timeout)

    def wait_readable(self, timeout: float) -> bool:
        return self.inner.wait_readable(timeout)

    def send_encoded_nowait(self, route: Route, data: bytes) -> None:
        self.inner.send_encoded_nowait(route, data)

    def send_nowait(self, route: Route, envelope: Envelope) -> None:
        self.inner.send_nowait(route, envelope)

    def heartbeat_routes(self) -> Iterable[Route]:
        return self.inner.heartbeat_routes()

    def open(self) -> None:
        self.inner.open()

    def close(self) -> None:
        self.inner.close()

    async def __aenter__(self) -> Forwarding:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.inner.__aexit__(exc_type, exc, tb)

    def upkeep(self) -> None:
        self.inner.upkeep()

    def start_beacon(self, interval: float, status: Callable[[], Heartbeat | None]) -> bool:
        return self.inner.start_beacon(interval, status)

    def peer_key(self, route: Route) -> str | None:
        return self.inner.peer_key(route)

    def queued_bytes_bound(self) -> int:
        return self.inner.queued_bytes_bound()

    def __getattr__(self, name: str) -> Any:  # what only the inner transport has
        return getattr(self.inner, name)

    @property
    def open_connections(self) -> int:
        return self.inner.open_connections

    @property
    def connections_refused(self) -> int:
        return self.inner.connections_refused

    @property
    def routes_refused(self) -> int:
        return self.inner.routes_refused

    @property
    def redials(self) -> int:
        return self.inner.redials

    @property
    def auth_rejections(self) -> int:
        return self.inner.auth_rejections

    @property
    def beacon_refusals(self) -> dict[str, int]:
        return self.inner.beacon_refusals
