"""An HTTP API server whose admin endpoints fan out to real engine processes.

    python examples/http_server.py [--port 8000] [--engines 2]

``GET /server_info``, ``POST /v1/pause``, ``POST /v1/update_weights``,
``POST /v1/resume`` on FastAPI + uvicorn (127.0.0.1), each a ctlwire call to
every engine rank, and ``GET /metrics`` in Prometheus' text format (the
client's, its operations' and every engine's metrics) — the scenario that gave SGLang its
intermittent 500s: concurrent ``/server_info`` callers racing through a
hand-rolled queue. Here ``/server_info`` uses the queueing mailbox (strictly
first come, first served), a weight update is one coordinated operation
(pause -> update_weights -> resume, compensated on failure), and every error
is typed and per rank. A malformed request body is answered 422 with a
message. Prints its URL once the engines are ready. Needs the ``examples``
extra (fastapi, uvicorn, prometheus-client).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import msgspec
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ctlwire.kernel import (
    ControlClient,
    CtlwireError,
    FanOutResult,
    OperationPlan,
    OperationRunner,
    OperationStep,
    PrometheusExporter,
    RequestMetrics,
    StepCall,
)
from ctlwire.transports import ZmqRouterClientTransport

from engine_methods import Pause, RestoreWeights, UpdateWeights
from fleet import engine_fleet


class UpdateRequest(msgspec.Struct):
    version: int | None = None
    path: str = ""


def _answer(res: FanOutResult) -> JSONResponse:
    """200 with every rank's answer, or 503 naming every rank's typed error."""
    if res.errors:
        return JSONResponse(status_code=503, content={
            "errors": {r: f"{type(e).__name__}: {e}" for r, e in res.errors.items()},
            "results": res.results})
    return JSONResponse({"ranks": res.results})


def _bad_request(message: str) -> JSONResponse:
    return JSONResponse(status_code=422, content={"error": message})


def create_app(engines: int = 2, url: str = "") -> FastAPI:
    """The app; ``url``, when given, is printed once every engine is ready."""
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        router = ZmqRouterClientTransport()  # a private ipc socket (0600), bound by the client
        requests = RequestMetrics()  # per-method latency and outcomes, for /metrics
        async with ControlClient(router, ranks=engines, default_timeout=10.0,
                                 observer=requests) as client:
            fleet = engine_fleet(engines, router.address)
            await anyio.to_thread.run_sync(fleet.start)
            try:
                await client.wait_ready(timeout=30)
                runner = OperationRunner(client)
                registry = CollectorRegistry()  # this app's own, not the process-wide one
                PrometheusExporter(client, requests, operations=runner).register(registry)
                state.update(client=client, runner=runner, registry=registry,
                             update_lock=anyio.Lock(), version=0)
                if url:
                    print(f"ctlwire example API server on {url} with {engines} engines "
                          f"(GET {url}/server_info, GET {url}/metrics)", flush=True)
                yield
            finally:
                await client.aclose()  # the engines' exit is then no loss
                await anyio.to_thread.run_sync(fleet.stop)

    app = FastAPI(lifespan=lifespan)

    @app.get("/server_info")
    async def server_info() -> JSONResponse:
        return _answer(await state["client"].fan_out("get_server_info", mode="queueing"))

    @app.post("/v1/pause")
    async def pause(mode: str = "drain") -> JSONResponse:
        return _answer(await state["client"].fan_out("pause", Pause(mode)))

    @app.post("/v1/resume")
    async def resume() -> JSONResponse:
        return _answer(await state["client"].fan_out("resume"))

    @app.post("/v1/update_weights")
    async def update_weights(request: Request) -> JSONResponse:
        try:
            body = msgspec.json.decode(await request.body() or b"{}", type=UpdateRequest)
        except msgspec.DecodeError as exc:  # malformed JSON, or the wrong types
            return _bad_request(f"invalid body for /v1/update_weights: {exc}")
        async with state["update_lock"]:  # one weight update at a time, in arrival order
            old = state["version"]
            new = max(old + 1, body.version or 0)
            plan = OperationPlan("weight-update", (
                OperationStep("pause", "pause", Pause("drain"), timeout=10,
                              compensation=StepCall("resume")),
                OperationStep("update", "update_weights", UpdateWeights(new, body.path),
                              timeout=30,
                              compensation=StepCall("restore_weights", RestoreWeights(old))),
                OperationStep("resume", "resume", timeout=10),
            ))
            result = await state["runner"].run(plan)
            if result.state.name == "COMMITTED":
                state["version"] = new
        content = {"state": result.state.name, "version": state["version"],
                   "ranks": {r: rep.state.name for r, rep in result.ranks.items()}}
        return JSONResponse(status_code=200 if result.state.name == "COMMITTED" else 503,
                            content=content)

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text format; each engine's metrics are read fresh first."""
        client: ControlClient = state["client"]
        for rank in client.ranks:
            # the exporter shows each engine's last read; a lost rank keeps its
            # last one, and its peer_state says it is lost
            with contextlib.suppress(CtlwireError):
                await client.engine_metrics(rank, timeout=2)
        return Response(generate_latest(state["registry"]), media_type=CONTENT_TYPE_LATEST)

    return app


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--engines", type=int, default=2)
    args = parser.parse_args(argv)
    url = f"http://127.0.0.1:{args.port}"
    uvicorn.run(create_app(args.engines, url), host="127.0.0.1", port=args.port,
                log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
