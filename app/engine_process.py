"""Run an engine rank as a process: ``python -m ctlwire.app.engine_process``.

Used by ``ctlwire demo``, the benchmarks and the multi-process tests::

    python -m ctlwire.app.engine_process --rank 0 --connect ipc:///tmp/x/control.sock \\
        --methods ctlwire.app.engine_process:diagnostic_methods --mode poll

``--connect ADDR`` dials the client's ROUTER (default orientation);
``--bind ADDR`` binds a ROUTER the client dials (reverse orientation);
``--pull ADDR --push ADDR`` uses a PUSH/PULL pair. ``--methods MODULE:FUNC``
names a function ``FUNC(endpoint)`` that registers the engine's methods and
may return a step function (``() -> bool``, True when it did work) that the
poll loop calls between polls, like a scheduler's generation step.
``--mode poll`` runs a synchronous loop (``EngineEndpoint.run_blocking``),
``--mode serve`` an anyio event loop (``--backend asyncio|trio``), ``--mode loop``
the same synchronous loop with its socket on an I/O thread
(:class:`~ctlwire.kernel.engine.busy_loop.BusyLoop`: read-only methods answered while
it steps). CURVE:
``--curve-secret FILE`` (this engine's key pair) with ``--curve-server-key FILE``
(connecting) or ``--curve-allow FILE...`` (binding); tcp without CURVE needs
``--allow-insecure-tcp``, an abstract ipc name (``ipc://@name``) ``--allow-abstract-ipc``.
The process prints
``READY <rank> <incarnation>`` on stdout once its socket is open, and exits
cleanly on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ctlwire.app.arguments import ArgumentParser, UsageError
from ctlwire.kernel.engine.busy_loop import BusyLoop
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.transports.codec import codec_by_name
from ctlwire.transports.curve import (
    CurveClientConfig,
    CurveServerConfig,
    load_keypair,
    load_public_key,
)
from ctlwire.transports.errors import CtlwireError, PickleRefused
from ctlwire.transports.ipc_path import IpcPathUnsafe, check_ipc_connect
from ctlwire.transports.transport import EngineTransport
from ctlwire.transports.zmq_config import InsecureAbstractIpc, InsecureTcp, ZmqOptions
from ctlwire.transports.zmq_engine import (
    ZmqDealerEngineTransport,
    ZmqPushPullEngineTransport,
    ZmqRouterEngineTransport,
)

__all__ = ["build_transport", "diagnostic_methods", "main", "stepping_methods"]


def diagnostic_methods(ep: EngineEndpoint) -> None:
    """Methods for tests and benchmarks: echo, sleep (blocking), nap (async), hang,
    pid, metrics, crash, fail."""

    @ep.method()
    def echo(value: Any = None) -> Any:
        return value

    @ep.method()
    def sleep(seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    @ep.method()
    async def nap(seconds: float) -> float:
        import anyio

        await anyio.sleep(seconds)
        return seconds

    @ep.method()
    async def hang() -> None:
        import anyio

        await anyio.sleep_forever()

    @ep.method()
    def pid() -> int:
        return os.getpid()

    @ep.method()
    def metrics() -> dict[str, Any]:
        return ep.metrics()

    @ep.method()
    def crash(code: int = 3) -> None:
        os._exit(code)

    @ep.method()
    def fail(message: str = "requested failure") -> None:
        raise RuntimeError(message)

    marks: list[str] = []
    applied: dict[str, int] = {}

    @ep.method()
    def mark(token: str) -> int:
        """Record that this request ran (tests of what did and did not run)."""
        marks.append(token)
        return len(marks)

    @ep.method(name="marks")
    def get_marks() -> list[str]:
        return list(marks)

    @ep.method()
    def slow_update(seconds: float) -> int:
        """A blocking, weight-load-like handler that reports its progress."""
        from ctlwire.kernel.engine.endpoint import report_progress

        steps = 20
        for i in range(steps):
            time.sleep(seconds / steps)
            report_progress((i + 1) / steps, f"shard {i + 1}/{steps}")
        applied["slow_update"] = applied.get("slow_update", 0) + 1
        return applied["slow_update"]

    @ep.method()
    async def nap_progress(seconds: float) -> float:
        """An async handler that reports its progress (serve mode)."""
        import anyio

        from ctlwire.kernel.engine.endpoint import report_progress

        steps = 10
        for i in range(steps):
            await anyio.sleep(seconds / steps)
            report_progress((i + 1) / steps, f"step {i + 1}/{steps}")
        return seconds

    @ep.method()
    def applied_counts() -> dict[str, int]:
        """How many times each counting handler actually ran."""
        return dict(applied)


def stepping_methods(ep: EngineEndpoint) -> Callable[[], bool]:
    """:func:`diagnostic_methods` plus a scheduler-like step that blocks the
    engine's thread for the seconds given to ``block_next_step`` (once)."""
    diagnostic_methods(ep)
    pending: list[float] = []

    @ep.method()
    def block_next_step(seconds: float) -> None:
        pending.append(seconds)

    def step() -> bool:
        if pending:
            time.sleep(pending.pop())
            return True
        return False

    return step


