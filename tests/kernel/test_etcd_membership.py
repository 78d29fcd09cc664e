"""Membership on a real etcd (started on loopback in a temp dir) with real engine
processes, both backends: registered engines become the client's ranks, lease
expiry removes one, a lease lost while the engine lives re-registers it as a new
incarnation, a compacted watch revision is reported, and an etcd restart keeps
the client's last view (stale, then recovered) without spurious removals."""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import anyio
import pytest

from ctlwire.kernel.app.engine_fleet import EngineFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.etcd_membership import (
    Compacted,
    EtcdGateway,
    EtcdMembership,
    EtcdRegistration,
)
from ctlwire.kernel.testing.etcd_server import EtcdServer, etcd_binary, memory_dir
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

if etcd_binary() is None:
    pytest.skip("the etcd binary is not installed (Debian: apt-get install etcd-server)",
                allow_module_level=True)


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    data = memory_dir()
    server = EtcdServer(data)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("etcd-engines")
    os.chmod(tmp, 0o700)
    address = f"ipc://{tmp}/control.sock"
    with EngineFleet(2, lambda r: ["--connect", address]):
        yield address


async def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.02)


async def test_registered_engines_come_and_go_with_their_leases(
        etcd: EtcdServer, engines: str) -> None:
    gateway = EtcdGateway(etcd.endpoint)
    prefix = f"/ctlwire/{uuid.uuid4().hex[:8]}/"
    regs = {r: EtcdRegistration(gateway, prefix, r, f"engine-{r}", ttl=2) for r in (0, 1)}
    async with ControlClient(ZmqRouterClientTransport(engines), ranks=(),
                             admit_on_join=True) as c, anyio.create_task_group() as tg:
        watcher = EtcdMembership(c, gateway, prefix, relist_interval=5.0)
        tg.start_soon(watcher.run)
        scopes = {r: anyio.CancelScope() for r in regs}

        async def keep(rank: int) -> None:
            with scopes[rank]:
                await regs[rank].run()

        for r in regs:
            tg.start_soon(keep, r)
        await wait_until(lambda: c.ranks == (0, 1))
        assert c.rank_status(1)["member"]["address"] == "engine-1"
        await c.wait_ready(timeout=30)
        assert sorted((await c.fan_out("echo", 1)).results) == [0, 1]

        # rank 1 stops keeping its lease alive (its host left): expiry removes it
        scopes[1].cancel()
        await wait_until(lambda: c.ranks == (0,))
        assert not c.rank_status(1)["present"]

        # rank 0's lease is lost while it lives: it registers again, a newer incarnation
        first = c.membership.get(0)
        assert first is not None
        await gateway.revoke(regs[0].lease)
        await wait_until(lambda: (m := c.membership.get(0)) is not None
                         and m.incarnation > first.incarnation)
        # the watch can report the new key before the put's answer reaches the registration
        await wait_until(lambda: regs[0].counters["registered"] == 2)
        assert sorted((await c.fan_out("echo", 2)).results) == [0]
        assert watcher.counters["bad_entries"] == 0 and watcher.counters["lists"] >= 1
        tg.cancel_scope.cancel()


async def test_a_compacted_revision_is_reported_to_the_watcher(etcd: EtcdServer) -> None:
    gateway = EtcdGateway(etcd.endpoint)
    prefix = f"/ctlwire/{uuid.uuid4().hex[:8]}/"
    first = await gateway.put(f"{prefix}0", '{"rank": 0, "address": ""}')
    last = await gateway.put(f"{prefix}0", '{"rank": 0, "address": "x"}')
    await gateway.compact(last)
    with pytest.raises(Compacted) as info:
        async for _ in gateway.watch(prefix, first):
            pass
    assert info.value.compact_revision == last


async def test_etcd_down_longer_than_the_ttl_keeps_the_last_view_then_recovers(
        etcd: EtcdServer, engines: str) -> None:
    gateway = EtcdGateway(etcd.endpoint, timeout=1.0)
    prefix = f"/ctlwire/{uuid.uuid4().hex[:8]}/"
    regs = [EtcdRegistration(gateway, prefix, r, f"engine-{r}", ttl=2) for r in (0, 1)]
    async with ControlClient(ZmqRouterClientTransport(engines), ranks=(),
                             admit_on_join=True) as c, anyio.create_task_group() as tg:
        watcher = EtcdMembership(c, gateway, prefix, relist_interval=5.0, retry_interval=0.2)
        tg.start_soon(watcher.run)
        for reg in regs:
            tg.start_soon(reg.run)
        await wait_until(lambda: c.ranks == (0, 1))
        await c.wait_ready(timeout=30)
        etcd.stop()
        try:
            await wait_until(lambda: c.membership.stale is not None)
            # down for longer than the leases' TTL: the last view is kept, and the
            # engines keep serving
            await anyio.sleep(3.0)
            assert c.ranks == (0, 1) and c.membership.stale is not None
            assert c.metrics()["membership"]["stale"] == c.membership.stale
            assert sorted((await c.fan_out("echo", 3)).results) == [0, 1]
        finally:
            etcd.start()
        await wait_until(lambda: c.membership.stale is None)
        await anyio.sleep(0.5)  # a watch resumed, a list applied: nothing removed
        assert c.ranks == (0, 1) and c.membership.counters["removed"] == 0
        tg.cancel_scope.cancel()


