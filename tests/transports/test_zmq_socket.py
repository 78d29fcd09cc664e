"""AsyncZmqSocket over real libzmq sockets, on asyncio and trio (conftest's anyio_backend)."""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import zmq
import zmq.asyncio

from ctlwire.transports.errors import SocketClosed, TransportError
from ctlwire.transports.zmq_socket import AsyncZmqSocket, ForeignThreadError

pytestmark = pytest.mark.timeout(30)

GUARD = 10  # seconds: a hang guard only (turns a hang into a failure), never a measurement


@pytest.fixture
def ctx() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield context
    context.destroy(linger=0)  # safety net; every test closes its own sockets too


@pytest.fixture(params=["inproc", "ipc"])
def endpoint(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "inproc":
        return f"inproc://{request.node.name}"
    path = tmp_path / "s.sock"
    if len(str(path)) > 100:  # sun_path limit
        pytest.skip("tmp path too long for an ipc endpoint")
    return f"ipc://{path}"


class Sockets:
    """Creates sockets and closes them all (linger 0) at the end of a test."""

    def __init__(self, context: zmq.Context[zmq.Socket[bytes]]) -> None:
        self.context = context
        self.raw: list[zmq.Socket[bytes]] = []
        self.wrapped: list[AsyncZmqSocket] = []

    def raw_socket(self, kind: int, **options: int | bytes) -> zmq.Socket[bytes]:
        sock = self.context.socket(kind)
        self.raw.append(sock)
        sock.setsockopt(zmq.LINGER, 0)
        for name, value in options.items():
            sock.setsockopt(getattr(zmq, name), value)
        return sock

    def wrap(self, sock: zmq.Socket[bytes]) -> AsyncZmqSocket:
        wrapped = AsyncZmqSocket(sock)
        self.wrapped.append(wrapped)
        return wrapped

    def close(self) -> None:
        for wrapped in self.wrapped:
            wrapped.close(linger_ms=0)
        for sock in self.raw:
            sock.close(linger=0)


@pytest.fixture
def socks(ctx: zmq.Context[zmq.Socket[bytes]]) -> Iterator[Sockets]:
    sockets = Sockets(ctx)
    yield sockets
    sockets.close()


def router_dealer(
    socks: Sockets,
    endpoint: str,
    router_opts: dict[str, Any] | None = None,
    dealer_opts: dict[str, Any] | None = None,
) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes]]:
    router = socks.raw_socket(zmq.ROUTER, **(router_opts or {}))
    router.bind(endpoint)
    dealer = socks.raw_socket(zmq.DEALER, **(dealer_opts or {}))
    dealer.connect(endpoint)
    return router, dealer


async def replies_while_waiting(router: AsyncZmqSocket, dealer: AsyncZmqSocket, rounds: int,
                                after: Any = None) -> bytes:
    """The dealer says hello; then ``rounds`` times the router replies only once the
    dealer waits for it (every task blocked), and ``after()`` runs after each round.
    Returns the dealer's identity at the router."""
    await dealer.send_multipart([b"hi"])
    ident = (await router.recv_multipart())[0]
    for i in range(rounds):
        async with anyio.create_task_group() as tg:
            async def reply(i: int = i) -> None:
                await anyio.wait_all_tasks_blocked()
                await router.send_multipart([ident, b"%d" % i])
            tg.start_soon(reply)
            assert await dealer.recv_multipart() == [b"%d" % i]
        if after is not None:
            after()
    return ident


def fd_readable(sock: AsyncZmqSocket) -> bool:
    fd = sock.socket.getsockopt(zmq.FD)
    assert isinstance(fd, int)
    return bool(select.select([fd], [], [], 0)[0])


class EventsReads:
    """Counts the EVENTS reads of an :class:`AsyncZmqSocket` (through its ``_get``)."""

    def __init__(self, sock: AsyncZmqSocket) -> None:
        self.count = 0
        get = sock._get

        def counting(option: int) -> int:
            self.count += option == zmq.EVENTS
            return get(option)

        sock._get = counting


def fill_until_again(send: Callable[[list[bytes]], None]) -> int:
    """Send numbered messages until the high-water mark; return how many were queued."""
    for sent in range(100_000):
        try:
            send([b"%d" % sent])
        except zmq.Again:
            return sent
    raise AssertionError("the high-water mark was never reached")


# --------------------------------------------------------------------- round trips


@pytest.mark.anyio
async def test_round_trip(socks: Sockets, endpoint: str) -> None:
    raw_router, raw_dealer = router_dealer(socks, endpoint)
    router, dealer = socks.wrap(raw_router), socks.wrap(raw_dealer)
    with anyio.fail_after(GUARD):
        for i in range(200):
            await dealer.send_multipart([b"req", b"%d" % i, b""])
            ident, *frames = await router.recv_multipart()
            assert frames == [b"req", b"%d" % i, b""]
            await router.send_multipart([ident, b"rep", b"%d" % i])
            assert await dealer.recv_multipart() == [b"rep", b"%d" % i]
    assert dealer.recv_multipart_nowait() is None
    assert router.recv_multipart_nowait() is None


@pytest.mark.anyio
async def test_nowait_round_trip(socks: Sockets) -> None:
    raw_router, raw_dealer = router_dealer(socks, "inproc://nowait")
    router, dealer = socks.wrap(raw_router), socks.wrap(raw_dealer)
    assert router.recv_multipart_nowait() is None
    dealer.send_multipart_nowait([b"a", bytearray(b"b"), memoryview(b"c"), zmq.Frame(b"d")])
    msg = router.recv_multipart_nowait()  # inproc: queued synchronously
    assert msg is not None
    assert msg[1:] == [b"a", b"b", b"c", b"d"]
    assert router.recv_multipart_nowait() is None


# ------------------------------------------------------------- edge-triggered fd