def load_methods(spec: str) -> Callable[[EngineEndpoint], Callable[[], bool] | None]:
    """The function ``MODULE:FUNC`` names (``FUNC`` defaults to ``register``);
    UsageError, in one line, when it cannot be imported or is not callable."""
    module, _, func = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), func or "register")
    except ImportError as exc:
        raise UsageError(f"--methods {spec}: cannot import {module!r}: {exc}") from None
    except AttributeError:
        raise UsageError(f"--methods {spec}: {module!r} has no {func or 'register'!r} "
                         "(expected MODULE:FUNC)") from None
    if not callable(fn):
        raise UsageError(f"--methods {spec}: {func!r} is not a function")
    return fn  # type: ignore[no-any-return]


def _key_file(flag: str, path: str | None) -> str:
    """``path``, a certificate file that exists; UsageError saying what is missing."""
    if not path:
        raise UsageError(f"{flag} is required with --curve-secret")
    if not os.path.exists(path):
        raise UsageError(f"{flag} {path}: no such key file (make one with "
                         "'ctlwire keys generate DIR NAME')")
    if not os.path.isfile(path):
        raise UsageError(f"{flag} {path}: not a file")
    return path


def _keys(flag: str, path: str | None, load: Callable[[str], Any]) -> Any:
    path = _key_file(flag, path)
    try:
        return load(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{flag} {path}: not a CURVE key file ({exc})") from None


def build_transport(args: argparse.Namespace) -> EngineTransport:
    """The transport the flags describe; UsageError (one line) for flags that do not
    make one."""
    try:
        codec = codec_by_name(args.codec, allow_pickle=args.allow_pickle)
    except PickleRefused:
        raise UsageError("--codec pickle needs --allow-pickle (unpickling runs code the "
                         "peer chose)") from None
    except ValueError as exc:
        raise UsageError(f"--codec {args.codec}: {exc}") from None
    options = ZmqOptions()
    try:
        if args.connect:
            check_ipc_connect(args.connect)  # at once: a refusal at open is a traceback
            curve_client = None
            if args.curve_secret:
                curve_client = CurveClientConfig(
                    _keys("--curve-secret", args.curve_secret, load_keypair),
                    _keys("--curve-server-key", args.curve_server_key, load_public_key))
            return ZmqDealerEngineTransport(args.connect, args.rank, codec=codec,
                                            options=options, curve=curve_client,
                                            allow_insecure_tcp=args.allow_insecure_tcp,
                                            allow_abstract_ipc=args.allow_abstract_ipc)
        if args.bind:
            curve_server = None
            if args.curve_secret:
                if not args.curve_allow:
                    raise UsageError("--curve-secret with --bind needs --curve-allow FILE...: "
                                     "the public keys of the clients allowed in")
                curve_server = CurveServerConfig.allowing(
                    _keys("--curve-secret", args.curve_secret, load_keypair),
                    [_keys("--curve-allow", f, load_public_key) for f in args.curve_allow])
            return ZmqRouterEngineTransport(args.bind, args.rank, codec=codec, options=options,
                                            curve=curve_server,
                                            allow_insecure_tcp=args.allow_insecure_tcp,
                                            allow_abstract_ipc=args.allow_abstract_ipc)
        if args.pull and args.push:
            return ZmqPushPullEngineTransport(args.pull, args.push, args.rank, codec=codec,
                                              options=options,
                                              allow_insecure_tcp=args.allow_insecure_tcp,
                                              allow_abstract_ipc=args.allow_abstract_ipc)
    except InsecureTcp as exc:
        address = args.connect or args.bind or args.pull
        raise UsageError(f"{address}: tcp without CURVE is refused (any process that reaches "
                         "the port could speak for a rank): add --curve-secret and "
                         "--curve-server-key (--curve-allow when binding), use ipc://, or "
                         "pass --allow-insecure-tcp") from exc
    except InsecureAbstractIpc as exc:
        address = args.connect or args.bind or args.pull or args.push
        raise UsageError(f"{address}: an abstract ipc name has no file permissions (any "
                         "local process could connect and speak for a rank): use an ipc "
                         "path, or pass --allow-abstract-ipc") from exc
    except (CtlwireError, ValueError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    raise UsageError("one of --connect ADDR, --bind ADDR or --pull ADDR --push ADDR is "
                     "required")


_PROG = "python -m ctlwire.app.engine_process"


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(prog=_PROG, description="Run one engine rank as a process: it "
                       "prints 'READY RANK INCARNATION' once its socket is open and stops "
                       "cleanly on SIGTERM or SIGINT.")
    p.add_argument("--rank", type=int, required=True, help="this engine's rank (required)")
    where = p.add_argument_group("where the client is (one of)")
    where.add_argument("--connect", metavar="ADDR",
                       help="dial the client's ROUTER at ADDR (ipc://PATH or tcp://HOST:PORT)")
    where.add_argument("--bind", metavar="ADDR", help="bind a ROUTER at ADDR that the client "
                       "dials (the reverse orientation)")
    where.add_argument("--pull", metavar="ADDR", help="with --push: receive requests on a "
                       "PULL socket at ADDR")
    where.add_argument("--push", metavar="ADDR", help="with --pull: send replies on a PUSH "
                       "socket at ADDR")
    p.add_argument("--methods", default="ctlwire.app.engine_process:diagnostic_methods",
                   metavar="MODULE:FUNC",
                   help="FUNC(endpoint) registers the engine's methods and may return a "
                        "step function called between polls (default: the diagnostic "
                        "methods: echo, sleep, fail, ...)")
    p.add_argument("--mode", choices=["poll", "serve", "loop"], default="poll",
                   help="poll (default): a synchronous loop; serve: an anyio event loop; "
                        "loop: the synchronous loop with its socket on an I/O thread")
    p.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio",
                   help="the event loop of --mode serve and loop (default asyncio)")
    p.add_argument("--codec", default="msgpack",
                   help="msgpack (default), json, or pickle (needs --allow-pickle)")
    p.add_argument("--allow-pickle", action="store_true",
                   help="allow --codec pickle: unpickling runs code the peer chose")
    p.add_argument("--allow-insecure-tcp", action="store_true",
                   help="allow tcp without CURVE: any process that reaches the port could "
                        "speak for a rank")
    p.add_argument("--allow-abstract-ipc", action="store_true",
                   help="accept an abstract ipc name (ipc://@name): any local process can "
                        "connect to it")
    p.add_argument("--heartbeat", type=float, default=0.25, metavar="SECONDS",
                   help="heartbeat interval (default 0.25)")
    p.add_argument("--max-queued", type=int, default=None, metavar="N",
                   help="serve mode: requests that may wait to start, per method and per "
                        "connection (the endpoint's mailbox_size and max_queued_per_route; "
                        "beyond, Busy)")
    p.add_argument("--exit-with-parent", type=int, metavar="PID",
                   help="stop (as on SIGTERM) once process PID is no longer this one's "
                        "parent: the launcher died without stopping its engines")
    curve = p.add_argument_group("CURVE (tcp across hosts)")
    curve.add_argument("--curve-secret", metavar="FILE",
                       help="this engine's key pair (NAME.key_secret, from 'ctlwire keys "
                            "generate')")
    curve.add_argument("--curve-server-key", metavar="FILE",
                       help="with --connect: the client's public key (NAME.key)")
    curve.add_argument("--curve-allow", nargs="*", default=[], metavar="FILE",
                       help="with --bind: the public keys (NAME.key) of the clients allowed in")
    etcd = p.add_argument_group("membership in etcd")
    etcd.add_argument("--etcd", metavar="URL[,URL...]",
                      help="register this rank in etcd (the JSON gateway of a cluster's "
                           "client endpoints) under a lease kept alive at TTL/3, "
                           "registering again (same incarnation) when the lease is lost; "
                           "deregister on a clean stop")
    etcd.add_argument("--etcd-prefix", default="/ctlwire/engines/", metavar="PREFIX",
                      help="the key prefix of the registrations (default /ctlwire/engines/)")
    etcd.add_argument("--etcd-ttl", type=float, default=10.0, metavar="SECONDS",
                      help="the lease's time to live (default 10)")
    etcd.add_argument("--etcd-address", default=None, metavar="ADDR",
                      help="the address clients reach this rank at (default: --bind, else "
                           "none)")
    return p


def _register_in_etcd(args: argparse.Namespace, stop: threading.Event,
                      incarnation: int) -> threading.Thread:
    """Keep this rank registered in etcd from a thread of its own (its own event
    loop) until ``stop``; then withdraw the registration (bounded). Each etcd call
    is bounded by a third of the TTL (at most 5 s), so a frozen member cannot hold
    a keep-alive past the lease."""
    import anyio

    from ctlwire.kernel.membership.etcd_gateway import EtcdError, EtcdGateway
    from ctlwire.kernel.membership.etcd_registration import EtcdRegistration

    address = args.etcd_address if args.etcd_address is not None else (args.bind or "")
    gateway = EtcdGateway(args.etcd, timeout=max(0.3, min(5.0, args.etcd_ttl / 3)))
    registration = EtcdRegistration(gateway, args.etcd_prefix, args.rank, address,
                                    ttl=args.etcd_ttl, incarnation=incarnation)

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(registration.run)
            while not stop.is_set():
                await anyio.sleep(0.05)
            tg.cancel_scope.cancel()
        with anyio.move_on_after(2.0), contextlib.suppress(EtcdError):
            await registration.withdraw()

    thread = threading.Thread(target=anyio.run, args=(run,), kwargs={"backend": args.backend},
                              name="ctlwire.engine.etcd", daemon=True)
    thread.start()
    return thread


def _watch_parent(pid: int, stop: threading.Event, interval: float = 0.25) -> None:
    """Set ``stop`` once ``pid`` is no longer this process's parent (it died and
    this process was re-parented), checked every ``interval`` s from a daemon thread."""
    def watch() -> None:
        while not stop.wait(interval):
            if os.getppid() != pid:
                stop.set()

    threading.Thread(target=watch, name="ctlwire.engine.parent-watch", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the engine; returns the exit code. A problem with the flags (a key file
    missing, tcp without CURVE, a --methods that does not load) is one line on
    stderr and exit code 2, before the engine starts."""
    args = parser().parse_args(argv)
    try:
        transport = build_transport(args)
        methods = load_methods(args.methods)
    except UsageError as exc:
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    queued = {} if args.max_queued is None else {"mailbox_size": args.max_queued,
                                                  "max_queued_per_route": args.max_queued}
    endpoint = EngineEndpoint(transport, rank=args.rank, heartbeat_interval=args.heartbeat,
                              **queued)
    loop = BusyLoop(endpoint, backend=args.backend) if args.mode == "loop" else None
    step = methods(endpoint)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.exit_with_parent is not None:
        _watch_parent(args.exit_with_parent, stop)
    registered = _register_in_etcd(args, stop, endpoint.incarnation) if args.etcd else None

    def deregister() -> None:
        """Leave etcd before the endpoint closes: the client removes this rank as a
        deregistration, not as a death."""
        if registered is not None:
            stop.set()
            registered.join(timeout=3.0)

    try:
        if loop is not None:
            loop.start()
            print(f"READY {args.rank} {endpoint.incarnation}", flush=True)
            loop.run_blocking(stop, step=step, idle_wait=0.01 if step is not None else 0.05)
            return 0
        return _run(args, endpoint, transport, step, stop, deregister)
    except IpcPathUnsafe as exc:  # a bind address refused when the socket opens
        print(f"{_PROG}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        deregister()


def _run(args: argparse.Namespace, endpoint: EngineEndpoint, transport: EngineTransport,
         step: Callable[[], bool] | None, stop: threading.Event,
         deregister: Callable[[], None]) -> int:
    if args.mode == "poll":
        endpoint.open()
        print(f"READY {args.rank} {endpoint.incarnation}", flush=True)
        try:
            while not stop.is_set():
                if step is None:  # the wait is the receive: one request a round
                    endpoint.poll(1, 0.05)
                    continue
                worked = step()
                endpoint.poll()
                if not worked:
                    # zmq_poll is level-triggered: it returns at once if more input
                    # is already queued, so no second (empty) poll() is needed
                    transport.wait_readable(endpoint.idle_wait(0.01))
        finally:
            deregister()
            endpoint.close()
        return 0

    import anyio

    async def serve() -> None:
        async with anyio.create_task_group() as tg:
            await tg.start(endpoint.serve)
            print(f"READY {args.rank} {endpoint.incarnation}", flush=True)
            while not stop.is_set():
                await anyio.sleep(0.05)
            await anyio.to_thread.run_sync(deregister)
            tg.cancel_scope.cancel()

    anyio.run(serve, backend=args.backend)
    return 0


if __name__ == "__main__":
    sys.exit(main())