async def test_sixty_four_engines_registering_at_once_all_join(etcd: EtcdServer) -> None:
    """64 registrations at once (in this process: the client's side is what is under
    test): every rank joins, each once; their leases revoked, every rank leaves."""
    gateway = EtcdGateway(etcd.endpoint)
    prefix = f"/ctlwire/{uuid.uuid4().hex[:8]}/"
    regs = [EtcdRegistration(gateway, prefix, r, "", ttl=60) for r in range(64)]
    async with ControlClient(ZmqRouterClientTransport(), ranks=(), heartbeat_interval=None,
                             admit_on_join=True) as c, anyio.create_task_group() as tg:
        watcher = EtcdMembership(c, gateway, prefix, relist_interval=5.0)
        tg.start_soon(watcher.run)
        async with anyio.create_task_group() as joining:
            for reg in regs:
                joining.start_soon(reg.register)
        await wait_until(lambda: c.ranks == tuple(range(64)))
        assert c.membership.counters["added"] == 64
        assert c.routable_ranks() == (tuple(range(64)), {})
        async with anyio.create_task_group() as leaving:
            for reg in regs:
                leaving.start_soon(reg.withdraw)
        await wait_until(lambda: c.ranks == ())
        assert c.membership.counters["removed"] == 64
        tg.cancel_scope.cancel()


async def test_engine_processes_register_themselves_and_a_killed_one_expires(
        etcd: EtcdServer, tmp_path: Path, anyio_backend: str) -> None:
    """``engine_process --etcd``: each engine registers its rank under a lease; one
    killed (no clean leave) is removed when its lease expires, one stopped cleanly
    leaves too; started again, a rank is a newer incarnation."""
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/control.sock"
    prefix = f"/ctlwire/{uuid.uuid4().hex[:8]}/"

    def args(rank: int) -> list[str]:
        return ["--connect", address, "--etcd", etcd.endpoint, "--etcd-prefix", prefix,
                "--etcd-ttl", "2", "--etcd-address", f"engine-{rank}",
                "--backend", anyio_backend]

    gateway = EtcdGateway(etcd.endpoint)
    with EngineFleet(3, args) as fleet:
        async with ControlClient(ZmqRouterClientTransport(address), ranks=(),
                                 admit_on_join=True) as c, anyio.create_task_group() as tg:
            tg.start_soon(EtcdMembership(c, gateway, prefix, relist_interval=5.0).run)
            await wait_until(lambda: c.ranks == (0, 1, 2))
            await c.wait_ready(timeout=30)
            assert sorted((await c.fan_out("echo", 1)).results) == [0, 1, 2]
            first = c.membership.get(1)
            assert first is not None and first.address == "engine-1"
            fleet.kill(1)  # SIGKILL: the lease is not revoked; it expires
            fleet.kill(2, signal.SIGTERM)  # a clean stop: it revokes its lease
            await wait_until(lambda: c.ranks == (0,))
            fleet.restart(1)
            await wait_until(lambda: c.ranks == (0, 1))
            again = c.membership.get(1)
            assert again is not None and again.incarnation > first.incarnation
            await c.wait_ready([1], timeout=30)
            assert sorted((await c.fan_out("echo", 2)).results) == [0, 1]
            tg.cancel_scope.cancel()


async def test_bad_entries_under_the_prefix_are_counted_not_applied(etcd: EtcdServer) -> None:
    gateway = EtcdGateway(etcd.endpoint)
    prefix = f"/ctlwire/{uuid.uuid4().hex[:8]}/"
    await gateway.put(f"{prefix}not-a-rank", '{"rank": 1, "address": ""}')
    await gateway.put(f"{prefix}2", "not json")
    await gateway.put(f"{prefix}3", '{"rank": 4, "address": ""}')  # names another rank
    await gateway.put(f"{prefix}-5", '{"rank": -5, "address": ""}')
    async with ControlClient(ZmqRouterClientTransport(), ranks=(), heartbeat_interval=None,
                             admit_on_join=True) as c, anyio.create_task_group() as tg:
        watcher = EtcdMembership(c, gateway, prefix, relist_interval=5.0)
        tg.start_soon(watcher.run)
        await wait_until(lambda: watcher.counters["lists"] >= 1)
        assert c.ranks == () and watcher.counters["bad_entries"] == 4
        await gateway.put(f"{prefix}7", '{"rank": 7, "address": ""}')  # seen by the watch
        await gateway.put(f"{prefix}8", '{"rank": 8, "address": 8}')
        await wait_until(lambda: c.ranks == (7,) and watcher.counters["bad_entries"] == 5)
        tg.cancel_scope.cancel()


async def test_a_watch_gone_quiet_is_caught_up_by_the_periodic_list(
        etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch that silently stops delivering (no error) hides a change for at most
    ``relist_interval``: the next list applies it."""
    gateway = EtcdGateway(etcd.endpoint)
    prefix = f"/ctlwire/{uuid.uuid4().hex[:8]}/"

    async def quiet_watch(prefix: str, start_revision: int) -> AsyncIterator[list[object]]:
        await anyio.sleep_forever()
        yield []  # pragma: no cover - never reached

    monkeypatch.setattr(gateway, "watch", quiet_watch)
    async with ControlClient(ZmqRouterClientTransport(), ranks=(), heartbeat_interval=None,
                             admit_on_join=True) as c, anyio.create_task_group() as tg:
        watcher = EtcdMembership(c, gateway, prefix, relist_interval=0.3)
        tg.start_soon(watcher.run)
        await wait_until(lambda: watcher.counters["lists"] >= 1)
        await gateway.put(f"{prefix}3", '{"rank": 3, "address": ""}')
        await wait_until(lambda: c.ranks == (3,))
        assert watcher.counters["watch_events"] == 0 and watcher.counters["lists"] >= 2
        tg.cancel_scope.cancel()