@pytest.mark.anyio
async def test_burst_queued_before_receiver_starts(socks: Sockets, endpoint: str) -> None:
    raw_router, raw_dealer = router_dealer(
        socks, endpoint, router_opts={"RCVHWM": 0}, dealer_opts={"SNDHWM": 0}
    )
    for i in range(10_000):
        raw_dealer.send_multipart([b"%d" % i])  # SNDHWM 0: never blocks
    router = socks.wrap(raw_router)
    with anyio.fail_after(GUARD):
        for i in range(10_000):
            frames = await router.recv_multipart()
            assert frames[1:] == [b"%d" % i]
    assert router.recv_multipart_nowait() is None


@pytest.mark.anyio
async def test_burst_arrives_while_receiver_blocked(socks: Sockets, endpoint: str) -> None:
    raw_router, raw_dealer = router_dealer(
        socks, endpoint, router_opts={"RCVHWM": 0}, dealer_opts={"SNDHWM": 0}
    )
    router, dealer = socks.wrap(raw_router), socks.wrap(raw_dealer)
    received: list[bytes] = []

    async def receive() -> None:
        for _ in range(10_000):
            received.append((await router.recv_multipart())[1])

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(receive)
            await anyio.wait_all_tasks_blocked()
            for i in range(10_000):
                await dealer.send_multipart([b"%d" % i])
    assert received == [b"%d" % i for i in range(10_000)]


@pytest.mark.anyio
@pytest.mark.parametrize("how", ["nowait", "await"])
async def test_send_that_consumes_the_edge_wakes_the_receiver(socks: Sockets, how: str) -> None:
    """A reply arrives while the receiver is parked on the fd; a send on the same socket
    then drains the fd before the loop polls it. The receiver must still get the reply."""
    peer, raw_dealer = router_dealer(socks, "inproc://edge")
    dealer = socks.wrap(raw_dealer)
    dealer.send_multipart_nowait([b"hello"])
    assert peer.poll(GUARD * 1000)
    ident, hello = peer.recv_multipart()
    assert hello == b"hello"
    got: list[list[bytes]] = []

    async def receive() -> None:
        got.append(await dealer.recv_multipart())

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(receive)
            await anyio.wait_all_tasks_blocked()  # the receiver waits on the fd
            peer.send_multipart([ident, b"reply"])  # the dealer's fd fires...
            assert fd_readable(dealer)
            # ... and this send (no checkpoint in between) drains it: libzmq's send processes
            # commands (so drains the fd) at most once a millisecond or so; let that pass.
            time.sleep(0.01)
            if how == "nowait":
                dealer.send_multipart_nowait([b"request"])
            else:
                await dealer.send_multipart([b"request"])
            assert not fd_readable(dealer)
            assert got == []
    assert got == [[b"reply"]]
    assert peer.poll(GUARD * 1000)
    assert peer.recv_multipart() == [ident, b"request"]


