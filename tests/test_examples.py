"""The examples run: the FastAPI server under 200 concurrent mixed requests
(0 non-200 answers), and the RL weight-sync loop on both backends."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

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


def test_http_server_example_answers_200_concurrent_mixed_requests() -> None:
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    port = _free_port()
    server = subprocess.Popen([sys.executable, str(EXAMPLES / "http_server.py"), "--port",
                               str(port), "--engines", "2"], stdout=subprocess.PIPE,
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
    finally:
        server.send_signal(signal.SIGINT)  # uvicorn shuts down: lifespan stops the engines
        try:
            output = server.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            server.kill()
            output = server.communicate()[0]
        print(output[-2000:])
    assert server.returncode == 0, output[-2000:]
    assert f"ctlwire example API server on {base} with 2 engines" in output, output[-2000:]
    assert "lost" not in output  # a normal shutdown is not an engine loss


def test_torch_engine_example_every_rank_decodes_like_the_trainer() -> None:
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, str(EXAMPLES / "torch_engine" / "train.py"),
                          "--engines", "2", "--cycles", "2", "--backend", "trio"],
                         capture_output=True, text=True, timeout=150)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("every rank decodes like the trainer: True") == 2
    assert out.stdout.rstrip().endswith("OK")
