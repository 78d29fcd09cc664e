"""The engine processes a bench run needs, started once, stopped on every path.

:class:`FleetPool` starts fleets lazily by name (so ``--only`` starts only
what its groups use) and stops all of them in :meth:`FleetPool.close`, which
the runner calls in ``finally``: no process is left behind, even when a
scenario fails or the bench is interrupted. Every fleet dials an ipc address
inside one private ``0700`` directory that is removed at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from types import TracebackType

from ctlwire.app.engine_fleet import EngineFleet

__all__ = ["BENCH_METHODS", "FleetPool", "ModuleFleet"]

BENCH_METHODS = "ctlwire.app.engine_process:diagnostic_methods"


class ModuleFleet(EngineFleet):
    """An :class:`EngineFleet` whose processes run another module (a baseline engine).

    The module takes ``--rank N`` plus ``args_for(rank)`` and prints
    ``READY <rank> <incarnation>`` like ``ctlwire.app.engine_process``.
    """

    def __init__(self, module: str, ranks: int | Sequence[int],
                 args_for: Callable[[int], list[str]], *, ready_timeout: float = 30.0) -> None:
        super().__init__(ranks, args_for, ready_timeout=ready_timeout)
        self.module = module

    def command(self, rank: int) -> list[str]:
        return [self.python, "-m", self.module, "--rank", str(rank), *self.args_for(rank)]


class FleetPool:
    """Named fleets, each at its own ipc address, started on first use."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="ctlwire-bench-")
        os.chmod(self.directory, 0o700)
        self._fleets: dict[str, EngineFleet] = {}
        self._addresses: dict[str, str] = {}
        self._started: set[str] = set()

    def address(self, name: str) -> str:
        """The ipc address the clients of fleet ``name`` bind."""
        addr = self._addresses.get(name)
        if addr is None:
            addr = self._addresses[name] = f"ipc://{self.directory}/{name}.sock"
        return addr

    def ctlwire(self, name: str, ranks: int, *, serve_ranks: Sequence[int] = (),
                max_queued: int | None = None) -> EngineFleet:
        """Declare ctlwire engine processes (poll mode; ``serve_ranks`` in serve mode,
        with room for ``max_queued`` requests waiting to start, if given)."""
        fleet = self._fleets.get(name)
        if fleet is None:
            address = self.address(name)

            def args_for(rank: int) -> list[str]:
                if rank not in serve_ranks:
                    return ["--connect", address, "--mode", "poll", "--methods", BENCH_METHODS]
                room = [] if max_queued is None else ["--max-queued", str(max_queued)]
                return ["--connect", address, "--mode", "serve", "--methods", BENCH_METHODS,
                        *room]

            fleet = self._fleets[name] = EngineFleet(ranks, args_for)
        return fleet

    def baseline(self, name: str, ranks: int) -> EngineFleet:
        """Declare baseline engine processes (:mod:`ctlwire.benchmarks.baseline_engine`)."""
        fleet = self._fleets.get(name)
        if fleet is None:
            address = self.address(name)
            fleet = self._fleets[name] = ModuleFleet(
                "ctlwire.benchmarks.baseline_engine", ranks, lambda r: ["--connect", address])
        return fleet

    def module(self, name: str, module: str, args_for: Callable[[int], list[str]]
               ) -> EngineFleet:
        """Declare one process of ``module`` (rank 0), e.g. the libzmq floor's echo peer."""
        fleet = self._fleets.get(name)
        if fleet is None:
            fleet = self._fleets[name] = ModuleFleet(module, 1, args_for)
        return fleet

    def custom(self, name: str, make: Callable[[str], EngineFleet]) -> EngineFleet:
        """Declare the fleet ``make(address)`` (any processes that print READY)."""
        fleet = self._fleets.get(name)
        if fleet is None:
            fleet = self._fleets[name] = make(self.address(name))
        return fleet

    def start(self, *names: str) -> None:
        """Start the declared fleets ``names`` that are not running yet, concurrently
        (spawning every process first, then waiting for all of them to be READY, with
        EngineFleet's own spawn and wait steps)."""
        todo = [self._fleets[n] for n in names if n not in self._started]
        self._started.update(names)
        for fleet in todo:
            for rank in fleet.ranks:
                fleet.spawn(rank)
        for fleet in todo:
            for rank in fleet.ranks:
                fleet.await_ready(rank)

    def pids(self, name: str) -> list[int]:
        """The process ids of the started fleet ``name``, by rank."""
        return [pid for _rank, pid in sorted(self._fleets[name].pids().items())]

    def stop(self, name: str) -> None:
        fleet = self._fleets.pop(name, None)
        self._started.discard(name)
        if fleet is not None:
            fleet.stop()

    def close(self) -> None:
        """Stop every fleet (SIGTERM, then SIGKILL after a grace period) and reap it."""
        try:
            for name in list(self._fleets):
                with contextlib.suppress(Exception):
                    self.stop(name)
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> FleetPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
