"""Membership on a real three-member etcd cluster (three etcd processes on loopback
ports, started once for the module) with real engine processes registering through
the cluster's endpoint list, both backends: the leader is killed, the member the
client watches through is frozen while a rank dies, the killed member is started
again — and no call to a live rank fails, the dead rank leaves within the lease's
TTL and a watch round, and the client's watch follows the cluster from member to
member, applying every event etcd reported once (checked against an independent
watch on the member left alone)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from etcd_scenarios import FAST_ETCD, TTL, FanOuts, TruthWatch, engine_fleet, new_prefix, wait_until

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.errors import EngineDead
from ctlwire.kernel.membership.etcd_gateway import EtcdGateway
from ctlwire.kernel.membership.etcd_membership import EtcdMembership
from ctlwire.testing.etcd_server import EtcdCluster, etcd_binary, memory_dir
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

if etcd_binary() is None:
    pytest.skip("the etcd binary is not installed (Debian: apt-get install etcd-server)",
                allow_module_level=True)

WATCH_ROUND = 1.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[EtcdCluster]:
    data = memory_dir("ctlwire-etcd-cluster-")
    three = EtcdCluster(data, 3, extra_args=FAST_ETCD)
    try:
        three.start()
        yield three
    finally:
        three.stop()
        shutil.rmtree(data, ignore_errors=True)


async def test_the_client_follows_the_cluster_through_a_leader_kill_a_freeze_and_a_restart(
        cluster: EtcdCluster, tmp_path: Path, anyio_backend: str) -> None:
    leader = await anyio.to_thread.run_sync(cluster.leader)
    members = {m.endpoint: m for m in cluster.members}
    # the client watches through the leader first
    endpoints = [cluster.endpoints[(leader + i) % 3] for i in range(3)]
    prefix = new_prefix()
    address, fleet = engine_fleet(tmp_path, cluster.endpoints, prefix, anyio_backend)
    with fleet:
        async with ControlClient(ZmqRouterClientTransport(address), ranks=(),
                                 admit_on_join=True, default_timeout=10.0) as c, \
                anyio.create_task_group() as tg:
            gateway = EtcdGateway(endpoints, timeout=0.5)
            watcher = EtcdMembership(c, gateway, prefix, watch_round=WATCH_ROUND,
                                     retry_interval=0.2)
            await tg.start(watcher.run)
            start = watcher.revision + 1
            await wait_until(lambda: c.ranks == (0, 1, 2))
            await c.wait_ready(timeout=30)
            incarnations = {r: c.membership.get(r).incarnation  # type: ignore[union-attr]
                            for r in (0, 1, 2)}
            calls = FanOuts(c)
            tg.start_soon(calls.run)
            await wait_until(lambda: watcher.watching == endpoints[0])

            # the leader dies: the others elect one, the client moves to another member
            killed_leader = members[endpoints[0]]
            await anyio.to_thread.run_sync(killed_leader.kill)
            await wait_until(lambda: watcher.watching not in (None, endpoints[0]))
            watched = members[watcher.watching]  # type: ignore[index]
            (alone,) = (m for m in cluster.members if m not in (killed_leader, watched))
            # what etcd did, seen through the member left alone from here on
            truth = TruthWatch(alone.endpoint, prefix, start)
            tg.start_soon(truth.run)
            # the killed member comes back on its data
            await anyio.to_thread.run_sync(killed_leader.start)
            # the member the client watches through freezes (the two others keep a
            # quorum), and a rank dies meanwhile: the client moves on, and the dead
            # rank leaves once its lease has expired
            watched.freeze()
            try:
                killed = time.monotonic()
                await anyio.to_thread.run_sync(fleet.kill, 2)
                await wait_until(lambda: c.ranks == (0, 1))
                took = time.monotonic() - killed
                await wait_until(lambda: watcher.watching not in (None, watched.endpoint))
            finally:
                watched.thaw()
            await wait_until(lambda: truth.revision == watcher.revision)
            answered = dict(calls.answers)
            await wait_until(lambda: all(calls.answers[r] > answered[r] for r in (0, 1)))
            tg.cancel_scope.cancel()

    assert calls.errors_of((0, 1)) == []  # no call to a live rank failed
    assert all(isinstance(e, EngineDead) for _, e in calls.errors_of((2,)))
    assert took < TTL + WATCH_ROUND + 2.5, took
    assert {r: c.membership.get(r).incarnation for r in (0, 1)} == {  # type: ignore[union-attr]
        r: incarnations[r] for r in (0, 1)}
    counters = c.membership.counters
    assert (counters["removed"], counters["died"], counters["reregistered"]) == (1, 1, 0)
    # one list, then the watch resumed member after member: every event once
    assert watcher.counters["lists"] == 1 and watcher.counters["watch_resumed"] >= 2
    assert gateway.counters["failovers"] >= 2
    assert watcher.counters["watch_events"] == len(truth.events) > 0
    assert counters["stale_revision"] == 0
