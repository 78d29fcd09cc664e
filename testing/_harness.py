"""EngineHarness: N engine ranks and a ControlClient over the in-memory transport.

::

    async with EngineHarness(ranks=2, setup=register_my_methods) as h:
        assert await h.client.call("get_load", rank=1) == 0

    # a synchronous busy-loop engine: setup returns its step, the harness runs
    # step(); endpoint.poll() in a loop, as the engine's own process would
    async with EngineHarness(ranks=2, setup=register_and_return_step, mode="poll") as h:
        ...
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal

import anyio
from anyio.abc import TaskGroup

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.testing._recorder import TransitionRecorder
from ctlwire.testing._virtual_clock import VIRTUAL_HEARTBEAT_INTERVAL, on_virtual_clock
from ctlwire.transports.codec import Codec
from ctlwire.transports.memory import MemoryNetwork
from ctlwire.transports.transport import ClientTransport, EngineTransport

__all__ = ["EngineHarness"]

_AUTO: Any = object()


class EngineHarness:
    """In-memory engines and a client, as in the examples above.

    ``setup(endpoint)`` registers methods on each rank's endpoint. Engines
    ``serve()`` in tasks of the harness; :meth:`stop_engine` closes one rank's
    transport (the client sees it disconnect), :meth:`start_engine` brings a
    rank back under a new incarnation. ``wrap_client`` / ``wrap_engine`` wrap
    the in-memory transports, e.g. in
    :class:`~ctlwire.testing.faults.FaultyClientTransport`.

    ``heartbeat_interval`` sets the client's and the engines' interval (None:
    no heartbeats); by default they keep their own (0.25 s). ``"auto"`` (what
    the pytest plugin's ``ctlwire_harness`` passes) keeps 0.25 s on a real
    clock and uses :data:`VIRTUAL_HEARTBEAT_INTERVAL` on a virtual one (the
    harness must then be created inside the event loop). ``client_kwargs``
    and ``engine_kwargs`` win over it.

    ``mode="poll"`` runs each rank as a synchronous engine does: a loop of
    ``step()`` (the callable ``setup`` returned, if any: the same contract as
    ``engine_process --methods``) then :meth:`~ctlwire.kernel.engine.endpoint.EngineEndpoint.poll`,
    yielding to the event loop between iterations (``idle_wait`` seconds when
    ``step`` did no work). Handlers run one at a time, between steps, as in the
    engine's process; the in-memory transport lives in the event loop, so a step
    that blocks its thread blocks the client too (test blocking on real processes).

    Leaving the ``async with`` block closes the client before the engines
    stop, so a normal exit is not reported as engines lost.
    """

    def __init__(self, ranks: int = 1, setup: Callable[[EngineEndpoint], object] | None = None, *,
                 codec: Codec | None = None, client_kwargs: dict[str, Any] | None = None,
                 engine_kwargs: dict[str, Any] | None = None, buffer: int = 1024,
                 observer: TransitionRecorder | None = None,
                 wrap_client: Callable[[ClientTransport], ClientTransport] | None = None,
                 wrap_engine: Callable[[EngineTransport], EngineTransport] | None = None,
                 heartbeat_interval: float | Literal["auto"] | None = _AUTO,
                 mode: Literal["serve", "poll"] = "serve", idle_wait: float = 0.005) -> None:
        if mode not in ("serve", "poll"):
            raise ValueError(f"mode must be 'serve' or 'poll', not {mode!r}")
        self.mode = mode
        self.idle_wait = idle_wait
        self.steps: dict[int, Callable[[], object] | None] = {}
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

    @property
    def running(self) -> bool:
        """Inside its ``async with``: engines and client started, not yet exited."""
        return self._tg is not None

    def endpoint(self, rank: int) -> EngineEndpoint:
        transport: EngineTransport = self.network.engine_transport(rank)
        if self.wrap_engine is not None:
            transport = self.wrap_engine(transport)
        ep = EngineEndpoint(transport, **self.engine_kwargs)
        step = self.setup(ep) if self.setup is not None else None
        self.steps[rank] = step if callable(step) else None
        return ep

    async def start_engine(self, rank: int) -> EngineEndpoint:
        assert self._tg is not None
        ep = self.endpoint(rank)
        self.engines[rank] = ep
        scope = anyio.CancelScope()
        self._scopes[rank] = scope

        async def run(*, task_status: anyio.abc.TaskStatus[None]) -> None:
            with scope:
                if self.mode == "serve":
                    await ep.serve(task_status=task_status)
                else:
                    await self._poll_loop(ep, self.steps.get(rank), task_status)

        await self._tg.start(run)
        return ep

    async def _poll_loop(self, ep: EngineEndpoint, step: Callable[[], object] | None,
                         task_status: anyio.abc.TaskStatus[None]) -> None:
        ep.open()
        try:
            task_status.started()
            while True:
                worked = bool(step()) if step is not None else False
                ep.poll()
                await anyio.sleep(0 if worked else self.idle_wait)
        finally:
            ep.close()

    def stop_engine(self, rank: int) -> None:
        """Stop serving ``rank`` and close its transport (a crash, as the client sees it)."""
        self._scopes[rank].cancel()
        self.engines[rank].transport.close()
