"""Helpers for testing engines and callers built on ctlwire.

* :class:`EngineHarness` — N :class:`EngineEndpoint` ranks and a
  :class:`ControlClient` joined by the in-memory transport, in one event loop::

      async with EngineHarness(ranks=2, setup=register_my_methods) as h:
          assert await h.client.call("get_load", rank=1) == 0

* :class:`TransitionRecorder` — an observer that records the sequence of
  ``ControlRequest`` states every request went through, so a test can assert
  the path (``recorder.assert_path(request_id, ["REGISTERED", "SENT", ...])``).

* :class:`VirtualTimeEventLoop` and :func:`virtual_backend` — run timeouts
  of minutes in milliseconds on both anyio backends: trio's ``MockClock`` with
  autojump, and an asyncio loop whose clock jumps to the next timer whenever no
  IO is ready. Use them as the ``anyio_backend`` fixture's params, or through
  the pytest plugin (:mod:`ctlwire.kernel.testing.pytest_plugin`).

Heartbeats run on the event loop's clock, so on a virtual clock they are
virtual too; but each one still costs real work. On a virtual clock
``EngineHarness(heartbeat_interval="auto")`` (the plugin's default) therefore
beats every :data:`VIRTUAL_HEARTBEAT_INTERVAL` (virtual) seconds, which keeps a
600 s timeout to a few milliseconds of real time (at 0.25 s it is 2,400 beats per side).
"""

from __future__ import annotations

import asyncio
import selectors
import socket
from collections import defaultdict
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Literal

import anyio
from anyio.abc import TaskGroup

from ctlwire.kernel.control_client import ControlClient
from ctlwire.kernel.engine_endpoint import EngineEndpoint
from ctlwire.kernel.request_registry import PendingRequest
from ctlwire.states import RequestEvent, RequestState
from ctlwire.transports.codec import Codec
from ctlwire.transports.memory import MemoryNetwork
from ctlwire.transports.transport import ClientTransport, EngineTransport

__all__ = [
    "VIRTUAL_HEARTBEAT_INTERVAL",
    "EngineHarness",
    "TransitionRecorder",
    "VirtualTimeEventLoop",
    "free_tcp_address",
    "free_tcp_port",
    "on_virtual_clock",
    "virtual_backend",
]

VIRTUAL_HEARTBEAT_INTERVAL = 5.0
"""Heartbeat interval (virtual seconds) of an :class:`EngineHarness` on a virtual
clock, when neither ``heartbeat_interval`` nor the client/engine kwargs set one."""

_AUTO: Any = object()


def free_tcp_port(host: str = "127.0.0.1", *, attempts: int = 64) -> int:
    """A tcp port P on ``host`` such that P *and* P+1 are free right now.

    An engine that binds ``tcp://H:P`` binds its liveness beacon at P+1
    (:func:`~ctlwire.transports.zmq_config.beacon_address_for`), so a test that
    probes only P can collide on P+1 with any other socket on the machine. Both
    ports are held at once while probing; like any free-port probe this races
    other processes, only far more narrowly. Raises :class:`OSError` after
    ``attempts`` tries without a free pair."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(attempts):
        with socket.socket(family) as first:
            first.bind((host, 0))
            port = int(first.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket(family) as second:
                try:
                    second.bind((host, port + 1))
                except OSError:
                    continue
                return port
    raise OSError(f"no two adjacent free tcp ports on {host} after {attempts} tries")


def free_tcp_address(host: str = "127.0.0.1") -> str:
    """``tcp://host:P`` for :func:`free_tcp_port` (IPv6 hosts bracketed)."""
    shown = f"[{host}]" if ":" in host else host
    return f"tcp://{shown}:{free_tcp_port(host)}"


def on_virtual_clock() -> bool:
    """True inside an event loop that runs on a virtual clock
    (:class:`VirtualTimeEventLoop`, or trio with a ``MockClock``)."""
    try:
        import sniffio

        library = sniffio.current_async_library()
    except Exception:
        return False
    if library == "asyncio":
        return isinstance(asyncio.get_running_loop(), VirtualTimeEventLoop)
    if library == "trio":
        import trio
        from trio.testing import MockClock

        return isinstance(trio.lowlevel.current_clock(), MockClock)
    return False


class TransitionRecorder:
    """Records every ControlRequest transition; pass as ``ControlClient(observer=...)``."""

    def __init__(self) -> None:
        self.paths: dict[int, list[RequestState]] = defaultdict(list)
        self.events: dict[int, list[RequestEvent]] = defaultdict(list)
        self.methods: dict[int, str] = {}

    def __call__(self, entry: PendingRequest, old: RequestState, event: RequestEvent,
                 new: RequestState) -> None:
        path = self.paths[entry.id]
        if not path:
            path.append(old)
            self.methods[entry.id] = entry.method
        path.append(new)
        self.events[entry.id].append(event)

    def path(self, request_id: int) -> list[str]:
        return [s.name for s in self.paths[request_id]]

    def ids(self, method: str | None = None) -> list[int]:
        """Request ids seen, in first-transition order (optionally one method's)."""
        return [rid for rid, m in self.methods.items() if method is None or m == method]

    def assert_path(self, request_id: int, expected: Sequence[str | RequestState]) -> None:
        want = [s.name if isinstance(s, RequestState) else s for s in expected]
        got = self.path(request_id)
        if got != want:
            raise AssertionError(f"request {request_id}: went {got}, expected {want}")

    def assert_all_cleaned(self) -> None:
        unfinished = {rid: self.path(rid) for rid, p in self.paths.items()
                      if not p or p[-1] is not RequestState.CLEANED}
        if unfinished:
            raise AssertionError(f"requests not cleaned: {unfinished}")


