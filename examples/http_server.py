"""An HTTP API server whose admin endpoints fan out to real engine processes.

    python examples/http_server.py [--port 8000] [--engines 2]

``GET /server_info``, ``POST /v1/pause``, ``POST /v1/update_weights``,
``POST /v1/resume`` on FastAPI + uvicorn (127.0.0.1), each a ctlwire call to
every engine rank, ``POST /v1/ranks/{rank}/release`` and ``GET /metrics`` in
Prometheus' text format (the client's, its operations' and every engine's
metrics) — the scenario that gave SGLang its intermittent 500s: concurrent
``/server_info`` callers racing through a hand-rolled queue. Here
``/server_info`` uses the queueing mailbox (strictly first come, first served),
a weight update is one coordinated operation (pause -> update_weights -> resume,
compensated on failure), and every error is typed and per rank.

What it answers, and never a 500:

* 200 only when every rank of the fleet answered ok. A rank that failed, or that
  a fan-out left out (quarantined, not admitted), makes it a 503 that names the
  rank and why; ``?ranks=admissible`` asks for the admissible ranks only (200,
  the ranks left out still listed).
* 413 for a body over 64 KiB, 422 for a malformed body or query value (a version
  out of 1..2^63-1, a pause mode other than abort, drain or keep) and for a plan
  the runner refuses, 409 once the version space is used up, 504 when time ran out.
* An engine process that exits is restarted and held out of routing (it comes
  back on its initial weights) until ``POST /v1/ranks/{rank}/release`` brings it
  to the fleet's version and releases it.

Prints its URL once the engines are ready. Needs the ``examples`` extra
(fastapi, uvicorn, prometheus-client).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

import anyio
import msgspec
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ctlwire.kernel import (
    ControlClient,
    CtlwireError,
    EngineFleet,
    FanOutFailed,
    FanOutResult,
    InvalidPlan,
    NoAdmissibleRanks,
    OperationPlan,
    OperationResult,
    OperationRunner,
    OperationStep,
    PostCondition,
    PrometheusExporter,
    RequestMetrics,
    RequestTimedOut,
    StepCall,
)
from ctlwire.transports import ZmqRouterClientTransport

from engine_methods import Pause, RestoreWeights, UpdateWeights
from fleet import engine_fleet

MAX_BODY = 64 * 1024
MAX_VERSION = 2**63 - 1  # an int64 everywhere, whatever language reads it
Ranks = Literal["all", "admissible"]  # "admissible": the ranks left out do not count


class UpdateRequest(msgspec.Struct, forbid_unknown_fields=True):
    version: Annotated[int, msgspec.Meta(ge=1, le=MAX_VERSION)] | None = None
    path: Annotated[str, msgspec.Meta(max_length=4096)] = ""


def _error(status: int, message: str, **more: Any) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": message, **more})


def _answer(res: FanOutResult, client: ControlClient) -> JSONResponse:
    """200 with every rank's answer when the fleet answered ok, else 503 naming
    every rank that did not: its typed error, or why it was left out (and, for a
    quarantined rank, the operation, step and detail that put it there)."""
    body: dict[str, Any] = {"ranks": res.results}
    if res.left_out:
        body["left_out"] = res.left_out
        held = client.quarantine.snapshot()
        body["quarantined"] = {r: held[r] for r in res.left_out if r in held}
    if res.ok:
        return JSONResponse(body)
    body["errors"] = {r: f"{type(e).__name__}: {e}" for r, e in res.failures.items()}
    return _error(503, res.summary(), **body)


async def _fan_out(client: ControlClient, method: str, payload: Any = None, *,
                   ranks: Ranks = "all", mode: Literal["queueing"] | None = None
                   ) -> JSONResponse:
    """One fan-out, answered; every way it can end is a typed answer."""
    try:
        res = await client.fan_out(method, payload, mode=mode,
                                   ranks="admissible" if ranks == "admissible" else None)
    except FanOutFailed as exc:  # no rank could answer at all
        res = exc.result
    except RequestTimedOut as exc:
        partial = exc.partial
        return _error(504, str(exc), **({} if partial is None else {
            "ranks": partial.results, "pending": list(partial.pending),
            "left_out": partial.left_out}))
    except NoAdmissibleRanks as exc:
        return _error(503, str(exc), left_out=exc.left_out)
    return _answer(res, client)


async def _body(request: Request) -> bytes | None:
    """The request body, or None when it is over MAX_BODY (read no further)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY:
            return None
    return bytes(body)


def weight_update_plan(new: int, old: int) -> OperationPlan:
    """pause -> update_weights(new) -> resume, each undone on failure; it commits
    only once every rank serves ``new`` (what a released rank must meet; whether it
    is paused is ``/v1/pause``'s and ``/v1/resume``'s to say, which may run meanwhile)."""
    return OperationPlan("weight-update", (
        OperationStep("pause", "pause", Pause("drain"), timeout=10,
                      compensation=StepCall("resume")),
        OperationStep("update", "update_weights", UpdateWeights(new), timeout=30,
                      compensation=StepCall("restore_weights", RestoreWeights(old))),
        OperationStep("resume", "resume", timeout=10),
    ), PostCondition("get_server_info", {"version": new}, timeout=10))


