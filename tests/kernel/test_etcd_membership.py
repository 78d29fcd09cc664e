"""Membership on a real etcd member (started on loopback, its data in memory) with real
engine processes registering themselves, both backends: etcd frozen past the leases'
TTL fails no call and removes no live rank while a dead one leaves; an explicit
deletion removes a live rank at once and a revoked lease does not; the watch resumes
from its revision (every event once, checked against an independent watch); a
compacted revision makes it list again, which tells deletions from lease losses; an
unreachable etcd at start is an error within the start timeout; bad entries are
refused, counted and never routed to."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import pytest
from etcd_scenarios import (
    FAST_ETCD,
    TTL,
    FanOuts,
    TruthWatch,
    engine_fleet,
    new_prefix,
    wait_until,
)

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.errors import EngineDead, OutcomeUnknown
from ctlwire.kernel.membership.etcd_gateway import (
    Compacted,
    EtcdError,
    EtcdGateway,
    EtcdUnavailable,
)
from ctlwire.kernel.membership.etcd_membership import EtcdMembership, EtcdRegistration
from ctlwire.states import MemberState
from ctlwire.testing._ports import free_tcp_port
from ctlwire.testing.etcd_server import EtcdServer, etcd_binary, memory_dir
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

if etcd_binary() is None:
    pytest.skip("the etcd binary is not installed (Debian: apt-get install etcd-server)",
                allow_module_level=True)

WATCH_ROUND = 1.0


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    data = memory_dir()
    server = EtcdServer(data, extra_args=FAST_ETCD)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(data, ignore_errors=True)


def watcher_for(client: ControlClient, etcd: EtcdServer, prefix: str) -> EtcdMembership:
    return EtcdMembership(client, EtcdGateway(etcd.endpoint, timeout=1.0), prefix,
                          watch_round=WATCH_ROUND, retry_interval=0.2)


def client_at(address: str) -> ControlClient:
    return ControlClient(ZmqRouterClientTransport(address), ranks=(), admit_on_join=True,
                         default_timeout=10.0)


async def test_a_frozen_etcd_fails_no_call_and_removes_no_live_rank_while_a_dead_one_leaves(
        etcd: EtcdServer, tmp_path: Path, anyio_backend: str) -> None:
    prefix = new_prefix()
    address, fleet = engine_fleet(tmp_path, [etcd.endpoint], prefix, anyio_backend)
    with fleet:
        async with client_at(address) as c, anyio.create_task_group() as tg:
            watcher = watcher_for(c, etcd, prefix)
            await tg.start(watcher.run)
            truth = TruthWatch(etcd.endpoint, prefix, watcher.revision + 1)
            tg.start_soon(truth.run)
            await wait_until(lambda: c.ranks == (0, 1, 2))
            await c.wait_ready(timeout=30)
            first = {r: c.membership.get(r) for r in (0, 1, 2)}
            assert all(m is not None and m.incarnation == fleet.engines[r].incarnation
                       for r, m in first.items())
            calls = FanOuts(c)
            tg.start_soon(calls.run)
            await anyio.sleep(0.3)

            # frozen for longer than the leases' TTL; rank 2 dies meanwhile
            etcd.freeze()
            try:
                await anyio.to_thread.run_sync(fleet.kill, 2)
                await wait_until(lambda: c.membership.stale is not None)
                await anyio.sleep(TTL + 0.8)
                assert c.ranks == (0, 1, 2)  # nothing leaves while etcd cannot say
            finally:
                etcd.thaw()
            thawed = time.monotonic()
            # every lease expired at the thaw: the dead rank leaves, the live ones
            # register again under the same incarnation
            await wait_until(lambda: c.ranks == (0, 1))
            left_after = time.monotonic() - thawed
            # until etcd holds both live ranks' registrations again and the client's
            # watcher has applied everything etcd reported (one condition: a rank seen
            # REGISTERED before the watcher applied its deletion proves nothing)
            await wait_until(lambda: all(truth.registered(r) for r in (0, 1))
                             and truth.revision == watcher.revision)
            assert all(c.membership.state(r) is MemberState.REGISTERED for r in (0, 1))
            answered = dict(calls.answers)
            await wait_until(lambda: all(calls.answers[r] > answered[r] for r in (0, 1)))
            tg.cancel_scope.cancel()

    assert calls.errors_of((0, 1)) == []  # no call to a live rank failed
    assert all(isinstance(e, EngineDead) for _, e in calls.errors_of((2,)))
    assert left_after < TTL + WATCH_ROUND + 2.0, left_after
    for r in (0, 1):
        m = c.membership.get(r)
        assert m is not None and m.admitted and m.incarnation == first[r].incarnation  # type: ignore[union-attr]
    # every lease etcd expired is a registration lost, and a live rank's is restored;
    # a live engine that put its key under a new lease before etcd expired the old
    # one lost nothing (etcd reported no deletion)
    deleted = truth.deleted_ranks()
    assert 2 in deleted
    counters = c.membership.counters
    assert counters["registration_lost"] == len(deleted)
    assert counters["restored"] == len([r for r in deleted if r != 2])
    assert (counters["removed"], counters["died"], counters["reregistered"]) == (1, 1, 0)
    # the watch resumed from its revision: every event etcd reported, each applied once
    assert watcher.counters["lists"] == 1 and watcher.counters["watch_resumed"] >= 1
    assert watcher.counters["watch_events"] == len(truth.events) > 0
    assert counters["stale_revision"] == 0


async def test_a_dead_rank_leaves_the_view_within_the_ttl_and_a_watch_round(
        etcd: EtcdServer, tmp_path: Path, anyio_backend: str) -> None:
    prefix = new_prefix()
    address, fleet = engine_fleet(tmp_path, [etcd.endpoint], prefix, anyio_backend, ranks=2)
    with fleet:
        async with client_at(address) as c, anyio.create_task_group() as tg:
            await tg.start(watcher_for(c, etcd, prefix).run)
            await wait_until(lambda: c.ranks == (0, 1))
            await c.wait_ready(timeout=30)
            killed = time.monotonic()
            await anyio.to_thread.run_sync(fleet.kill, 1)  # SIGKILL: no deregistration
            await wait_until(lambda: c.ranks == (0,))
            took = time.monotonic() - killed
            assert await c.call("echo", 5, rank=0) == 5
            tg.cancel_scope.cancel()
    # the lease expires TTL after its last keep-alive (etcd checks every 500 ms)
    assert took < TTL + WATCH_ROUND + 1.5, took
    assert c.membership.counters["died"] == 1


async def test_a_deletion_removes_a_live_rank_at_once_and_a_lost_lease_does_not(
        etcd: EtcdServer, tmp_path: Path, anyio_backend: str) -> None:
    prefix = new_prefix()
    gateway = EtcdGateway(etcd.endpoint)
    address, fleet = engine_fleet(tmp_path, [etcd.endpoint], prefix, anyio_backend)
    with fleet:
        async with client_at(address) as c, anyio.create_task_group() as tg:
            await tg.start(watcher_for(c, etcd, prefix).run)
            await wait_until(lambda: c.ranks == (0, 1, 2))
            await c.wait_ready(timeout=30)
            caught: list[BaseException] = []

            async def nap() -> None:
                try:
                    await c.call("sleep", 5.0, rank=1)
                except Exception as exc:
                    caught.append(exc)

            tg.start_soon(nap)
            await wait_until(lambda: c.rank_status(1)["method"] == "sleep")
            # an operator deletes rank 1: removed at once (its lease lives), its call fails
            assert await gateway.delete(f"{prefix}1")
            await wait_until(lambda: 1 not in c.ranks, timeout=TTL)
            await wait_until(lambda: bool(caught))
            assert type(caught[0]) is OutcomeUnknown
            assert "removed from the membership" in str(caught[0])

            # rank 0's lease is lost while it lives: it stays, its calls go on
            kv = await gateway.get(f"{prefix}0")
            assert kv is not None
            incarnation = c.membership.get(0).incarnation  # type: ignore[union-attr]
            await gateway.revoke(int(kv["lease"]))
            await wait_until(lambda: c.membership.counters["registration_lost"] == 1)
            assert 0 in c.ranks and await c.call("echo", 1, rank=0) == 1
            await wait_until(lambda: c.membership.state(0) is MemberState.REGISTERED)
            assert c.membership.get(0).incarnation == incarnation  # type: ignore[union-attr]
            assert c.membership.counters["restored"] == 1

            # rank 2 stops cleanly: it deregisters, and is removed, not found dead
            await anyio.to_thread.run_sync(fleet.kill, 2, signal.SIGTERM)
            await wait_until(lambda: 2 not in c.ranks)
            # an explicit removal holds: the deleted rank did not register again
            await anyio.sleep(TTL + 0.5)
            assert 1 not in c.ranks and await gateway.get(f"{prefix}1") is None
            # started again, rank 2 is its new process
            engine = await anyio.to_thread.run_sync(fleet.restart, 2)
            await wait_until(lambda: 2 in c.ranks)
            assert c.membership.get(2).incarnation == engine.incarnation  # type: ignore[union-attr]
            tg.cancel_scope.cancel()
    counters = c.membership.counters
    assert (counters["removed"], counters["died"]) == (2, 0)


class GatedGateway(EtcdGateway):
    """A real gateway whose member can be made to look unreachable to the watcher."""

    closed = False

    async def probe(self, prefix: str, endpoint: str, timeout: float) -> int:
        if self.closed:
            raise EtcdError("the test closed the gate", retryable=True)
        return await super().probe(prefix, endpoint, timeout)


async def test_a_compacted_revision_lists_again_and_tells_deletions_from_lease_losses(
        etcd: EtcdServer, tmp_path: Path) -> None:
    prefix = new_prefix()
    gateway = EtcdGateway(etcd.endpoint)
    # two live engines (ranks 0 and 1) registered by hand, leases kept by nobody
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/control.sock"
    leases = {r: await gateway.grant(60) for r in (0, 1)}
    for r in (0, 1):
        await gateway.put(f"{prefix}{r}", json.dumps({"rank": r, "incarnation": 1}), leases[r])
    with EngineFleet(2, lambda r: ["--connect", address]) as fleet:
        async with client_at(address) as c, anyio.create_task_group() as tg:
            gated = GatedGateway(etcd.endpoint, timeout=1.0)
            watcher = EtcdMembership(c, gated, prefix, watch_round=0.4, retry_interval=0.1)
            await tg.start(watcher.run)
            await c.wait_ready([0, 1], timeout=30)
            gated.closed = True
            await wait_until(lambda: c.membership.stale is not None)
            # while the watcher cannot reach etcd: rank 0 deleted (its lease lives),
            # rank 1's lease lost, rank 5 registered; then the history is compacted
            await gateway.delete(f"{prefix}0")
            await gateway.revoke(leases[1])
            last = await gateway.put(f"{prefix}5", json.dumps({"rank": 5, "incarnation": 1}))
            await gateway.compact(last)
            gated.closed = False
            await wait_until(lambda: watcher.counters["lists"] == 2)
            assert watcher.counters["lists"] == 2
            assert c.ranks == (1, 5) and c.membership.state(1) is MemberState.REGISTRATION_LOST
            assert (c.membership.counters["removed"],
                    c.membership.counters["registration_lost"]) == (1, 1)
            # unregistered and alive it stays; unregistered and dead it leaves
            await anyio.to_thread.run_sync(fleet.kill, 1)
            await wait_until(lambda: c.ranks == (5,))
            tg.cancel_scope.cancel()
    assert c.membership.counters["died"] == 1


async def test_a_compacted_revision_is_reported_to_the_watcher(etcd: EtcdServer) -> None:
    gateway = EtcdGateway(etcd.endpoint)
    prefix = new_prefix()
    first = await gateway.put(f"{prefix}0", '{"rank": 0, "address": ""}')
    last = await gateway.put(f"{prefix}0", '{"rank": 0, "address": "x"}')
    await gateway.compact(last)
    with pytest.raises(Compacted) as info:
        async for _ in gateway.watch(prefix, first):
            pass
    assert info.value.compact_revision == last


async def test_an_unreachable_etcd_at_start_is_an_error_within_the_start_timeout(
        etcd: EtcdServer) -> None:
    closed = f"http://127.0.0.1:{free_tcp_port()}"
    async with ControlClient(ZmqRouterClientTransport(), ranks=(), heartbeat_interval=None) as c:
        for endpoints in ([closed], [etcd.endpoint]):
            watcher = EtcdMembership(c, EtcdGateway(endpoints, timeout=0.3), new_prefix(),
                                     start_timeout=1.0, retry_interval=0.1)
            started = time.monotonic()
            etcd.freeze()  # the second time, a member that accepts and never answers
            try:
                with anyio.fail_after(10):
                    async with anyio.create_task_group() as tg:
                        with pytest.raises(EtcdUnavailable) as info:
                            await tg.start(watcher.run)
            finally:
                etcd.thaw()
            assert time.monotonic() - started < 5
            assert "start_timeout" in str(info.value) and endpoints[0] in str(info.value)
            assert c.membership.stale is not None and c.ranks == ()


async def test_bad_entries_under_the_prefix_are_refused_counted_and_never_routed_to(
        etcd: EtcdServer) -> None:
    gateway = EtcdGateway(etcd.endpoint)
    prefix = new_prefix()
    good = {r: json.dumps({"rank": r, "address": f"a{r}", "incarnation": 200})
            for r in (1, 2, 3)}
    bad = {
        "not-a-rank": good[1], "03": json.dumps({"rank": 3, "incarnation": 300}),
        "+4": json.dumps({"rank": 4}), " 4": json.dumps({"rank": 4}), "٣": good[3],
        "12345678901": json.dumps({"rank": 12345678901}),  # out of range
        "5": "not json", "6": json.dumps({"rank": True}), "7": json.dumps({"rank": 7.0}),
        "8": json.dumps({"rank": 8, "address": 8}),
        "9": json.dumps({"rank": 9, "incarnation": "x"}),
        "10": json.dumps({"rank": 10, "incarnation": -1}),
        "11": json.dumps({"rank": 12}),  # claims another rank
        "13": json.dumps({"rank": 13, "address": "x" * (1 << 20)}),  # a 1 MiB value
    }
    reasons = {"key": 6, "value": 6, "rank": 1, "size": 1}

    async def put_all(entries: dict[str, str]) -> None:
        for suffix, value in entries.items():
            await gateway.put(f"{prefix}{suffix}", value)

    await put_all({"1": good[1], **dict(list(bad.items())[:7])})
    async with ControlClient(ZmqRouterClientTransport(), ranks=(), heartbeat_interval=None,
                             admit_on_join=True) as c, anyio.create_task_group() as tg:
        watcher = EtcdMembership(c, gateway, prefix)
        await tg.start(watcher.run)  # the first half listed
        await put_all({"2": good[2], "3": good[3], **dict(list(bad.items())[7:])})  # watched
        # a second registration of rank 3, older: fenced, never applied
        await gateway.put(f"{prefix}3", json.dumps({"rank": 3, "address": "old",
                                                    "incarnation": 100}))
        await wait_until(lambda: watcher.counters["bad_entries"] == len(bad)
                         and c.membership.counters["fenced_incarnation"] == 1)
        tg.cancel_scope.cancel()
    assert c.ranks == (1, 2, 3) and c.routable_ranks() == ((1, 2, 3), {})
    assert c.membership.get(3).address == "a3"  # type: ignore[union-attr]
    assert watcher.refusals == {**reasons, "client": 0}


async def test_sixty_four_engines_registering_at_once_all_join(etcd: EtcdServer) -> None:
    """64 registrations at once (in this process: the client's side is what is under
    test): every rank joins, each once; deregistered, every rank leaves."""
    gateway = EtcdGateway(etcd.endpoint)
    prefix = new_prefix()
    regs = [EtcdRegistration(gateway, prefix, r, "", ttl=60) for r in range(64)]
    async with ControlClient(ZmqRouterClientTransport(), ranks=(), heartbeat_interval=None,
                             admit_on_join=True) as c, anyio.create_task_group() as tg:
        await tg.start(EtcdMembership(c, gateway, prefix).run)
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


async def test_a_watch_gone_quiet_is_caught_up_by_the_periodic_list(
        etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch that silently stops delivering (no error, its member still answering)
    hides a change for at most ``relist_interval``: the next list applies it."""
    gateway = EtcdGateway(etcd.endpoint)
    prefix = new_prefix()

    async def quiet_watch(prefix: str, start_revision: int,
                          endpoint: str | None = None) -> AsyncIterator[list[object]]:
        await anyio.sleep_forever()
        yield []  # pragma: no cover - never reached

    monkeypatch.setattr(gateway, "watch", quiet_watch)
    async with ControlClient(ZmqRouterClientTransport(), ranks=(), heartbeat_interval=None,
                             admit_on_join=True) as c, anyio.create_task_group() as tg:
        watcher = EtcdMembership(c, gateway, prefix, relist_interval=0.3)
        await tg.start(watcher.run)
        await gateway.put(f"{prefix}3", '{"rank": 3, "address": ""}')
        await wait_until(lambda: c.ranks == (3,))
        assert watcher.counters["watch_events"] == 0 and watcher.counters["lists"] >= 2
        tg.cancel_scope.cancel()
