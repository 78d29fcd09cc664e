"""The conformance harness against both implementations, and the Node.js
implementation against the Python one in both directions, on real sockets and
real processes.

The Node.js tests need ``node`` and ``interop/node/node_modules`` (``npm ci`` in
``interop/node``; ``.ci/run`` does it); they are skipped, saying so, without them.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ctlwire.conformance import (
    CLIENT_CASES,
    ENGINE_CASES,
    Check,
    check_client,
    check_engine,
)
from ctlwire.conformance.engine_check import LANE_CASES, ONE_AT_A_TIME_CASES
from ctlwire.conformance.report import ERROR_TABLE
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.errors import (
    NotDelivered,
    RemoteError,
    RequestTimedOut,
    UnsupportedProtocolVersion,
)
from ctlwire.transports.curve import (
    CurveServerConfig,
    load_keypair,
    load_public_key,
    write_keypair,
)
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytestmark = [pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
NODE_DIR = ROOT / "interop" / "node"
NODE = shutil.which("node")
PY = sys.executable
PY_ENGINE = f"{PY} -m ctlwire.app.conformance_peers engine --connect {{address}} " \
            "--rank {rank}"
#: the reference engine's two ways of serving: an event loop with lanes, a poll loop
PY_MODES = ("serve", "poll")
PY_CLIENT = f"{PY} -m ctlwire.app.conformance_peers client --bind {{address}}"
NODE_ENGINE = f"node {NODE_DIR / 'cli.js'} engine --connect {{address}} --rank {{rank}}"
NODE_CLIENT = f"node {NODE_DIR / 'cli.js'} conformance-client --bind {{address}}"
ORDER = "what-an-engine-does-with-a-request"

needs_node = pytest.mark.skipif(
    NODE is None or not (NODE_DIR / "node_modules" / "zeromq").is_dir(),
    reason="the Node.js implementation needs node and `npm ci` in interop/node "
           "(.ci/run installs both)")

#: Where the Python reference engine does not do what the spec says: each case is an
#: expected failure of the Python engine only (in both modes), with the rule it lacks
#: (strict: a case that starts passing must leave this list). The Node.js engine passes
#: every case.
KNOWN_ENGINE_GAPS: dict[str, str] = {}


def failures(report: object) -> list[str]:
    checks = getattr(report, "checks", [])
    assert checks, "no check ran"
    return [c.line() for c in checks if not c.passed]


def _slug(heading: str) -> str:
    """A heading's anchor, as the docs site makes it."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", heading).strip().lower())