@pytest.mark.anyio
async def test_concurrent_senders_and_receiver_on_one_socket(socks: Sockets, endpoint: str) -> None:
    """One receiver task and 8 sender tasks share a DEALER; a ROUTER echoes in the same loop."""
    raw_router, raw_dealer = router_dealer(socks, endpoint)
    router, dealer = socks.wrap(raw_router), socks.wrap(raw_dealer)
    senders, per_sender = 8, 250
    replies: dict[int, list[int]] = {s: [] for s in range(senders)}

    async def echo() -> None:
        for _ in range(senders * per_sender):
            await router.send_multipart(await router.recv_multipart())

    async def receive() -> None:
        for _ in range(senders * per_sender):
            sender, seq = await dealer.recv_multipart()
            replies[int(sender)].append(int(seq))

    async def send(sender: int) -> None:
        for seq in range(per_sender):
            await dealer.send_multipart([b"%d" % sender, b"%d" % seq])
            if seq % 7 == 0:
                await anyio.sleep(0)

    with anyio.fail_after(GUARD * 2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(echo)
            tg.start_soon(receive)
            await anyio.wait_all_tasks_blocked()
            for sender in range(senders):
                tg.start_soon(send, sender)
    assert replies == {s: list(range(per_sender)) for s in range(senders)}


@pytest.mark.anyio
async def test_queued_messages_return_without_suspending_but_stay_fair(socks: Sockets) -> None:
    raw_router, raw_dealer = router_dealer(socks, "inproc://fair")
    router = socks.wrap(raw_router)
    for i in range(200):
        raw_dealer.send_multipart([b"%d" % i])
    other_ran = anyio.Event()

    async def other() -> None:
        other_ran.set()

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(other)  # runnable, but runs only when the test task yields
            for i in range(32):
                assert (await router.recv_multipart())[1] == b"%d" % i
            assert not other_ran.is_set()  # 32 queued messages: no suspension
            for i in range(32, 200):
                assert (await router.recv_multipart())[1] == b"%d" % i
            assert other_ran.is_set()  # a flood still yields to the loop now and then


# -------------------------------------------------------------- high-water mark


@pytest.mark.anyio
async def test_hwm_nowait_raises_again_and_send_waits_for_the_reader(socks: Sockets) -> None:
    raw_router, raw_dealer = router_dealer(
        socks, "inproc://hwm", router_opts={"RCVHWM": 1}, dealer_opts={"SNDHWM": 1}
    )
    router, dealer = socks.wrap(raw_router), socks.wrap(raw_dealer)
    queued = fill_until_again(dealer.send_multipart_nowait)
    assert queued >= 1
    with pytest.raises(zmq.Again):
        dealer.send_multipart_nowait([b"still full"])
    sent = anyio.Event()

    async def send_last() -> None:
        await dealer.send_multipart([b"last"])
        sent.set()

    received: list[bytes] = []
    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(send_last)
            await anyio.wait_all_tasks_blocked()
            assert not sent.is_set()  # blocked: nobody reads
            for _ in range(queued + 1):  # the peer starts reading
                received.append((await router.recv_multipart())[1])
            await sent.wait()
    assert received == [b"%d" % i for i in range(queued)] + [b"last"]


@pytest.mark.anyio
async def test_router_mandatory_full_peer_does_not_block_others(socks: Sockets) -> None:
    """ROUTER_MANDATORY reports POLLOUT while any peer has room: a send to a full peer
    waits (without spinning) while the receiver and sends to other peers carry on."""
    raw_router = socks.raw_socket(zmq.ROUTER, ROUTER_MANDATORY=1, SNDHWM=1)
    raw_router.bind("inproc://mandatory-hwm")
    peers = {}
    for name in (b"a", b"b"):
        peer = socks.raw_socket(zmq.DEALER, ROUTING_ID=name, RCVHWM=1)
        peer.connect("inproc://mandatory-hwm")
        peers[name] = peer
    router = socks.wrap(raw_router)
    peer_a = socks.wrap(peers[b"a"])
    with anyio.fail_after(GUARD):
        for peer in peers.values():
            peer.send_multipart([b"hello"])
            assert (await router.recv_multipart())[1] == b"hello"
        queued = fill_until_again(lambda frames: router.send_multipart_nowait([b"a", *frames]))
        router.send_multipart_nowait([b"b", b"b has room"])
        sent = anyio.Event()
        received = anyio.Event()
        from_b: list[list[bytes]] = []

        async def send_to_a() -> None:
            await router.send_multipart([b"a", b"last"])
            sent.set()

        async def receive() -> None:
            from_b.append(await router.recv_multipart())
            received.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(send_to_a)
            tg.start_soon(receive)
            await anyio.wait_all_tasks_blocked()
            assert not sent.is_set()
            peers[b"b"].send_multipart([b"ping"])  # the receiver is not stranded
            await received.wait()
            assert from_b == [[b"b", b"ping"]]
            assert not sent.is_set()
            got = [(await peer_a.recv_multipart())[0] for _ in range(queued + 1)]
            await sent.wait()
    assert got == [b"%d" % i for i in range(queued)] + [b"last"]
    assert peers[b"b"].poll(GUARD * 1000)
    assert peers[b"b"].recv_multipart() == [b"b has room"]


@pytest.mark.anyio
async def test_router_mandatory_unroutable_raises_ehostunreach(socks: Sockets) -> None:
    raw_router = socks.raw_socket(zmq.ROUTER, ROUTER_MANDATORY=1)
    raw_router.bind("inproc://mandatory")
    router = socks.wrap(raw_router)
    with pytest.raises(zmq.ZMQError) as nowait:
        router.send_multipart_nowait([b"nobody", b"x"])
    assert nowait.value.errno == zmq.EHOSTUNREACH
    with pytest.raises(zmq.ZMQError) as awaited:
        await router.send_multipart([b"nobody", b"x"])
    assert awaited.value.errno == zmq.EHOSTUNREACH


# ------------------------------------------------------------------- threading


def test_foreign_thread_is_refused(socks: Sockets) -> None:
    raw = socks.raw_socket(zmq.DEALER)
    raw.connect("inproc://foreign")
    sock = socks.wrap(raw)
    owner = threading.get_ident()
    errors: dict[str, BaseException | None] = {}
    foreign: list[int] = []

    def expect(name: str, call: Callable[[], object]) -> None:
        try:
            result = call()
        except BaseException as exc:
            errors[name] = exc
        else:
            errors[name] = None
            if hasattr(result, "close"):
                result.close()

    def in_thread() -> None:
        foreign.append(threading.get_ident())
        expect("recv_multipart_nowait", sock.recv_multipart_nowait)
        expect("send_multipart_nowait", lambda: sock.send_multipart_nowait([b"x"]))
        expect("recv_multipart", lambda: sock.recv_multipart().send(None))
        expect("send_multipart", lambda: sock.send_multipart([b"x"]).send(None))
        expect("close", sock.close)

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join(GUARD)
    assert not thread.is_alive()
    assert set(errors) == {
        "recv_multipart_nowait",
        "send_multipart_nowait",
        "recv_multipart",
        "send_multipart",
        "close",
    }
    for name, exc in errors.items():
        assert isinstance(exc, ForeignThreadError), name
        assert isinstance(exc, RuntimeError)
        assert "DEALER" in str(exc)
        assert str(owner) in str(exc) and str(foreign[0]) in str(exc)
    assert not sock.closed  # the foreign close did nothing
    assert sock.recv_multipart_nowait() is None  # still usable by its owner


def test_rejects_an_asyncio_socket() -> None:
    context = zmq.asyncio.Context()
    try:
        sock = context.socket(zmq.DEALER)
        with pytest.raises(TypeError):
            AsyncZmqSocket(sock)  # type: ignore[arg-type]
        sock.close(linger=0)
    finally:
        context.term()


# ----------------------------------------------------------------------- close


def test_close_outside_an_event_loop_is_idempotent(socks: Sockets) -> None:
    sock = socks.wrap(socks.raw_socket(zmq.DEALER))
    sock.close()
    sock.close(linger_ms=100)
    assert sock.closed and sock.socket.closed
    with pytest.raises(SocketClosed):
        sock.recv_multipart_nowait()
    with pytest.raises(SocketClosed):
        sock.send_multipart_nowait([b"x"])
    assert issubclass(SocketClosed, TransportError)


@pytest.mark.anyio
async def test_close_while_blocked_in_recv(socks: Sockets) -> None:
    _, raw_dealer = router_dealer(socks, "inproc://close-recv")
    dealer = socks.wrap(raw_dealer)
    outcome: list[BaseException] = []

    async def receive() -> None:
        try:
            await dealer.recv_multipart()
        except SocketClosed as exc:
            outcome.append(exc)

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(receive)
            await anyio.wait_all_tasks_blocked()
            dealer.close()
            dealer.close()
    assert len(outcome) == 1
    assert dealer.closed and dealer.socket.closed
    with pytest.raises(SocketClosed):
        await dealer.recv_multipart()
    with pytest.raises(SocketClosed):
        await dealer.send_multipart([b"x"])
    with pytest.raises(SocketClosed):
        dealer.recv_multipart_nowait()


@pytest.mark.anyio
@pytest.mark.parametrize("first", ["receiver", "sender"])
async def test_close_wakes_receiver_and_blocked_sender(socks: Sockets, first: str) -> None:
    """Whichever task holds the fd and whichever waits behind it, both get SocketClosed."""
    _, raw_dealer = router_dealer(socks, "inproc://close-both", dealer_opts={"SNDHWM": 1})
    dealer = socks.wrap(raw_dealer)
    fill_until_again(dealer.send_multipart_nowait)
    outcomes: dict[str, BaseException] = {}

    async def receive() -> None:
        try:
            await dealer.recv_multipart()
        except SocketClosed as exc:
            outcomes["receiver"] = exc

    async def send() -> None:
        try:
            await dealer.send_multipart([b"blocked"])
        except SocketClosed as exc:
            outcomes["sender"] = exc

    order = [receive, send] if first == "receiver" else [send, receive]
    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            for task in order:
                tg.start_soon(task)
                await anyio.wait_all_tasks_blocked()
            assert outcomes == {}
            dealer.close()
    assert set(outcomes) == {"receiver", "sender"}


# ------------------------------------------------------- concurrency and cancel


@pytest.mark.anyio
async def test_second_receiver_is_refused(socks: Sockets) -> None:
    _, raw_dealer = router_dealer(socks, "inproc://busy")
    dealer = socks.wrap(raw_dealer)
    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(dealer.recv_multipart)
            await anyio.wait_all_tasks_blocked()
            with pytest.raises(anyio.BusyResourceError):
                await dealer.recv_multipart()
            with pytest.raises(anyio.BusyResourceError):
                dealer.recv_multipart_nowait()
            tg.cancel_scope.cancel()


@pytest.mark.anyio
@pytest.mark.parametrize("cancelled", ["sender", "receiver"])
async def test_cancelled_waiter_hands_the_fd_over(socks: Sockets, cancelled: str) -> None:
    """The first waiter holds the fd, the second waits behind it. Cancelling the fd holder
    must let the other one take the fd over; cancelling the one behind must not disturb it."""
    raw_router, raw_dealer = router_dealer(
        socks, "inproc://handover", router_opts={"RCVHWM": 1}, dealer_opts={"SNDHWM": 1}
    )
    router, dealer = socks.wrap(raw_router), socks.wrap(raw_dealer)
    queued = fill_until_again(dealer.send_multipart_nowait)
    done: list[str] = []

    async def send() -> None:
        await dealer.send_multipart([b"last"])
        done.append("sender")

    async def receive() -> None:
        assert await dealer.recv_multipart() == [b"reply"]
        done.append("receiver")

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            scopes = {}
            for name, task in (("sender", send), ("receiver", receive)):  # sender holds fd
                scope = anyio.CancelScope()
                scopes[name] = scope

                async def run(scope: anyio.CancelScope = scope, task: Any = task) -> None:
                    with scope:
                        await task()

                tg.start_soon(run)
                await anyio.wait_all_tasks_blocked()
            scopes[cancelled].cancel()
            await anyio.wait_all_tasks_blocked()
            ident = b""
            for _ in range(queued):  # drain: frees the dealer's pipe
                ident = (await router.recv_multipart())[0]
            await router.send_multipart([ident, b"reply"])
            if cancelled == "receiver":
                assert (await router.recv_multipart())[1] == b"last"
    survivor = "receiver" if cancelled == "sender" else "sender"
    assert done == [survivor]
    # The cancelled waiter left nothing behind: a new receive works on both backends.
    if cancelled == "receiver":
        await router.send_multipart([ident, b"reply"])
        with anyio.fail_after(GUARD):
            assert await dealer.recv_multipart() == [b"reply"]


# ------------------------------------------------------- the persistent asyncio reader


class _ReaderCounts:
    """Counts the running asyncio loop's add_reader/remove_reader calls on one fd."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fd: int) -> None:
        import asyncio

        loop = asyncio.get_running_loop()
        self.added = self.removed = 0
        add, remove = loop.add_reader, loop.remove_reader

        def add_reader(fileno: Any, callback: Any, *args: Any) -> None:
            if fileno == fd:
                self.added += 1
            add(fileno, callback, *args)

        def remove_reader(fileno: Any) -> bool:
            if fileno == fd:
                self.removed += 1
            return remove(fileno)

        monkeypatch.setattr(loop, "add_reader", add_reader)
        monkeypatch.setattr(loop, "remove_reader", remove_reader)


@pytest.mark.anyio
async def test_asyncio_fd_reader_is_registered_once_per_socket(
        socks: Sockets, anyio_backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On asyncio the fd reader stays registered from the first wait to close: waits
    that suspend cost no add_reader/remove_reader (epoll_ctl) pair each. On trio the
    same round trips just work."""
    raw_router, raw_dealer = router_dealer(socks, "inproc://reader-once")
    router, dealer = socks.wrap(raw_router), socks.wrap(raw_dealer)
    counts = (_ReaderCounts(monkeypatch, raw_dealer.get(zmq.FD))
              if anyio_backend == "asyncio" else None)
    waits = 0

    async def echo() -> None:
        for _ in range(50):
            ident, *frames = await router.recv_multipart()
            await router.send_multipart([ident, *frames])

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(echo)
            for i in range(50):
                await anyio.wait_all_tasks_blocked()  # the echo task waits: we will too
                await dealer.send_multipart([b"%d" % i])
                before = dealer._recv_missed
                assert await dealer.recv_multipart() == [b"%d" % i]
                waits += 1 if not before else 0
    assert waits >= 1
    if counts is not None:
        assert (counts.added, counts.removed) == (1, 0)
        dealer.close()
        assert counts.removed == 1  # close unregisters before libzmq closes the fd
        assert dealer._reader_loop is None


@pytest.mark.anyio
async def test_fd_firing_with_no_waiter_does_not_spin(
        socks: Sockets, endpoint: str, anyio_backend: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader stays registered while no task waits; asyncio's epoll is
    level-triggered, so a fd left readable would call it on every loop iteration.
    The callback drains the fd itself (EVENTS) when nobody waits: messages arriving
    while the receiver is busy elsewhere cost a callback or two, not one per loop
    iteration, and are received afterwards."""
    calls = 0
    original = AsyncZmqSocket._on_readable

    def counting(self: AsyncZmqSocket) -> None:
        nonlocal calls
        calls += 1
        original(self)

    monkeypatch.setattr(AsyncZmqSocket, "_on_readable", counting)
    raw_router, raw_dealer = router_dealer(socks, endpoint)
    router, dealer = socks.wrap(raw_router), socks.wrap(raw_dealer)
    with anyio.fail_after(GUARD):
        await dealer.send_multipart([b"hi"])
        ident = (await router.recv_multipart())[0]
        async with anyio.create_task_group() as tg:
            async def first() -> None:  # a waited-for receive registers the reader
                assert await dealer.recv_multipart() == [b"one"]
            tg.start_soon(first)
            await anyio.wait_all_tasks_blocked()
            await router.send_multipart([ident, b"one"])
        assert dealer.recv_multipart_nowait() is None  # found empty: the next one signals
        before = calls
        for i in range(5):  # nobody waits on the dealer now
            await router.send_multipart([ident, b"%d" % i])
        deadline = time.monotonic() + 0.05
        spins = 0
        while time.monotonic() < deadline or spins < 200:
            await anyio.lowlevel.checkpoint()  # a loop iteration, fd signalled
            spins += 1
        if anyio_backend == "asyncio":
            assert 1 <= calls - before <= 3, calls - before
        assert [await dealer.recv_multipart() for _ in range(5)] == [[b"%d" % i]
                                                                     for i in range(5)]


@pytest.mark.anyio
async def test_trio_waits_use_trio_primitives_resolved_once(
        socks: Sockets, anyio_backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On trio, the fd waiter waits with trio's own ``wait_readable`` inside trio's
    own cancel scope, resolved once per socket: anyio's per-call functions (which look
    the backend up on every call) are never used. Waking the fd waiter (a send while
    it waits, interrupt) and closing it still work."""
    if anyio_backend != "trio":
        pytest.skip("trio only (asyncio's fd waiter is the reader callback's future)")
    import trio
    import trio.testing

    def refused(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("anyio's per-call fd wait used on trio")

    monkeypatch.setattr(anyio, "wait_readable", refused)
    monkeypatch.setattr(anyio, "CancelScope", refused)
    monkeypatch.setattr(anyio, "current_time", refused)
    resolved = 0
    import ctlwire.transports.zmq_socket as zs

    original = zs._native_backend

    def counting() -> Any:
        nonlocal resolved
        resolved += 1
        return original()

    monkeypatch.setattr(zs, "_native_backend", counting)
    raw_router, raw_dealer = router_dealer(socks, "inproc://trio-native")
    router, dealer = socks.wrap(raw_router), socks.wrap(raw_dealer)
    with trio.fail_after(GUARD):
        await replies_while_waiting(router, dealer, 20)
        assert isinstance(dealer._native, zs._Native)
        assert dealer._native.wait_readable is trio.lowlevel.wait_readable
        assert resolved == 1  # once for the dealer (the router never had to wait)
        # close wakes a waiter parked in trio's wait_readable: SocketClosed, typed
        async with trio.open_nursery() as nursery:
            async def closer() -> None:
                await trio.testing.wait_all_tasks_blocked()
                assert dealer._fd_scope is not None
                dealer.close()
            nursery.start_soon(closer)
            with pytest.raises(SocketClosed):
                await dealer.recv_multipart()


@pytest.mark.anyio
async def test_trio_untimed_fd_waits_take_no_cancel_scope_and_still_wake(
        socks: Sockets, anyio_backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On trio a receive's fd wait (untimed) enters no cancel scope (one costs ~7 µs
    there): the tasks that must wake the waiter (a send that may have swallowed its
    edge, interrupt_receive, close) use notify_closing(fd) instead, and the waiter
    then re-checks EVENTS. Every message still arrives; a timed wait (a sender's
    back-off) keeps its scope."""
    if anyio_backend != "trio":
        pytest.skip("trio only (asyncio's fd waiter is the reader callback's future)")
    import trio
    import trio.testing

    import ctlwire.transports.zmq_socket as zs
    from ctlwire.transports.zmq_socket import ReceiveInterrupted

    scopes = notified = 0
    original = zs._native_backend

    def counting_backend() -> Any:
        native = original()

        def scope(**kwargs: Any) -> Any:
            nonlocal scopes
            scopes += 1
            return native.cancel_scope(**kwargs)

        def notify(fd: int) -> None:
            nonlocal notified
            notified += 1
            native.notify_closing(fd)

        return native._replace(cancel_scope=scope, notify_closing=notify)

    monkeypatch.setattr(zs, "_native_backend", counting_backend)
    raw_router, raw_dealer = router_dealer(socks, "inproc://trio-no-scope")
    router, dealer = socks.wrap(raw_router), socks.wrap(raw_dealer)
    with trio.fail_after(GUARD):
        ident = await replies_while_waiting(router, dealer, 20)
        assert scopes == 0
        # a wake while the receive waits on the fd: it re-checks and goes on waiting
        async with trio.open_nursery() as nursery:
            async def wake_then_reply() -> None:
                await trio.testing.wait_all_tasks_blocked()
                assert dealer._fd_scope is zs._NOTIFY_WAKES
                dealer._wake()
                await trio.testing.wait_all_tasks_blocked()
                await router.send_multipart([ident, b"after-wake"])
            nursery.start_soon(wake_then_reply)
            assert await dealer.recv_multipart() == [b"after-wake"]
        assert notified == 1
        # interrupt_receive ends the receive, typed, having taken nothing
        async with trio.open_nursery() as nursery:
            async def interrupt() -> None:
                await trio.testing.wait_all_tasks_blocked()
                dealer.interrupt_receive()
            nursery.start_soon(interrupt)
            with pytest.raises(ReceiveInterrupted):
                await dealer.recv_multipart()
        await router.send_multipart([ident, b"kept"])
        assert await dealer.recv_multipart() == [b"kept"]
        assert scopes == 0
        # close wakes the waiter: SocketClosed, typed
        async with trio.open_nursery() as nursery:
            async def closer() -> None:
                await trio.testing.wait_all_tasks_blocked()
                dealer.close()
            nursery.start_soon(closer)
            with pytest.raises(SocketClosed):
                await dealer.recv_multipart()


@pytest.mark.anyio
async def test_empty_guess_is_trusted_after_right_guesses_and_dropped_when_wrong(
        socks: Sockets) -> None:
    """``likely_empty`` turns on once the "empty" guess (after a waited-for message)
    was right twice in a row, so a receiver may skip its non-blocking attempt; a queue
    found non-empty while it was guessed empty turns it off at once. Every message is
    received either way."""
    raw_router, raw_dealer = router_dealer(socks, "inproc://empty-guess")
    router, dealer = socks.wrap(raw_router), socks.wrap(raw_dealer)
    with anyio.fail_after(GUARD):
        trusted: list[bool] = []
        # each reply comes while the dealer waits for it
        ident = await replies_while_waiting(router, dealer, 4,
                                            lambda: trusted.append(dealer.likely_empty))
        assert trusted == [False, False, True, True]
        # a wrong guess: two replies already queued while the guess says empty
        await router.send_multipart([ident, b"a"])
        await router.send_multipart([ident, b"b"])
        for _ in range(100):
            if fd_readable(dealer) or dealer.socket.get(zmq.EVENTS) & zmq.POLLIN:
                break
            await anyio.sleep(0.001)
        assert await dealer.recv_multipart() == [b"a"]
        assert not dealer.likely_empty
        assert dealer.recv_multipart_nowait() == [b"b"]
        assert dealer.recv_multipart_nowait() is None


@pytest.mark.anyio
async def test_router_client_skips_the_probe_of_a_queue_likely_empty(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sequential round trips through ZmqRouterClientTransport: once the socket's
    "empty" guess is trusted, ``receive`` no longer makes a non-blocking attempt
    before it waits (one EVENTS read less per reply), and still gets every reply."""
    from ctlwire.transports.envelope import Reply
    from ctlwire.transports.transport import Received
    from ctlwire.transports.zmq_client import ZmqRouterClientTransport
    from ctlwire.transports.zmq_config import rank_identity

    probes = 0
    original = AsyncZmqSocket.recv_multipart_nowait

    def counting(self: AsyncZmqSocket) -> list[bytes] | None:
        nonlocal probes
        probes += 1
        return original(self)

    monkeypatch.setattr(AsyncZmqSocket, "recv_multipart_nowait", counting)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    engine = ctx.socket(zmq.DEALER)
    engine.setsockopt(zmq.LINGER, 0)
    engine.setsockopt(zmq.IDENTITY, rank_identity(0))
    try:
        async with ZmqRouterClientTransport(f"ipc://{tmp_path}/c.sock") as client:
            engine.connect(client.address)
            codec = client.codec
            n = 12
            with anyio.fail_after(GUARD):
                async with anyio.create_task_group() as tg:
                    async def engine_side() -> None:
                        for i in range(n):
                            await anyio.wait_all_tasks_blocked()
                            engine.send(codec.encode(Reply(i, 0, 1, True, b"\xc0")))
                            await anyio.sleep(0.002)
                    tg.start_soon(engine_side)
                    got = []
                    for _ in range(n):
                        event = await client.receive()
                        assert type(event) is Received
                        got.append(event.envelope.id)  # type: ignore[union-attr]
            assert got == list(range(n))
            # every reply was waited for: after the guess is trusted (3 replies), the
            # receives go straight to waiting
            assert probes <= 4, probes
    finally:
        engine.close(0)
        ctx.term()


@pytest.mark.anyio
async def test_router_client_lets_the_task_a_reply_woke_run_before_it_waits_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After handing out an event, ``receive`` (finding nothing queued) yields before it
    waits for the socket again, so the task the event woke runs first: a caller's next
    request then overlaps the receiver's wait set-up instead of following it. On trio,
    whose scheduler runs each batch of ready tasks in a random order, one yield is not
    enough (the receiver would run first half of the time): it yields twice there."""
    from ctlwire.transports.envelope import Reply
    from ctlwire.transports.transport import Received
    from ctlwire.transports.zmq_client import ZmqRouterClientTransport
    from ctlwire.transports.zmq_config import rank_identity

    waits = 0
    original = AsyncZmqSocket.recv_multipart

    async def counting(self: AsyncZmqSocket, divert: Any = None) -> list[bytes]:
        nonlocal waits
        waits += 1
        return await original(self, divert)

    monkeypatch.setattr(AsyncZmqSocket, "recv_multipart", counting)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    engine = ctx.socket(zmq.DEALER)
    engine.setsockopt(zmq.LINGER, 0)
    engine.setsockopt(zmq.IDENTITY, rank_identity(0))
    rounds = 40
    overtaken = []  # rounds in which the receiver was back in its wait before the caller ran
    try:
        async with ZmqRouterClientTransport(f"ipc://{tmp_path}/c.sock") as client:
            engine.connect(client.address)
            codec = client.codec
            woken = [anyio.Event() for _ in range(rounds)]
            at_delivery = [0] * rounds
            with anyio.fail_after(GUARD):
                async with anyio.create_task_group() as tg:
                    async def receiver() -> None:
                        for i in range(rounds):
                            event = await client.receive()
                            assert type(event) is Received
                            assert event.envelope.id == i  # type: ignore[union-attr]
                            at_delivery[i] = waits
                            woken[i].set()
                        # the caller of the last round must be able to run too
                        await anyio.sleep(0.05)

                    tg.start_soon(receiver)
                    for i in range(rounds):
                        engine.send(codec.encode(Reply(i, 0, 1, True, b"\xc0")))
                        await woken[i].wait()
                        # (round 0 is a warm-up: the transport's start-up tasks, its
                        # connection monitor, still share the scheduler's first batches)
                        if i and waits != at_delivery[i]:
                            overtaken.append(i)
                        await anyio.sleep(0.002)  # the receiver is in its wait again
            assert overtaken == []
    finally:
        engine.close(0)
        ctx.term()


# ------------------------------------------------------------------ divert (asyncio)


@pytest.mark.anyio
async def test_divert_consumes_in_order_and_the_declined_message_ends_the_receive(
        socks: Sockets, endpoint: str, anyio_backend: str) -> None:
    """Messages that arrive while a ``recv_multipart(divert)`` is suspended go to
    ``divert`` in order, without waking the receive (asyncio); the first one it
    declines is what the receive returns; nothing is lost or reordered. On trio
    ``divert`` is never called: the receive returns the first message."""
    router, raw = router_dealer(socks, endpoint)
    dealer = socks.wrap(raw)
    seen: list[bytes] = []

    def divert(msg: list[bytes]) -> bool:
        seen.append(msg[0])
        return msg[0] != b"stop"

    got: list[list[bytes]] = []
    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            async def receive() -> None:
                got.append(await dealer.recv_multipart(divert))

            tg.start_soon(receive)
            await anyio.wait_all_tasks_blocked()
            ident = _first_identity(router, raw)
            for i in range(5):
                router.send_multipart([ident, b"%d" % i])
                await anyio.sleep(0.005)
            router.send_multipart([ident, b"stop"])
            router.send_multipart([ident, b"after"])
    if anyio_backend == "asyncio":
        assert seen == [b"0", b"1", b"2", b"3", b"4", b"stop"]
        assert got == [[b"stop"]]
        left = [b"after"]
    else:
        assert seen == []
        assert got == [[b"0"]]
        left = [b"1", b"2", b"3", b"4", b"stop", b"after"]
    with anyio.fail_after(GUARD):
        assert [(await dealer.recv_multipart())[0] for _ in left] == left
    assert dealer.recv_multipart_nowait() is None


def _first_identity(router: zmq.Socket[bytes], dealer: zmq.Socket[bytes]) -> bytes:
    """The ROUTER's identity for ``dealer``: the dealer says hello once."""
    dealer.send(b"hello")
    ident, hello = router.recv_multipart()
    assert hello == b"hello"
    return ident


@pytest.mark.anyio
async def test_divert_error_is_raised_by_the_receive_and_fairness_returns_the_65th(
        socks: Sockets, endpoint: str, anyio_backend: str) -> None:
    """An exception ``divert`` raises comes out of the suspended receive (its
    message consumed); a burst longer than the fairness budget ends the receive
    with the next message instead of being consumed in one reader callback."""
    if anyio_backend != "asyncio":
        pytest.skip("divert is an asyncio reader-callback path")
    router, raw = router_dealer(socks, endpoint)
    dealer = socks.wrap(raw)

    def failing(msg: list[bytes]) -> bool:
        raise KeyError(msg[0])

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            errors: list[BaseException] = []

            async def receive() -> None:
                try:
                    await dealer.recv_multipart(failing)
                except KeyError as exc:
                    errors.append(exc)

            tg.start_soon(receive)
            await anyio.wait_all_tasks_blocked()
            ident = _first_identity(router, raw)
            router.send_multipart([ident, b"boom"])
        assert [e.args for e in errors] == [(b"boom",)]
        # a burst of 100 queued at once, all accepted by divert
        taken: list[bytes] = []
        got: list[list[bytes]] = []
        async with anyio.create_task_group() as tg:
            async def receive_all() -> None:
                got.append(await dealer.recv_multipart(lambda m: taken.append(m[0]) is None))

            tg.start_soon(receive_all)
            await anyio.wait_all_tasks_blocked()
            for i in range(100):
                router.send_multipart([ident, b"%d" % i])
            # all 100 in the dealer's queue before the loop runs the reader callback (over
            # ipc libzmq's IO threads deliver them meanwhile; not an await: no callback yet)
            time.sleep(0.2)
        assert len(taken) == 64 and got == [[b"64"]]
        assert taken == [b"%d" % i for i in range(64)]
        for i in range(65, 100):
            assert dealer.recv_multipart_nowait() == [b"%d" % i]


_FLOOD = 600  # replies before the one the handle declines (below the default HWM of 1,000)


async def _receive_a_flood(tmp_path: Path, settle: float) -> tuple[Any, list[int], int, int]:
    """``_FLOOD`` + 1 replies sent by an engine socket, ``settle`` seconds for libzmq's IO threads
    to queue them at the client, then one ``receive_or_handle`` whose handle declines
    the last. Returns the event returned, the ids handled, the receiving task's yields
    (its yields before a wait switched off: each is a flood yield) and how many of
    them the task handled itself (on asyncio those that arrive while it waits on the
    socket are handled by the reader callback instead, outside any task)."""
    import sniffio

    from ctlwire.transports.envelope import Reply
    from ctlwire.transports.zmq_client import ZmqRouterClientTransport
    from ctlwire.transports.zmq_config import rank_identity

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    engine = ctx.socket(zmq.DEALER)
    engine.setsockopt(zmq.LINGER, 0)
    engine.setsockopt(zmq.IDENTITY, rank_identity(0))
    handled: list[int] = []
    by_task = 0
    try:
        async with ZmqRouterClientTransport(f"ipc://{tmp_path}/c.sock") as client:
            engine.connect(client.address)
            codec = client.codec
            yields = 0
            checkpoint = client._checkpoint

            async def counting() -> None:
                nonlocal yields
                yields += 1
                await checkpoint()

            client._checkpoint = counting  # type: ignore[method-assign]
            client._yields_before_wait = 0
            if sniffio.current_async_library() == "asyncio":
                import asyncio

                def in_task() -> bool:
                    return asyncio.current_task() is not None
            else:
                def in_task() -> bool:
                    return True

            def handle(event: Any) -> bool:
                nonlocal by_task
                rid = event.envelope.id
                if rid == _FLOOD:
                    return False
                handled.append(rid)
                by_task += in_task()
                return True

            for i in range(_FLOOD + 1):
                engine.send(codec.encode(Reply(i, 0, 1, True, b"\xc0")))
            time.sleep(settle)  # libzmq's IO threads queue them at the client meanwhile
            with anyio.fail_after(GUARD):
                last = await client.receive_or_handle(handle)
            return last, handled, yields, by_task
    finally:
        engine.close(0)
        ctx.term()


@pytest.mark.anyio
async def test_router_client_handles_a_queued_flood_in_order_and_yields_every_64(
        tmp_path: Path) -> None:
    """``receive_or_handle`` hands queued events to its handle in order, from the
    receiving task, and yields once every 64 of them (a flood of replies cannot
    keep the callers they woke from running); it returns the first event the handle
    declines.

    Whatever part of the flood libzmq shows the client when the receive starts (on a
    loaded machine a first batch of a few dozen, and the rest while the task waits,
    which on asyncio the reader callback handles), the task yields exactly once per 64
    it handled itself. The flood is large enough that the task handles a few hundred
    itself, and it is sent again after a longer settling time should it handle fewer
    than 128 (so that the count is tested)."""
    for attempt, settle in enumerate((0.2, 0.5, 1.0, 2.0, 4.0)):
        directory = tmp_path / str(attempt)
        directory.mkdir()
        last, handled, yields, by_task = await _receive_a_flood(directory, settle)
        assert last.envelope.id == _FLOOD
        assert handled == list(range(_FLOOD))
        assert yields == by_task // 64, (yields, by_task)
        if by_task >= 128:
            return
    raise AssertionError(f"the task handled only {by_task} of the flood itself")


@pytest.mark.anyio
async def test_divert_receives_before_reading_events_once_fires_bring_messages(
        socks: Sockets, endpoint: str, anyio_backend: str) -> None:
    """While a ``recv_multipart(divert)`` waits (asyncio), a fire of the fd that
    follows fires which each brought a message is answered by a receive first: one
    EVENTS read per message (the one that finds the queue drained) instead of two.
    Every message still reaches ``divert`` in order."""
    if anyio_backend != "asyncio":
        pytest.skip("divert is an asyncio reader-callback path")
    router, raw = router_dealer(socks, endpoint)
    dealer = socks.wrap(raw)
    reads = EventsReads(dealer)
    seen: list[bytes] = []
    per_message: list[int] = []
    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            async def receive() -> None:
                await dealer.recv_multipart(lambda m: seen.append(m[0]) is None)

            tg.start_soon(receive)
            await anyio.wait_all_tasks_blocked()
            ident = _first_identity(router, raw)
            for i in range(8):
                before = reads.count
                router.send_multipart([ident, b"%d" % i])
                for _ in range(200):  # until the reader callback took it
                    await anyio.sleep(0.001)
                    if len(seen) == i + 1:
                        break
                per_message.append(reads.count - before)
            tg.cancel_scope.cancel()
    assert seen == [b"%d" % i for i in range(8)]
    assert per_message[:2] == [2, 2], per_message  # not trusted yet: EVENTS, then receive
    assert per_message[2:] == [1] * 6, per_message


@pytest.mark.anyio
async def test_a_waiting_receive_takes_the_message_before_reading_events_once_trusted(
        socks: Sockets, endpoint: str) -> None:
    """A receive woken because the fd fired, after fires that each brought a
    message, receives first instead of reading EVENTS (one socket option read less
    per waited-for message, on both backends: trio's client receiver, serve-mode
    engines); the messages arrive in order."""
    router, raw = router_dealer(socks, endpoint)
    dealer = socks.wrap(raw)
    reads = EventsReads(dealer)
    got: list[list[bytes]] = []
    after_wake: list[int] = []
    with anyio.fail_after(GUARD):
        ident = _first_identity(router, raw)
        for i in range(8):
            async with anyio.create_task_group() as tg:
                async def receive() -> None:
                    got.append(await dealer.recv_multipart())

                tg.start_soon(receive)
                await anyio.wait_all_tasks_blocked()
                before = reads.count
                router.send_multipart([ident, b"%d" % i])
            after_wake.append(reads.count - before)
    assert got == [[b"%d" % i] for i in range(8)]
    # not trusted yet: EVENTS, then the receive (plus, on asyncio, the drain of the fd's
    # stale readiness after the task took the message); trusted: one read less
    first = after_wake[0]
    assert first >= 1 and after_wake[:2] == [first, first], after_wake
    assert after_wake[2:] == [first - 1] * 6, after_wake


@pytest.mark.anyio
async def test_divert_reads_events_after_the_task_a_trusted_fire_woke(
        socks: Sockets, endpoint: str, anyio_backend: str) -> None:
    """When a trusted fire's message is handed to ``divert`` and wakes a task, the
    EVENTS read that follows (is more queued?) runs after that task, as the socket's
    deferred check, not before it; messages that arrive meanwhile are still handed
    over, in order."""
    if anyio_backend != "asyncio":
        pytest.skip("divert is an asyncio reader-callback path")
    router, raw = router_dealer(socks, endpoint)
    dealer = socks.wrap(raw)
    reads = EventsReads(dealer)
    seen: list[bytes] = []
    woken: list[anyio.Event] = [anyio.Event() for _ in range(10)]
    at_delivery: list[int] = []
    when_task_ran: list[int] = []

    def divert(msg: list[bytes]) -> bool:
        seen.append(msg[0])
        at_delivery.append(reads.count)
        woken[len(seen) - 1].set()
        return True

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            async def receive() -> None:
                await dealer.recv_multipart(divert)

            tg.start_soon(receive)
            await anyio.wait_all_tasks_blocked()
            ident = _first_identity(router, raw)
            for i in range(8):
                router.send_multipart([ident, b"%d" % i])
                await woken[i].wait()
                when_task_ran.append(reads.count)
                await anyio.sleep(0.005)  # the deferred check ran; the receive waits again
            # two at once: the second is found by the deferred check, in order
            router.send_multipart([ident, b"a"])
            router.send_multipart([ident, b"b"])
            for _ in range(200):
                await anyio.sleep(0.001)
                if len(seen) == 10:
                    break
            tg.cancel_scope.cancel()
    assert seen == [b"%d" % i for i in range(8)] + [b"a", b"b"]
    # trusted from the third fire on: no EVENTS read between the handing over and the
    # woken task (before: one, the read that finds the queue drained)
    assert [t - d for t, d in zip(when_task_ran, at_delivery[:8], strict=True)][2:] == [0] * 6
