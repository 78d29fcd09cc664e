"""Who a request comes from, over real sockets: on an engine with routes (a ROUTER
engine) operation ownership and idempotency keys follow the connection, never the
``client`` field a request carries; on an engine without routes (a DEALER engine,
serving the one client it dials) the ``client`` field names that client, for both.
"""

from __future__ import annotations

import itertools
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import zmq

from ctlwire.kernel.core.fencing import new_fence
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.engine.ledger_messages import StepRequest
from ctlwire.kernel.engine.operation_ledger import OperationLedger
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Reply, Request
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport, ZmqRouterEngineTransport

pytestmark = [pytest.mark.timeout(60)]

CODEC = MsgpackCodec()
CLIENT_A, CLIENT_B = (1 << 30) | 5, (1 << 30) | 6
_ids = itertools.count(1)


def _engine(transport: Any) -> EngineEndpoint:
    endpoint = EngineEndpoint(transport, heartbeat_interval=None)
    counted = [0]

    @endpoint.method()
    def count() -> int:
        counted[0] += 1
        return counted[0]

    def mark(value: Any = None) -> Any:
        return value

    OperationLedger({"mark": mark}).install(endpoint)
    return endpoint


@contextmanager
def _serving(endpoint: EngineEndpoint) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=endpoint.run_blocking, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


@contextmanager
def _address() -> Iterator[str]:
    folder = tempfile.mkdtemp(prefix="ctlwire-scope-")
    try:
        yield f"ipc://{folder}/engine"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _request(method: str, payload: Any = None, *, client: int, id_client: int | None = None,
             key: str = "", fence: int = 0) -> tuple[int, bytes]:
    """A request frame: its ``client`` field and the client incarnation its id carries
    (``id_client``, default the same) chosen apart."""
    rid = ((client if id_client is None else id_client) << 32) | next(_ids)
    req = Request(rid, 0, method, CODEC.encode_value(payload), client=client, key=key,
                  fence=fence)
    return rid, CODEC.encode(req)


def _step(op: str, step: str, index: int, fence: int) -> StepRequest:
    return StepRequest(op, step, "apply", fence, f"{op}:{step}", "mark",
                       CODEC.encode_value(step), index, [0])


class _Conn:
    """One client connection: ``call(frame)`` sends it and returns its reply."""

    def __init__(self, send: Callable[[bytes], None], recv: Callable[[], bytes]) -> None:
        self._send, self._recv = send, recv

    def call(self, method: str, payload: Any = None, **fields: Any) -> Reply:
        rid, frame = _request(method, payload, **fields)
        self._send(frame)
        while True:
            reply = CODEC.decode(self._recv())
            if isinstance(reply, Reply) and reply.id == rid:
                return reply

    def step(self, req: StepRequest, **fields: Any) -> Reply:
        return self.call("ctlwire.step", req, key=req.key, fence=req.fence, **fields)


def _error(reply: Reply) -> str:
    return reply.error.type if reply.error is not None else "ok"


def _value(reply: Reply) -> Any:
    assert reply.ok, reply.error
    return CODEC.decode_value(reply.result)


@contextmanager
def _router_engine() -> Iterator[tuple[_Conn, _Conn]]:
    """A ROUTER engine and two client connections (DEALERs) to it."""
    with _address() as address:
        endpoint = _engine(ZmqRouterEngineTransport(address, 0))
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        socks = []
        try:
            with _serving(endpoint):
                conns = []
                for _ in range(2):
                    sock = ctx.socket(zmq.DEALER)
                    sock.setsockopt(zmq.LINGER, 0)
                    sock.setsockopt(zmq.RCVTIMEO, 10_000)
                    sock.connect(address)
                    socks.append(sock)
                    conns.append(_Conn(sock.send, sock.recv))
                yield conns[0], conns[1]
        finally:
            for sock in socks:
                sock.close(0)
            ctx.term()


@contextmanager
def _dealer_engine() -> Iterator[_Conn]:
    """A DEALER engine dialing a bound ROUTER: its one client connection."""
    with _address() as address:
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.RCVTIMEO, 10_000)
        router.bind(address)
        endpoint = _engine(ZmqDealerEngineTransport(address, 0))

        def recv() -> bytes:
            while True:
                identity, data = router.recv_multipart()
                if identity == b"rank-0":
                    return data

        def send(frame: bytes) -> None:
            for _ in range(500):  # until the engine's connection is up
                try:
                    router.send_multipart([b"rank-0", frame], zmq.NOBLOCK)
                    return
                except zmq.ZMQError:
                    threading.Event().wait(0.02)
            raise AssertionError("the engine never connected")

        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        try:
            with _serving(endpoint):
                yield _Conn(send, recv)
        finally:
            router.close(0)
            ctx.term()


def test_a_router_engine_binds_an_operation_to_its_connection_not_the_client_field() -> None:
    with _router_engine() as (one, other):
        fence = new_fence()
        assert _value(one.step(_step("op", "s0", 0, fence), client=CLIENT_A)) == "s0"
        # the same connection with another client number: the same owner
        assert _value(one.step(_step("op", "s1", 1, fence), client=CLIENT_B)) == "s1"
        # another connection copying the owner's client number (and ids): not the owner
        owned = other.step(_step("op", "s2", 2, fence), client=CLIENT_A)
        assert _error(owned) == "OperationOwned"


def test_a_router_engine_scopes_keys_by_connection_not_the_client_field() -> None:
    with _router_engine() as (one, other):
        first = _value(one.call("count", key="k", client=CLIENT_A))
        assert _value(one.call("count", key="k", client=CLIENT_B)) == first  # replayed
        assert _value(other.call("count", key="k", client=CLIENT_A)) == first + 1  # ran


def test_a_dealer_engine_names_its_one_client_by_the_client_field() -> None:
    """Without routes the ``client`` field stands for the connection: a step of
    another ``client`` is another owner's, even with the owner's ids; one of the
    owner's ``client`` is the owner's, whatever its id says."""
    with _dealer_engine() as conn:
        fence = new_fence()
        assert _value(conn.step(_step("op", "s0", 0, fence), client=CLIENT_A)) == "s0"
        owned = conn.step(_step("op", "s1", 1, fence), client=CLIENT_B, id_client=CLIENT_A)
        assert _error(owned) == "OperationOwned"
        mine = conn.step(_step("op", "s1", 1, fence), client=CLIENT_A, id_client=CLIENT_B)
        assert _value(mine) == "s1"


def test_a_dealer_engine_scopes_keys_by_the_client_field() -> None:
    with _dealer_engine() as conn:
        first = _value(conn.call("count", key="k", client=CLIENT_A))
        assert _value(conn.call("count", key="k", client=CLIENT_A, id_client=CLIENT_B)) == first
        assert _value(conn.call("count", key="k", client=CLIENT_B, id_client=CLIENT_A)) == (
            first + 1)

