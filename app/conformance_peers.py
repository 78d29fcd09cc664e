"""The Python side under the conformance harness (:mod:`ctlwire.conformance`):
an engine serving the spec's conformance methods, and a client running the spec's
conformance script (``docs/protocol.md``, Conformance)::

    python -m ctlwire.app.conformance_peers engine --connect ADDR --rank N [--mode poll]
    python -m ctlwire.app.conformance_peers client --bind ADDR

The engine serves (``--mode serve``, the default: ``sleep`` and ``hold`` are async, so
they wait and run in their methods' lanes while the engine keeps receiving) or polls
(``--mode poll``: a synchronous loop of :meth:`EngineEndpoint.poll`, every handler sync,
one request at a time).

Both use NULL security (ipc addresses, tcp with ``--allow-insecure-tcp``, or an abstract
ipc name with ``--allow-abstract-ipc``); the engine speaks CURVE with ``--curve-keys
NAME.key_secret --server-key KEY`` (its key pair, and the client's public key: a z85
key or a ``NAME.key`` file).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any, Literal

import anyio

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.engine.operation_ledger import OperationLedger
from ctlwire.kernel.errors import CtlwireError
from ctlwire.transports.curve import CurveClientConfig, load_keypair, load_public_key
from ctlwire.transports.zmq_client import ZmqRouterClientTransport
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

__all__ = ["ConformanceError", "conformance_engine", "main", "run_client_script"]

#: what the conformance method ``unencodable`` returns: an integer beyond MessagePack's
UNENCODABLE = 2**64


class ConformanceError(CtlwireError):
    """What the conformance method ``fail`` raises."""

    code = 599


def conformance_engine(address: str, rank: int, *, allow_insecure_tcp: bool = False,
                       allow_abstract_ipc: bool = False,
                       curve: CurveClientConfig | None = None,
                       mode: Literal["serve", "poll"] = "serve") -> EngineEndpoint:
    """An engine of ``rank`` connecting to ``address``, serving ``echo``, ``count``,
    ``sleep``, ``fail``, ``blob`` and ``unencodable``, and an operation ledger whose
    step methods are ``mark`` and ``hold``; ``sleep`` and ``hold`` are async for
    ``mode="serve"`` and sync for ``mode="poll"``."""
    endpoint = EngineEndpoint(ZmqDealerEngineTransport(address, rank, curve=curve,
                                                       allow_insecure_tcp=allow_insecure_tcp,
                                                       allow_abstract_ipc=allow_abstract_ipc),
                              rank=rank)
    counted = [0]

    @endpoint.method()
    def echo(value: Any = None) -> Any:
        return value

    @endpoint.method()
    def count() -> int:
        counted[0] += 1
        return counted[0]

    async def sleep_async(seconds: float) -> float:
        await anyio.sleep(seconds)
        return seconds

    def sleep_sync(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    waits = {"serve": sleep_async, "poll": sleep_sync}[mode]
    endpoint.register("sleep", waits)

    @endpoint.method()
    def fail(message: str) -> None:
        raise ConformanceError(message)

    @endpoint.method()
    def blob(size: int) -> str:
        return "x" * size

    @endpoint.method()
    def unencodable() -> int:
        return UNENCODABLE

    def mark(value: Any = None) -> Any:
        return value

    OperationLedger({"mark": mark, "hold": waits}).install(endpoint)
    return endpoint


def _outcome(step: str, value: Any = None, exc: BaseException | None = None
             ) -> dict[str, Any]:
    if exc is None:
        return {"step": step, "ok": True, "value": value}
    return {"step": step, "ok": False, "class": type(exc).__name__,
            "type": getattr(exc, "type_name", ""), "code": getattr(exc, "code", 0),
            "message": str(exc)}


async def run_client_script(address: str, *, allow_insecure_tcp: bool = False,
                            allow_abstract_ipc: bool = False) -> None:
    """The conformance script, one JSON line per step on stdout."""
    def out(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj, ensure_ascii=False, default=str) + "\n")
        sys.stdout.flush()

    transport = ZmqRouterClientTransport(address, allow_insecure_tcp=allow_insecure_tcp,
                                         allow_abstract_ipc=allow_abstract_ipc)
    async with ControlClient(transport, ranks=[0, 1, 2], default_timeout=20.0) as client:
        out(_outcome("bound", transport.address))

        async def step(name: str, method: str, payload: Any = None, **kw: Any) -> Any:
            try:
                value = await client.call(method, payload, **kw)
            except Exception as exc:
                out(_outcome(name, exc=exc))
                return None
            out(_outcome(name, value))
            return value

        await step("echo", "echo", {"x": [1, "ü"]}, rank=0)
        await step("unknown-method", "重みを更新", rank=0)
        await step("fail", "fail", "boom", rank=0)
        await step("timeout", "sleep", 2.0, rank=1, timeout=0.5)
        fan = await client.fan_out("echo", "all", ranks=[0, 1], timeout=20.0)
        out({"step": "fan-out", "ok": not fan.errors,
             "value": {str(r): v for r, v in fan.results.items()}})
        await step("version", "echo", rank=2)
        values = []
        for _ in range(2):
            try:
                values.append(await client.call("count", rank=0, idempotency_key="k1"))
            except Exception as exc:
                values.append(repr(exc))
        out({"step": "key", "ok": all(isinstance(v, int) for v in values), "value": values})
        rows: list[list[Any]] = []
        try:
            rows = await client.call("error_table", rank=0)
        except Exception as exc:
            out(_outcome("errors", exc=exc))
        errors = []
        for type_name, code in rows:
            try:
                await client.call("error", [type_name, code], rank=0)
            except Exception as exc:
                errors.append({k: _outcome("errors", exc=exc)[k] for k in ("type", "code",
                                                                            "class")})
        if rows:
            out({"step": "errors", "ok": True, "value": errors})
        out(_outcome("done", client.metrics()["counters"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ctlwire.app.conformance_peers")
    sub = parser.add_subparsers(dest="role", required=True)
    eng = sub.add_parser("engine")
    eng.add_argument("--connect", required=True)
    eng.add_argument("--rank", type=int, default=0)
    eng.add_argument("--allow-insecure-tcp", action="store_true")
    eng.add_argument("--allow-abstract-ipc", action="store_true")
    eng.add_argument("--curve-keys", help="this engine's key pair (a NAME.key_secret file)")
    eng.add_argument("--server-key", help="the client's public key (z85, or a NAME.key file)")
    eng.add_argument("--mode", choices=("serve", "poll"), default="serve",
                     help="serve (an event loop, lanes) or poll (a sync loop, one request "
                          "at a time)")
    cli = sub.add_parser("client")
    cli.add_argument("--bind", required=True)
    cli.add_argument("--allow-insecure-tcp", action="store_true")
    cli.add_argument("--allow-abstract-ipc", action="store_true")
    args = parser.parse_args(argv)
    if args.role == "engine":
        curve = None
        if args.curve_keys:
            server = args.server_key or ""
            curve = CurveClientConfig(load_keypair(args.curve_keys), (
                server.encode() if len(server) == 40 else load_public_key(server)))
        endpoint = conformance_engine(args.connect, args.rank, curve=curve,
                                      allow_insecure_tcp=args.allow_insecure_tcp,
                                      allow_abstract_ipc=args.allow_abstract_ipc,
                                      mode=args.mode)
        with contextlib.suppress(KeyboardInterrupt):
            if args.mode == "poll":
                endpoint.run_blocking()
            else:
                anyio.run(endpoint.serve)
        return 0
    anyio.run(lambda: run_client_script(args.bind, allow_insecure_tcp=args.allow_insecure_tcp,
                                        allow_abstract_ipc=args.allow_abstract_ipc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
