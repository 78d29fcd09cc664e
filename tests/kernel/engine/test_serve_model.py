"""Where a handler runs under ``serve()``, over real sockets: a plain sync handler runs
on the receive loop, so while it runs the engine receives nothing (no read-only
built-in answered, no other method started, a keyed repeat read only afterwards and
answered with the recorded outcome); async and ``threaded`` handlers wait in their
method's lane, lanes of different methods run at the same moment, and the engine keeps
receiving (a keyed repeat is refused ``InProgress`` at once).

Order and overlap are asserted with events, never with durations. The engine serves
on an event loop of its own (a thread), on each anyio backend; the client is the
conformance harness's raw ROUTER.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio
import anyio.to_thread
import pytest

from ctlwire.conformance.report import CODEC
from ctlwire.conformance.wire import HarnessClient
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

pytestmark = [pytest.mark.timeout(60)]

BACKENDS = ("asyncio", "trio")
WAIT = 5.0  # seconds: the longest any event is waited for (a failure, not a pause)


@contextmanager
def serving(backend: str, setup: Callable[[EngineEndpoint], None]) -> Iterator[HarnessClient]:
    """An engine (rank 0, its methods from ``setup``) serving on its own event loop in a
    thread, connected to a harness client that has heard its first heartbeat."""
    folder = tempfile.mkdtemp(prefix="ctlwire-serve-")
    address = f"ipc://{folder}/engine"
    client = HarnessClient(address, 0, timeout=WAIT)
    endpoint = EngineEndpoint(ZmqDealerEngineTransport(address, 0))
    setup(endpoint)
    stop = threading.Event()

    async def run() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(endpoint.serve)
            await anyio.to_thread.run_sync(stop.wait)
            tg.cancel_scope.cancel()

    thread = threading.Thread(target=anyio.run, args=(run,), kwargs={"backend": backend},
                              daemon=True)
    thread.start()
    try:
        assert client.heard_after(0.0, WAIT), "the engine was never heard from"
        yield client
    finally:
        stop.set()
        thread.join(10)
        client.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sync_handler_holds_the_receive_loop(backend: str) -> None:
    """While a plain sync handler runs, a read-only built-in is not answered and a sync
    handler of another method does not start; both are handled, in arrival order,
    once it returned."""
    started, release = threading.Event(), threading.Event()
    log: list[str] = []

    def setup(endpoint: EngineEndpoint) -> None:
        @endpoint.method()
        def first() -> None:
            started.set()
            release.wait(WAIT)
            log.append("first returned")

        @endpoint.method()
        def second() -> None:
            log.append("second started")

    with serving(backend, setup) as client:
        one = client.send_request("first")
        assert started.wait(WAIT)
        metrics = client.send_request("ctlwire.metrics")
        two = client.send_request("second")
        client.idle(0.3)  # time enough to answer, were the loop receiving
        assert not client.answers.get(metrics) and log == []
        release.set()
        replies = [client.reply(rid) for rid in (one, metrics, two)]
        assert all(r is not None and r.ok for r in replies), replies
        assert log == ["first returned", "second started"]
        assert client.before(one, metrics) and client.before(metrics, two)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["threaded", "async"])
def test_lane_handlers_of_two_methods_run_at_the_same_moment(backend: str, kind: str) -> None:
    """Two ``threaded`` (or two async) handlers of two methods: each waits until the
    other has started, which only works if both run at the same moment; the engine
    answers a read-only built-in meanwhile."""
    both = threading.Barrier(3, timeout=WAIT)  # the two handlers and the test
    met: list[str] = []

    def setup(endpoint: EngineEndpoint) -> None:
        if kind == "threaded":
            for name in ("first", "second"):
                endpoint.register(name, lambda name=name: (both.wait(), met.append(name)),
                                  threaded=True)
            return

        for name in ("first", "second"):
            async def handler(name: str = name) -> None:
                await anyio.to_thread.run_sync(both.wait)
                met.append(name)

            endpoint.register(name, handler)

    with serving(backend, setup) as client:
        one, two = client.send_request("first"), client.send_request("second")
        metrics = client.call("ctlwire.metrics")  # answered while both wait
        assert metrics is not None and metrics.ok
        both.wait()  # returns only once both handlers are inside it
        replies = [client.reply(rid) for rid in (one, two)]
        assert all(r is not None and r.ok for r in replies), replies
        assert sorted(met) == ["first", "second"]
        assert client.before(metrics.id, one) and client.before(metrics.id, two)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("threaded", [False, True])
def test_a_keyed_repeat_is_refused_at_once_only_by_a_lane(backend: str, threaded: bool
                                                          ) -> None:
    """A keyed repeat sent while its first run runs: a lane (``threaded``) refuses it
    ``InProgress`` before the first run's reply; a plain sync handler holds the loop,
    so the repeat is read after the first run and answered with its outcome."""
    started, release = threading.Event(), threading.Event()
    runs: list[int] = []

    def setup(endpoint: EngineEndpoint) -> None:
        def load() -> int:
            started.set()
            release.wait(WAIT)
            runs.append(len(runs) + 1)
            return len(runs)

        endpoint.register("load", load, threaded=threaded)

    with serving(backend, setup) as client:
        first = client.send_request("load", key="k")
        assert started.wait(WAIT)
        repeat = client.send_request("load", key="k")
        if threaded:
            refused = client.reply(repeat)
            assert refused is not None and refused.error is not None
            assert (refused.error.type, refused.error.code) == ("InProgress", 425)
            assert not client.answers.get(first)  # at once: the first still runs
            release.set()
        else:
            client.idle(0.3)
            assert not client.answers.get(repeat)  # not read while the first runs
            release.set()
            replayed = client.reply(repeat)
            assert replayed is not None and replayed.ok
            assert CODEC.decode_value(replayed.result) == 1
            assert client.before(first, repeat)
        done = client.reply(first)
        assert done is not None and done.ok and runs == [1]
