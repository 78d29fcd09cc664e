"""Multi-host: engines in their own network namespaces, the client in the root one,
over tcp with CURVE (allow-listed engine keys), on both anyio backends.

* a call and fan-outs reach engines on two other "hosts" (their processes are
  checked to live in other network namespaces than the client's);
* one host's link goes down: a call to it fails with EngineDead within the
  liveness bound while the other host keeps serving; the link comes back and
  the same engine process (same incarnation) rejoins and serves again, both
  after a short outage (the TCP connection survives) and after one longer than
  the kernel's TCP timeout (``ZmqOptions.tcp_max_retransmit_ms``: the unacknowledged
  heartbeats make the kernel drop the connection, the engine redials). ZMTP
  heartbeats are off (they can make libzmq abort, see ``zmq_config``).

Detection and rejoin times are printed. Needs root and iproute2: elsewhere every
test is skipped with the reason (never silently passed).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from netns_hosts import (
    NetnsError,
    NetnsHosts,
    net_namespace_id,
    sweep_stale,
    tcp_connections,
    unavailable_reason,
)

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.errors import EngineDead
from ctlwire.transports.curve import CurveServerConfig, load_keypair, write_keypair
from ctlwire.transports.zmq_client import ZmqRouterClientTransport
from ctlwire.transports.zmq_config import ZmqOptions

pytestmark = [pytest.mark.netns, pytest.mark.anyio, pytest.mark.timeout(120)]

HEARTBEAT = 0.25  # client and engines
MISSES = 4
LIVENESS_BOUND = HEARTBEAT * (MISSES + 1.5)  # misses, half an interval of grace, one tick
SLACK = 1.25  # a shared, noisy CI machine
TCP_TIMEOUT = ZmqOptions().tcp_max_retransmit_ms / 1000


@pytest.fixture
def hosts() -> Iterator[NetnsHosts]:
    """Two engine hosts; removed after the test whatever happens."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    sweep_stale()
    net = NetnsHosts(2)
    try:
        try:
            net.create()
        except NetnsError as exc:
            pytest.skip(f"cannot set up network namespaces and veth links: {exc}")
        failures = net.probe_tcp()
        if failures:
            pytest.skip(f"plain tcp from the namespaces to {net.root_address} fails "
                        f"(a firewall?): {failures}")
        yield net
    finally:
        net.destroy()


@dataclass
class Cluster:
    hosts: NetnsHosts
    address: str
    keys: Path
    fleets: dict[int, EngineFleet]

    def pid(self, rank: int) -> int:
        return self.fleets[rank].engines[rank].pid

    def incarnation(self, rank: int) -> int:
        return self.fleets[rank].engines[rank].incarnation

    def connections(self, rank: int) -> set[int]:
        """Local ports of rank's tcp connections to the client, seen from its host."""
        host, port = self.address[len("tcp://"):].rsplit(":", 1)
        return tcp_connections(self.pid(rank), host, int(port))


def free_port(address: str) -> int:
    import socket

    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


@contextmanager
def engines_on_hosts(hosts: NetnsHosts, tmp: Path) -> Iterator[Cluster]:
    """Keys for the client and each engine; engine rank i runs on host i (serve mode)."""
    keys = tmp / "keys"
    write_keypair(keys, "client")
    for rank in range(len(hosts.namespaces)):
        write_keypair(keys, f"engine{rank}")
    address = f"tcp://{hosts.root_address}:{free_port(hosts.root_address)}"

    def args(rank: int) -> list[str]:
        return ["--connect", address, "--mode", "serve", "--heartbeat", str(HEARTBEAT),
                "--curve-secret", str(keys / f"engine{rank}.key_secret"),
                "--curve-server-key", str(keys / "client.key")]

    with ExitStack() as stack:
        fleets = {}
        for rank in range(len(hosts.namespaces)):
            python = hosts.python_wrapper(rank, str(tmp))
            fleets[rank] = stack.enter_context(EngineFleet([rank], args, python=python))
        yield Cluster(hosts, address, keys, fleets)


