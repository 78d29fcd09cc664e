"""The conformance harness against both implementations, and the Node.js
implementation against the Python one in both directions, on real sockets and
real processes.

The Node.js tests need ``node`` and ``interop/node/node_modules`` (``npm ci`` in
``interop/node``; ``.ci/run`` does it); they are skipped, saying so, without them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.errors import RemoteError, RequestTimedOut, UnsupportedProtocolVersion
from ctlwire.transports.conformance import check_client, check_engine
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytestmark = [pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "interop" / "node"
NODE = shutil.which("node")
PY = sys.executable
PY_ENGINE = f"{PY} -m ctlwire.kernel.app.conformance_peers engine --connect {{address}} " \
            "--rank {rank}"
PY_CLIENT = f"{PY} -m ctlwire.kernel.app.conformance_peers client --bind {{address}}"
NODE_ENGINE = f"node {NODE_DIR / 'cli.js'} engine --connect {{address}} --rank {{rank}}"
NODE_CLIENT = f"node {NODE_DIR / 'cli.js'} conformance-client --bind {{address}}"

needs_node = pytest.mark.skipif(
    NODE is None or not (NODE_DIR / "node_modules" / "zeromq").is_dir(),
    reason="the Node.js implementation needs node and `npm ci` in interop/node "
           "(.ci/run installs both)")


def failures(report: object) -> list[str]:
    checks = getattr(report, "checks", [])
    assert checks, "no check ran"
    return [c.line() for c in checks if not c.passed]


def test_the_python_engine_conforms() -> None:
    assert failures(check_engine(None, 0, PY_ENGINE, 10.0)) == []


def test_the_python_client_conforms() -> None:
    assert failures(check_client(None, PY_CLIENT, 90.0)) == []


@needs_node
def test_the_node_engine_conforms() -> None:
    """Through the command line, as CI and other implementations run it."""
    proc = subprocess.run([PY, "-m", "ctlwire.transports.conformance", "engine", "--spawn",
                           NODE_ENGINE], capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout and " 0 failed" in proc.stdout


@needs_node
def test_the_node_client_conforms() -> None:
    assert failures(check_client(None, NODE_CLIENT, 90.0)) == []


@needs_node
def test_harness_fails_an_engine_of_another_major_version() -> None:
    """The harness can fail: an engine announcing 2.0 fails first contact."""
    report = check_engine(None, 0, NODE_ENGINE + " --version 2.0", 10.0)
    assert any(line.startswith("FAIL  first-contact") for line in failures(report))


def test_harness_fails_a_client_that_reports_without_calling(tmp_path: Path) -> None:
    """The client checks look at the wire, not only at what the client says: a
    program that prints the right outcomes without calling anything fails."""
    lines = [{"step": "echo", "ok": True, "value": {"x": [1, "ü"]}},
             {"step": "fan-out", "ok": True, "value": {"0": "all", "1": "all"}},
             {"step": "done", "ok": True, "value": {}}]
    script = tmp_path / "liar.py"
    script.write_text("import json\n" + "".join(
        f"print(json.dumps({line!r}))\n" for line in lines))
    failed = failures(check_client(None, f"{PY} {script}", 30.0))
    assert any(line.startswith("FAIL  client-frames-valid") for line in failed), failed
    assert any(line.startswith("FAIL  client-heartbeats") for line in failed), failed
    assert not any(line.startswith("FAIL  client-echo") for line in failed), failed


@contextmanager
def node_engines(address: str, *ranks: tuple[int, str]) -> Iterator[None]:
    procs = [subprocess.Popen(["node", str(NODE_DIR / "cli.js"), "engine", "--connect",
                               address, "--rank", str(rank), "--version", version],
                              stdout=subprocess.DEVNULL) for rank, version in ranks]
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)


@needs_node
@pytest.mark.anyio
async def test_python_client_calls_node_engines() -> None:
    transport = ZmqRouterClientTransport()
    async with ControlClient(transport, ranks=[0, 1, 2], default_timeout=20.0) as client:
        with node_engines(transport.address, (0, "1.0"), (1, "1.3"), (2, "2.0")):
            assert await client.call("echo", {"ü": [1, 2.5]}, rank=0) == {"ü": [1, 2.5]}
            fan = await client.fan_out("echo", "all", ranks=[0, 1])
            assert fan.results == {0: "all", 1: "all"} and not fan.errors
            with pytest.raises(RemoteError) as info:
                await client.call("fail", "boom", rank=1)
            assert (info.value.type_name, info.value.code) == ("ConformanceError", 599)
            with pytest.raises(RequestTimedOut):
                await client.call("sleep", 2.0, rank=0, timeout=0.3)
            first = await client.call("count", rank=0, idempotency_key="once")
            assert await client.call("count", rank=0, idempotency_key="once") == first
            with pytest.raises(UnsupportedProtocolVersion):
                await client.call("echo", 1, rank=2)
            assert client.metrics()["counters"]["dropped_protocol_version"] >= 1


@needs_node
def test_node_client_calls_a_python_engine() -> None:
    """The README's example: the Node.js client's ``call`` against a Python engine."""
    directory = tempfile.mkdtemp(prefix="ctlwire-node-")
    address = f"ipc://{directory}/control"
    engine = subprocess.Popen(PY_ENGINE.format(address=address, rank=0).split(),
                              stdout=subprocess.DEVNULL)
    try:
        call = subprocess.run(["node", str(NODE_DIR / "cli.js"), "call", "--bind", address,
                               "--rank", "0", "echo", '{"weights": "/w/step-7"}'],
                              capture_output=True, text=True, timeout=60)
        assert call.returncode == 0, call.stderr
        assert json.loads(call.stdout) == {"weights": "/w/step-7"}
        fail = subprocess.run(["node", str(NODE_DIR / "cli.js"), "call", "--bind", address,
                               "--rank", "0", "nope"], capture_output=True, text=True,
                              timeout=60)
        assert fail.returncode == 1
        assert "RemoteError: UnknownMethod" in fail.stderr and "code 404" in fail.stderr
    finally:
        engine.terminate()
        engine.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


@needs_node
def test_node_client_calls_ranks_sharing_a_beacon() -> None:
    """Three Python engine ranks in one process send their heartbeats in one group
    beacon message a beat (``beats-0-3``): the Node.js client takes each frame as its
    rank's heartbeat, so it reaches every rank."""
    directory = tempfile.mkdtemp(prefix="ctlwire-node-")
    address = f"ipc://{directory}/control"
    engine = subprocess.Popen([sys.executable, "-m", "ctlwire.benchmarks.multi_rank_engine",
                               "--rank", "0", "--first", "0", "--count", "3", "--connect",
                               address], stdout=subprocess.DEVNULL)
    try:
        for rank in (0, 2):
            call = subprocess.run(["node", str(NODE_DIR / "cli.js"), "call", "--bind", address,
                                   "--rank", str(rank), "--timeout", "20", "echo",
                                   json.dumps(rank)], capture_output=True, text=True,
                                  timeout=60)
            assert call.returncode == 0, call.stderr
            assert json.loads(call.stdout) == rank
    finally:
        engine.terminate()
        engine.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


@needs_node
def test_node_decodes_every_vector() -> None:
    """The Node.js decoder against the conformance vectors: every envelope decodes to
    its meaning's fields, every refused frame is refused with the same salvaged id."""
    proc = subprocess.run(["node", str(NODE_DIR / "check_vectors.js"),
                           str(ROOT / "protocol" / "vectors")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []
