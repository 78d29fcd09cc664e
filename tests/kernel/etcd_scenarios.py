"""What the etcd membership tests share: engine processes that register themselves,
a caller fanning out all along (every outcome kept), and an independent watch that
records what etcd really did under a prefix (the ground truth a client's watcher is
compared with)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.errors import FanOutFailed
from ctlwire.kernel.membership.etcd_gateway import EtcdError, EtcdGateway, unb64

#: lease TTL of the engines in these tests (etcd runs with a 500 ms election timeout,
#: so its shortest lease is 1 s)
TTL = 1
#: the fast etcd settings the tests' members run with
FAST_ETCD = ["--heartbeat-interval", "50", "--election-timeout", "500"]


def new_prefix() -> str:
    return f"/ctlwire/{uuid.uuid4().hex[:8]}/"


def engine_fleet(tmp: Path, endpoints: Sequence[str], prefix: str, backend: str,
                 ranks: int = 3) -> tuple[str, EngineFleet]:
    """``ranks`` engine processes connecting to a client at an ipc address in ``tmp``,
    each registering itself in etcd (``engine_process --etcd``) with a ``TTL`` lease."""
    os.chmod(tmp, 0o700)
    address = f"ipc://{tmp}/control.sock"

    def args(rank: int) -> list[str]:
        return ["--connect", address, "--etcd", ",".join(endpoints), "--etcd-prefix", prefix,
                "--etcd-ttl", str(TTL), "--etcd-address", f"engine-{rank}",
                "--backend", backend]

    return address, EngineFleet(ranks, args)


async def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> float:
    """Until ``condition()``; the seconds it took (TimeoutError after ``timeout``)."""
    start = time.monotonic()
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.01)
    return time.monotonic() - start


class FanOuts:
    """Fans ``sleep(0.2)`` out to the client's routable ranks back to back (a call is
    in flight on every rank nearly all the time); keeps every rank's error and counts
    each rank's answers."""

    def __init__(self, client: ControlClient) -> None:
        self.client = client
        self.errors: list[tuple[int, BaseException]] = []
        self.answers: dict[int, int] = {}

    async def run(self) -> None:
        while True:
            targets, _ = self.client.routable_ranks()
            if targets:
                try:
                    res = await self.client.fan_out("sleep", 0.2, ranks=targets, timeout=10)
                except FanOutFailed as exc:  # no rank answered: every error is in it
                    res = exc.result
                for rank in res.results:
                    self.answers[rank] = self.answers.get(rank, 0) + 1
                self.errors.extend(res.errors.items())
            await anyio.sleep(0.01)

    def errors_of(self, ranks: Sequence[int]) -> list[tuple[int, BaseException]]:
        return [(r, e) for r, e in self.errors if r in ranks]


class TruthWatch:
    """Every event etcd reports under ``prefix`` from ``start`` on, through a watch of
    its own on one endpoint that it keeps open (a frozen member's stream resumes
    when it thaws) — what a client's watcher must have applied, each once."""

    def __init__(self, endpoint: str, prefix: str, start: int) -> None:
        self.gateway = EtcdGateway(endpoint)
        self.prefix = prefix
        self.start = start
        self.events: list[dict[str, Any]] = []

    @property
    def revision(self) -> int:
        return int(self.events[-1]["kv"]["mod_revision"]) if self.events else self.start - 1

    def _ranked(self) -> list[tuple[str, int]]:
        return [(e.get("type", "PUT"), int(unb64(e["kv"]["key"])[len(self.prefix):]))
                for e in self.events]

    def deleted_ranks(self) -> list[int]:
        """The rank of every deletion etcd reported, in order (a lease that expired
        deletes its key unless the engine put it under a new lease first)."""
        return [rank for kind, rank in self._ranked() if kind == "DELETE"]

    def registered(self, rank: int) -> bool:
        """Whether ``rank``'s last event reported is a registration (none: not known)."""
        kinds = [kind for kind, r in self._ranked() if r == rank]
        return bool(kinds) and kinds[-1] == "PUT"

    async def run(self) -> None:
        with contextlib.suppress(EtcdError):
            stream = self.gateway.watch(self.prefix, self.start)
            async with contextlib.aclosing(stream) as batches:
                async for events in batches:
                    self.events.extend(events)