@asynccontextmanager
async def client_for(cluster: Cluster) -> AsyncIterator[ControlClient]:
    n = len(cluster.fleets)
    server = load_keypair(cluster.keys / "client.key_secret")
    ranks = {r: load_keypair(cluster.keys / f"engine{r}.key_secret").public for r in range(n)}
    transport = ZmqRouterClientTransport(
        cluster.address, curve=CurveServerConfig.allowing(server, ranks=ranks))
    async with ControlClient(transport, ranks=n, default_timeout=10.0,
                             heartbeat_interval=HEARTBEAT, heartbeat_misses=MISSES) as client:
        await client.wait_ready(timeout=20)
        yield client
        assert transport.auth_rejections == 0
        assert client.registry.live_count == 0


async def test_call_and_fan_out_across_hosts(hosts: NetnsHosts, tmp_path: Path) -> None:
    with engines_on_hosts(hosts, tmp_path) as cluster:
        async with client_for(cluster) as c:
            pids = {r: await c.call("pid", rank=r) for r in range(2)}
            assert pids == {r: cluster.pid(r) for r in range(2)}
            here = net_namespace_id()
            spaces = {net_namespace_id(pid) for pid in pids.values()}
            assert here not in spaces and len(spaces) == 2  # really three "hosts"
            res = await c.fan_out("echo", {"across": "hosts"})
            assert res.results == {0: {"across": "hosts"}, 1: {"across": "hosts"}}
            watched = await c.fan_out("pid", mode="watching")
            assert watched.results == pids
            assert {r: c.peers.peers[r].incarnation for r in range(2)} == {
                r: cluster.incarnation(r) for r in range(2)}


@pytest.mark.parametrize("outage", ["short", "beyond_tcp_timeout"])
async def test_link_down_gives_engine_dead_then_the_engine_rejoins(
        hosts: NetnsHosts, tmp_path: Path, outage: str, anyio_backend: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    down_for = 1.5 if outage == "short" else TCP_TIMEOUT + 1.5
    with engines_on_hosts(hosts, tmp_path) as cluster:
        async with client_for(cluster) as c:
            assert await c.call("echo", "before", rank=0) == "before"
            incarnation = c.peers.peers[0].incarnation
            before = cluster.connections(0)
            assert len(before) == 2  # requests, and the liveness beacon's own connection
            try:
                hosts.link_down(0)
                t_down = time.monotonic()
                with pytest.raises(EngineDead):
                    await c.call("echo", "into the void", rank=0, timeout=30.0)
                detection = time.monotonic() - t_down
                assert detection < LIVENESS_BOUND + SLACK, detection
                # the other host is not affected
                assert await c.call("echo", "still here", rank=1, timeout=5.0) == "still here"
                res = await c.fan_out("echo", "x", timeout=5.0)
                assert res.results == {1: "x"} and isinstance(res.errors[0], EngineDead)
                await anyio.sleep(max(0.0, down_for - (time.monotonic() - t_down)))
            finally:
                hosts.link_up(0)
            t_up = time.monotonic()
            await c.wait_ready([0], timeout=30)
            assert await c.call("echo", "back", rank=0, timeout=5.0) == "back"
            rejoin = time.monotonic() - t_up
            assert c.peers.peers[0].incarnation == incarnation  # the same process rejoined
            assert c.peers.peers[0].rejoin_count >= 1
            assert (await c.fan_out("echo", "all")).results == {0: "all", 1: "all"}
            after = cluster.connections(0)
            reconnected = after != before
            if outage == "beyond_tcp_timeout":
                assert reconnected, (before, after)  # the kernel dropped it, the engine redialled
            with capsys.disabled():
                print(f"\nnetns[{anyio_backend}, {outage}, link down {down_for:.1f} s]: "
                      f"EngineDead after {detection:.2f} s (bound {LIVENESS_BOUND:.2f} s), "
                      f"rejoined {rejoin:.2f} s after the link came back "
                      f"({'new' if reconnected else 'same'} tcp connection)", end="")