def test_every_error_code_and_decision_step_has_a_case_named_after_its_section() -> None:
    spec = (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8")
    anchors = {_slug(h) for h in re.findall(r"^#{2,3} (.+)$", spec, re.M)}
    assert {c.split("/")[0] for c in ENGINE_CASES + CLIENT_CASES} <= anchors
    rows = {f"error-codes/{code}-{name}" for code, name, _cls in ERROR_TABLE}
    engine_side = rows - {"error-codes/501-AsyncHandlerInPoll",  # a polling engine's only
                          # needs an outcome larger than the room the engine's cache has
                          "error-codes/507-ResultNotRetained",
                          "error-codes/599-ConformanceError"} | {
        "error-codes/any-handler-exception"}
    assert set(ENGINE_CASES) >= LANE_CASES | ONE_AT_A_TIME_CASES
    assert not LANE_CASES & ONE_AT_A_TIME_CASES
    assert engine_side <= set(ENGINE_CASES)
    assert {f"error-codes/client-{code}-{name}" for code, name, _cls in ERROR_TABLE} <= set(
        CLIENT_CASES)
    for step in range(1, 12):
        assert any(c.startswith(f"{ORDER}/{step}-") for c in ENGINE_CASES), step
    section = spec[spec.index("## Error codes"):spec.index("Errors a client produces")]
    table = re.findall(r"^\| (\d+) \| `([^`]+)` \|", section, re.M)
    assert {(int(code), name) for code, name in table} == {
        (code, name) for code, name, _cls in ERROR_TABLE if code != 599}
    assert len(ENGINE_CASES) == len(set(ENGINE_CASES)) and set(KNOWN_ENGINE_GAPS) <= set(
        ENGINE_CASES)


@pytest.fixture(scope="module", params=PY_MODES)
def python_engine(request: pytest.FixtureRequest) -> dict[str, Check]:
    """Every engine case against the Python reference engine in one mode: one run, one
    process."""
    report = check_engine(None, 0, f"{PY_ENGINE} --mode {request.param}", 10.0)
    return {c.name: c for c in report.checks}


def test_the_python_engine_ran_every_case_and_no_other(python_engine: dict[str, Check]
                                                       ) -> None:
    assert set(python_engine) == set(ENGINE_CASES)


def test_each_mode_skips_only_the_other_models_cases(python_engine: dict[str, Check],
                                                     request: pytest.FixtureRequest) -> None:
    """Serving, the reference engine receives while a request runs (lanes); polling, it
    runs one request at a time: each is held to its model's rules, and skips only the
    other model's cases."""
    mode = request.node.callspec.params["python_engine"]
    model = python_engine["what-an-engine-does-with-a-request/serving-model"].detail
    skipped = {name for name, check in python_engine.items() if check.skipped}
    if mode == "serve":
        assert model == "receives while a request runs" and skipped == ONE_AT_A_TIME_CASES
    else:
        assert model == "runs one request at a time" and skipped == LANE_CASES


@pytest.mark.parametrize("case", [
    pytest.param(case, marks=pytest.mark.xfail(strict=True, reason=KNOWN_ENGINE_GAPS[case]))
    if case in KNOWN_ENGINE_GAPS else case for case in ENGINE_CASES])
def test_the_python_engine_conforms(case: str, python_engine: dict[str, Check]) -> None:
    check = python_engine[case]
    assert check.passed, check.line()


def test_the_python_client_conforms() -> None:
    assert failures(check_client(None, PY_CLIENT, 90.0)) == []


@needs_node
def test_the_node_engine_conforms() -> None:
    """Through the command line, as CI and other implementations run it: every case,
    the Python engine's known gaps included; the Node.js engine receives while a
    request runs, so it skips only the one-at-a-time cases."""
    proc = subprocess.run([PY, "-m", "ctlwire.conformance", "engine", "--spawn",
                           NODE_ENGINE], capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    skipped = len(ONE_AT_A_TIME_CASES)
    assert "FAIL" not in proc.stdout and (
        f"{len(ENGINE_CASES) - skipped} passed, {skipped} skipped, 0 failed") in proc.stdout
    assert {line.split()[1] for line in proc.stdout.splitlines()
            if line.startswith("SKIP")} == ONE_AT_A_TIME_CASES


@needs_node
def test_the_node_client_conforms() -> None:
    assert failures(check_client(None, NODE_CLIENT, 90.0)) == []


@needs_node
def test_harness_fails_an_engine_of_another_major_version() -> None:
    """The harness can fail: an engine announcing 2.0 fails first contact."""
    report = check_engine(None, 0, NODE_ENGINE + " --version 2.0", 10.0)
    assert any(line.startswith("FAIL  sockets/first-contact") for line in failures(report))


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
    prefix = "FAIL  conformance-harness/client-"
    assert any(line.startswith(prefix + "frames-valid") for line in failed), failed
    assert any(line.startswith(prefix + "heartbeats") for line in failed), failed
    assert any(line.startswith("FAIL  error-codes/client-409-Fenced") for line in failed)
    assert not any(line.startswith(prefix + "echo") for line in failed), failed


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
        assert "UnknownMethod: UnknownMethod" in fail.stderr and "code 404" in fail.stderr
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


def _free_tcp_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def curve_keys(tmp_path: Path) -> dict[str, tuple[Path, Path]]:
    """(public file, secret file) of a client's, an engine's and a stranger's key pair."""
    return {name: write_keypair(tmp_path, name) for name in ("client", "engine", "stranger")}


@needs_node
def test_node_client_calls_a_python_engine_over_tcp_with_curve(
        curve_keys: dict[str, tuple[Path, Path]]) -> None:
    """The Node.js client binds a CURVE server on tcp allowing the engine's key; the
    Python engine connects with its key pair and the client's public key."""
    address = _free_tcp_address()
    client_public, client_secret = curve_keys["client"]
    engine_public, engine_secret = curve_keys["engine"]
    engine = subprocess.Popen([*PY_ENGINE.format(address=address, rank=0).split(),
                               "--curve-keys", str(engine_secret),
                               "--server-key", str(client_public)], stdout=subprocess.DEVNULL)
    try:
        call = subprocess.run(["node", str(NODE_DIR / "cli.js"), "call", "--bind", address,
                               "--rank", "0", "--timeout", "20", "--curve-keys",
                               str(client_secret), "--allow", str(engine_public),
                               "--any-rank", "echo", '{"weights": "/w/step-7"}'],
                              capture_output=True, text=True, timeout=60)
        assert call.returncode == 0, call.stderr
        assert json.loads(call.stdout) == {"weights": "/w/step-7"}
    finally:
        engine.terminate()
        engine.wait(10)


@needs_node
@pytest.mark.anyio
async def test_python_client_calls_a_node_engine_over_tcp_with_curve(
        curve_keys: dict[str, tuple[Path, Path]]) -> None:
    """The Python client binds a CURVE server on tcp binding rank 0 to the engine's key;
    the Node.js engine connects with its key pair and is served. A Node.js engine with a
    key the client does not allow is never heard from."""
    address = _free_tcp_address()
    client_public, client_secret = curve_keys["client"]
    engine_public = curve_keys["engine"][0]
    curve = CurveServerConfig.allowing(load_keypair(client_secret),
                                       ranks={0: load_public_key(engine_public)})
    transport = ZmqRouterClientTransport(address, curve=curve)
    async with ControlClient(transport, ranks=[0, 1], default_timeout=20.0) as client:
        engines = [subprocess.Popen(["node", str(NODE_DIR / "cli.js"), "engine", "--connect",
                                     address, "--rank", str(rank), "--curve-keys",
                                     str(curve_keys[name][1]), "--server-key",
                                     str(client_public)], stdout=subprocess.DEVNULL)
                   for rank, name in ((0, "engine"), (1, "stranger"))]
        try:
            assert await client.call("echo", {"ü": [1, 2.5]}, rank=0) == {"ü": [1, 2.5]}
            with pytest.raises(RemoteError) as info:
                await client.call("fail", "boom", rank=0)
            assert (info.value.type_name, info.value.code) == ("ConformanceError", 599)
            with pytest.raises(NotDelivered, match="never heard from"):
                await client.call("echo", 1, rank=1, timeout=1.0)
        finally:
            for proc in engines:
                proc.terminate()
            for proc in engines:
                proc.wait(10)