class EngineHarness:
    """In-memory engines and a client; see the module docstring.

    ``setup(endpoint)`` registers methods on each rank's endpoint. Engines
    ``serve()`` in tasks of the harness; :meth:`stop_engine` closes one rank's
    transport (the client sees it disconnect), :meth:`start_engine` brings a
    rank back under a new incarnation. ``wrap_client`` / ``wrap_engine`` wrap
    the in-memory transports, e.g. in
    :class:`~ctlwire.transports.testing.FaultyClientTransport`.

    ``heartbeat_interval`` sets the client's and the engines' interval (None:
    no heartbeats); by default they keep their own (0.25 s). ``"auto"`` (what
    the pytest plugin's ``ctlwire_harness`` passes) keeps 0.25 s on a real
    clock and uses :data:`VIRTUAL_HEARTBEAT_INTERVAL` on a virtual one (the
    harness must then be created inside the event loop). ``client_kwargs``
    and ``engine_kwargs`` win over it.

    Leaving the ``async with`` block closes the client before the engines
    stop, so a normal exit is not reported as engines lost.
    """

    def __init__(self, ranks: int = 1, setup: Callable[[EngineEndpoint], None] | None = None, *,
                 codec: Codec | None = None, client_kwargs: dict[str, Any] | None = None,
                 engine_kwargs: dict[str, Any] | None = None, buffer: int = 1024,
                 observer: TransitionRecorder | None = None,
                 wrap_client: Callable[[ClientTransport], ClientTransport] | None = None,
                 wrap_engine: Callable[[EngineTransport], EngineTransport] | None = None,
                 heartbeat_interval: float | Literal["auto"] | None = _AUTO) -> None:
        self.network = MemoryNetwork(codec, buffer=buffer)
        self.setup = setup
        self.n = ranks
        self.engine_kwargs = dict(engine_kwargs or {})
        self.wrap_engine = wrap_engine
        kwargs = dict(client_kwargs or {})
        if heartbeat_interval == "auto":
            heartbeat_interval = VIRTUAL_HEARTBEAT_INTERVAL if on_virtual_clock() else _AUTO
        if heartbeat_interval is not _AUTO:
            kwargs.setdefault("heartbeat_interval", heartbeat_interval)
            self.engine_kwargs.setdefault("heartbeat_interval", heartbeat_interval)
        self.heartbeat_interval: float | None = kwargs.get("heartbeat_interval", 0.25)
        if observer is not None:
            kwargs["observer"] = observer
        transport: ClientTransport = self.network.client_transport()
        if wrap_client is not None:
            transport = wrap_client(transport)
        self.client = ControlClient(transport, ranks=ranks, **kwargs)
        self.engines: dict[int, EngineEndpoint] = {}
        self._scopes: dict[int, anyio.CancelScope] = {}
        self._tg: TaskGroup | None = None

    async def __aenter__(self) -> EngineHarness:
        await self.client.__aenter__()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        for rank in range(self.n):
            await self.start_engine(rank)
        await self.client.wait_ready(timeout=5.0)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        tg, self._tg = self._tg, None
        assert tg is not None
        # the client first: engines that stop after it are a shutdown, not a loss
        await self.client.aclose()
        tg.cancel_scope.cancel()
        await tg.__aexit__(None, None, None)
        return await self.client.__aexit__(exc_type, exc, tb)

    def endpoint(self, rank: int) -> EngineEndpoint:
        transport: EngineTransport = self.network.engine_transport(rank)
        if self.wrap_engine is not None:
            transport = self.wrap_engine(transport)
        ep = EngineEndpoint(transport, **self.engine_kwargs)
        if self.setup is not None:
            self.setup(ep)
        return ep

    async def start_engine(self, rank: int) -> EngineEndpoint:
        assert self._tg is not None
        ep = self.endpoint(rank)
        self.engines[rank] = ep
        scope = anyio.CancelScope()
        self._scopes[rank] = scope

        async def run(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            with scope:
                await ep.serve(task_status=task_status)

        await self._tg.start(run)
        return ep

    def stop_engine(self, rank: int) -> None:
        """Stop serving ``rank`` and close its transport (a crash, as the client sees it)."""
        self._scopes[rank].cancel()
        self.engines[rank].transport.close()


class VirtualTimeEventLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose clock jumps ahead to the next timer when no IO is ready.

    Like trio's ``MockClock(autojump_threshold=0)``: a 600 s timeout fires
    immediately once every task is blocked. Real IO is still polled (without
    waiting) before each jump; waiting with no timer pending blocks for real.
    """

    def __init__(self) -> None:
        super().__init__(selectors.DefaultSelector())
        self._virtual_now = 0.0
        selector = self._selector  # type: ignore[attr-defined]
        real_select = selector.select

        def select(timeout: float | None = None) -> list[Any]:
            if timeout is None:
                return list(real_select(None))
            ready = list(real_select(0))
            if not ready and timeout > 0:
                self._virtual_now += timeout
            return ready

        selector.select = select

    def time(self) -> float:
        return self._virtual_now


def virtual_backend(name: str) -> tuple[str, dict[str, Any]]:
    """An ``anyio_backend`` value running ``name`` ("asyncio" or "trio") on a fresh
    virtual clock. Use in a test module::

        @pytest.fixture(params=["asyncio", "trio"])
        def anyio_backend(request):
            return virtual_backend(request.param)
    """
    if name == "asyncio":
        return ("asyncio", {"loop_factory": VirtualTimeEventLoop})
    if name == "trio":
        from trio.testing import MockClock  # trio is a test dependency

        return ("trio", {"clock": MockClock(autojump_threshold=0)})
    raise ValueError(f"unknown anyio backend {name!r}")