def _outcome(result: OperationResult, version: int) -> JSONResponse:
    """200 when the operation committed on every rank of the fleet, else 503
    naming each rank's state, why it failed, and the ranks left out."""
    content = {"state": result.state.name, "version": version,
               "ranks": {r: rep.state.name for r, rep in result.ranks.items()},
               "left_out": result.left_out,
               "failed": {r: result.ranks[r].detail for r in result.failed_ranks}}
    if result.ok:
        return JSONResponse(content)
    return _error(503, result.summary(), **content)


async def _supervise(fleet: EngineFleet, runner: OperationRunner,
                     state: dict[str, Any]) -> None:
    """Restart an engine process that exited. It comes back on its initial
    weights: it is held out of routing (quarantined) until caught up."""
    while True:
        await anyio.sleep(0.2)
        for rank, engine in list(fleet.engines.items()):
            if not engine.alive:
                runner.quarantine(rank, detail="its engine process exited; restarted on its "
                                  "initial weights", postcondition=PostCondition(
                                      "get_server_info", {"version": state["version"]}))
                await anyio.to_thread.run_sync(fleet.restart, rank)


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
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_supervise, fleet, runner, state)
                    yield
                    tg.cancel_scope.cancel()
            finally:
                await client.aclose()  # the engines' exit is then no loss
                await anyio.to_thread.run_sync(fleet.stop)

    app = FastAPI(lifespan=lifespan)

    @app.exception_handler(CtlwireError)
    async def typed(request: Request, exc: CtlwireError) -> JSONResponse:
        """Whatever else ctlwire raises (the client closing, say): typed, a 503."""
        return _error(503, f"{type(exc).__name__}: {exc}")

    @app.get("/server_info")
    async def server_info(ranks: Ranks = "all") -> JSONResponse:
        return await _fan_out(state["client"], "get_server_info", ranks=ranks, mode="queueing")

    @app.post("/v1/pause")
    async def pause(mode: Literal["abort", "drain", "keep"] = "drain",
                    ranks: Ranks = "all") -> JSONResponse:
        return await _fan_out(state["client"], "pause", Pause(mode), ranks=ranks)

    @app.post("/v1/resume")
    async def resume(ranks: Ranks = "all") -> JSONResponse:
        return await _fan_out(state["client"], "resume", ranks=ranks)

    @app.post("/v1/update_weights")
    async def update_weights(request: Request, ranks: Ranks = "all") -> JSONResponse:
        raw = await _body(request)
        if raw is None:
            return _error(413, f"the body of /v1/update_weights is limited to {MAX_BODY} bytes")
        try:
            body = msgspec.json.decode(raw or b"{}", type=UpdateRequest)
        except msgspec.DecodeError as exc:  # malformed JSON, the wrong types, out of range
            return _error(422, f"invalid body for /v1/update_weights: {exc}")
        runner: OperationRunner = state["runner"]
        async with state["update_lock"]:  # one weight change at a time, in arrival order
            old = state["version"]
            new = max(old + 1, body.version or 0)
            if new > MAX_VERSION:
                return _error(409, f"weight version {old} is the last one ({MAX_VERSION})")
            try:
                result = await runner.run(weight_update_plan(new, old),
                                          ranks="admissible" if ranks == "admissible" else None)
            except InvalidPlan as exc:  # found before anything was sent
                routable, left_out = state["client"].routable_ranks()
                if not routable:
                    return _error(503, f"no rank to update: {exc}", left_out=left_out)
                return _error(422, f"invalid update: {exc}")
            if result.state.name == "COMMITTED":  # on the ranks it ran on
                state["version"] = new
        return _outcome(result, state["version"])

    @app.post("/v1/ranks/{rank}/release")
    async def release(rank: int) -> JSONResponse:
        """Bring a quarantined rank to the fleet's version, then back into routing."""
        client: ControlClient = state["client"]
        runner: OperationRunner = state["runner"]
        if rank not in client.ranks:
            return _error(404, f"no rank {rank} (ranks: {list(client.ranks)})")
        async with state["update_lock"]:
            if rank not in runner.quarantined:
                return _error(409, f"rank {rank} is not quarantined")
            version = state["version"]
            try:
                info = await client.call("get_server_info", rank=rank, timeout=5)
                result = await runner.catch_up(
                    weight_update_plan(version, info["version"]), rank)
            except CtlwireError as exc:  # not reachable (yet), or the plan refused
                return _error(503, f"rank {rank} stays quarantined: {type(exc).__name__}: "
                                   f"{exc}")
        return _outcome(result, version)

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
