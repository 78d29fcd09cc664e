"""The examples run: the FastAPI server under 200 concurrent mixed requests
(0 non-200 answers), and the RL weight-sync loop on both backends."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _prometheus_samples(text: str) -> dict[str, float]:
    """``name{labels} value`` lines of Prometheus' text format -> {"name{labels}": value}."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_rl_weight_sync_example(backend: str) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLES / "rl_weight_sync.py"), "--engines", "2",
                          "--iterations", "4", "--backend", backend],
                         capture_output=True, text=True, timeout=90)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("COMMITTED") == 4
    assert "versions {" in out.stdout and out.stdout.rstrip().endswith("OK")
    # each rank's load progress, live: the engines' report_progress as ProgressEvents
    shown = re.findall(r"^  rank (\d) update: +(\d+)% shard (\d)/4 of /ckpt/\d$", out.stdout, re.M)
    assert {rank for rank, _, _ in shown} == {"0", "1"}, out.stdout
    assert all(int(pct) == 25 * int(shard) for _, pct, shard in shown), shown


@contextlib.contextmanager
def _http_server(engines: int = 2) -> Iterator[str]:
    """The FastAPI example running with ``engines`` engine processes: its URL. On
    leaving, it is shut down and must have exited cleanly, no engine reported lost."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    port = _free_port()
    server = subprocess.Popen([sys.executable, str(EXAMPLES / "http_server.py"), "--port",
                               str(port), "--engines", str(engines)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, server.communicate()[0]
            try:
                if httpx.get(f"{base}/server_info", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the example server did not come up"
            time.sleep(0.2)
        yield base
    finally:
        server.send_signal(signal.SIGINT)  # uvicorn shuts down: lifespan stops the engines
        try:
            output = server.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            server.kill()
            output = server.communicate()[0]
        print(output[-2000:])
    assert server.returncode == 0, output[-2000:]
    assert f"ctlwire example API server on {base} with {engines} engines" in output, (
        output[-2000:])
    assert "lost" not in output  # a normal shutdown is not an engine loss
    assert "Traceback" not in output, output[-2000:]


def test_http_server_example_answers_200_concurrent_mixed_requests() -> None:
    httpx = pytest.importorskip("httpx")
    with _http_server() as base:
        mix = (["GET /server_info"] * 5 + ["POST /v1/pause", "POST /v1/resume",
                                             "POST /v1/update_weights"]) * 25
        statuses: Counter[int] = Counter()
        bodies: list[str] = []

        async def one(client: httpx.AsyncClient, what: str) -> None:
            verb, path = what.split()
            resp = await client.request(verb, base + path, timeout=60)
            statuses[resp.status_code] += 1
            if resp.status_code != 200:
                bodies.append(f"{what}: {resp.status_code} {resp.text[:300]}")

        async def load() -> float:
            limits = httpx.Limits(max_connections=len(mix))
            async with httpx.AsyncClient(limits=limits) as client:
                start = time.perf_counter()
                async with anyio.create_task_group() as tg:
                    for what in mix:
                        tg.start_soon(one, client, what)
                return time.perf_counter() - start

        took = anyio.run(load)
        print(f"\n{len(mix)} concurrent mixed requests ({Counter(mix)}) in {took:.2f} s: "
              f"statuses {dict(statuses)}")
        assert sum(statuses.values()) == 200
        assert statuses == {200: 200}, bodies[:5]
        final = httpx.get(f"{base}/server_info", timeout=10).json()["ranks"]
        assert {v["version"] for v in final.values()} == {25}  # 25 updates, all committed
        metrics = httpx.get(f"{base}/metrics", timeout=10)
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain; version=")
        samples = _prometheus_samples(metrics.text)
        assert samples["ctlwire_live_requests"] == 0
        assert samples['ctlwire_replies_dropped_total{reason="late"}'] == 0
        assert samples['ctlwire_operations_total{state="committed"}'] == 25
        assert samples['ctlwire_engine_live_requests{rank="1"}'] >= 0
        assert any(k.startswith("ctlwire_request_seconds_bucket{") for k in samples)

        bad = {b"{not json": "JSON is malformed", b'{"version": "seven"}': "Expected `int",
               b"[1, 2]": "Expected `object`"}
        for body, says in bad.items():
            resp = httpx.post(f"{base}/v1/update_weights", content=body, timeout=10)
            assert resp.status_code == 422, (body, resp.status_code, resp.text)
            assert says in resp.json()["error"], resp.json()
        assert httpx.get(f"{base}/server_info", timeout=10).status_code == 200


def test_http_server_example_answers_whatever_it_is_sent_with_a_4xx_not_a_500() -> None:
    httpx = pytest.importorskip("httpx")
    with _http_server() as base:
        def post(path: str, **kwargs: Any) -> Any:
            return httpx.post(base + path, timeout=30, **kwargs)

        refused = {
            "a version past int64": (post("/v1/update_weights", json={"version": 2**64}), 422,
                                     "Expected `int` <= 9223372036854775807"),
            "a version of 0": (post("/v1/update_weights", json={"version": 0}), 422, ">= 1"),
            "an unknown field": (post("/v1/update_weights", json={"versoin": 3}), 422,
                                 "unknown field `versoin`"),
            "a 24 MiB path": (post("/v1/update_weights",
                                   json={"path": "x" * (24 << 20)}), 413, "65536 bytes"),
            "valid JSON and 20 MiB of blanks": (post("/v1/update_weights",
                                                     content=b"{}" + b" " * (20 << 20)), 413,
                                                "65536 bytes"),
            "a pause mode of nonsense": (post("/v1/pause?mode=nonsense"), 422, "abort"),
            "ranks of nonsense": (httpx.get(f"{base}/server_info?ranks=some", timeout=10),
                                  422, "admissible"),
            "an unknown rank": (post("/v1/ranks/7/release"), 404, "no rank 7"),
            "a rank that is not a number": (post("/v1/ranks/one/release"), 422, "integer"),
            "a rank not quarantined": (post("/v1/ranks/1/release"), 409, "not quarantined"),
        }
        for what, (resp, status, says) in refused.items():
            assert resp.status_code == status, (what, resp.status_code, resp.text[:300])
            assert says in resp.text, (what, resp.text[:300])
        # the last versions: 2^63 - 1 commits; the one after it is refused, not a 500
        top = post("/v1/update_weights", json={"version": 2**63 - 1})
        assert top.status_code == 200 and top.json()["version"] == 2**63 - 1, top.text
        after = post("/v1/update_weights")
        assert after.status_code == 409 and "is the last one" in after.text, after.text
        info = httpx.get(f"{base}/server_info", timeout=10)
        assert info.status_code == 200
        assert {v["version"] for v in info.json()["ranks"].values()} == {2**63 - 1}


def test_http_server_example_names_a_killed_rank_until_it_is_back_and_released() -> None:
    httpx = pytest.importorskip("httpx")

    def until(status: int, request: Callable[[], Any], within: float = 60,
              holds: Callable[[Any], bool] = lambda body: True) -> Any:
        """The first answer of ``request()`` with ``status`` and a body that ``holds``."""
        deadline = time.monotonic() + within
        while (resp := request()).status_code != status or not holds(resp.json()):
            assert time.monotonic() < deadline, (resp.status_code, resp.text[:500])
            time.sleep(0.1)
        return resp.json()

    with _http_server() as base:
        def server_info(ranks: str = "all") -> Any:
            return httpx.get(f"{base}/server_info?ranks={ranks}", timeout=30)

        def update() -> Any:
            return httpx.post(f"{base}/v1/update_weights", timeout=60)

        assert update().json()["version"] == 1
        pid = server_info().json()["ranks"]["1"]["pid"]
        os.kill(pid, signal.SIGKILL)
        # the fleet is not healthy: the answer is a 503 that names rank 1, and why
        down = until(503, server_info)
        assert "0" in down["ranks"] and "1" in down["errors"], down
        assert "rank 1" in down["error"], down
        # restarted on its initial weights, it is held out of routing, and says so
        held = until(503, server_info, holds=lambda body: "left_out" in body)
        assert held["left_out"] == {"1": "quarantined"}, held
        assert held["errors"] == {"1": "RankLeftOut: rank 1 left out: quarantined"}, held
        assert "engine process exited" in held["quarantined"]["1"]["detail"], held
        assert held["error"] == "get_server_info: 1 ok (rank 0); 1 left out (rank 1: quarantined)"
        # asked for explicitly, the admissible ranks alone are a 200 that lists the rest
        only = server_info("admissible")
        assert only.status_code == 200 and only.json()["left_out"] == {"1": "quarantined"}
        # an update commits on rank 0 and is not a 200: the fleet has a rank out
        partial = update()
        assert partial.status_code == 503, partial.text
        assert partial.json()["state"] == "COMMITTED" and partial.json()["version"] == 2
        assert partial.json()["left_out"] == {"1": "quarantined"}, partial.text
        # back, brought to version 2 and released: 200 again, one version everywhere
        released = until(200, lambda: httpx.post(f"{base}/v1/ranks/1/release", timeout=60))
        assert released["state"] == "COMMITTED" and released["version"] == 2, released
        healthy = until(200, server_info, within=5)
        assert {r: v["version"] for r, v in healthy["ranks"].items()} == {"0": 2, "1": 2}
        assert "left_out" not in healthy and healthy["ranks"]["1"]["pid"] != pid


def test_torch_engine_example_every_rank_decodes_like_the_trainer() -> None:
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, str(EXAMPLES / "torch_engine" / "train.py"),
                          "--engines", "2", "--cycles", "2", "--backend", "trio"],
                         capture_output=True, text=True, timeout=150)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("every rank decodes like the trainer: True") == 2
    assert out.stdout.rstrip().endswith("OK")
