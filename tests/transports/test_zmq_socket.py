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


def fd_readable(sock: AsyncZmqSocket) -> bool:
    fd = sock.socket.getsockopt(zmq.FD)
    assert isinstance(fd, int)
    return bool(select.select([fd], [], [], 0)[0])


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


@pytest.mark.anyio
async def test_receive_many_takes_what_is_queued_in_order_up_to_the_limit(
        socks: Sockets) -> None:
    raw_router, raw_dealer = router_dealer(socks, "inproc://many")
    router, dealer = socks.wrap(raw_router), socks.wrap(raw_dealer)
    assert router.recv_many_nowait(4) == []
    for i in range(10):
        dealer.send_pair_nowait(b"m", b"%d" % i)
    first = router.recv_many_nowait(4)  # inproc: queued synchronously
    rest = router.recv_many_nowait(100)
    assert [m[1:] for m in first + rest] == [[b"m", b"%d" % i] for i in range(10)]
    assert len(first) == 4 and len({m[0] for m in first + rest}) == 1
    assert router.recv_many_nowait(4) == []


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
@pytest.mark.parametrize("how", ["nowait", "await", "pair"])
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
            elif how == "pair":
                dealer.send_pair_nowait(b"request", b"2")
            else:
                await dealer.send_multipart([b"request"])
            assert not fd_readable(dealer)
            assert got == []
    assert got == [[b"reply"]]
    assert peer.poll(GUARD * 1000)
    assert peer.recv_multipart() == [ident, b"request", *([b"2"] if how == "pair" else [])]


class EventsCountingSocket(zmq.Socket[bytes]):
    """A plain socket that counts its ``EVENTS`` reads."""

    events_reads = 0

    def get(self, option: int) -> Any:
        self.events_reads += option == zmq.EVENTS
        return super().get(option)


@pytest.mark.anyio
@pytest.mark.parametrize("batched", [True, False])
async def test_a_burst_of_sends_rechecks_once_when_batched_and_strands_no_receiver(
        socks: Sockets, batched: bool) -> None:
    """Sends made while the receiver waits re-read ``EVENTS`` for it: inside
    ``batched_sends()`` once, at the block's end, otherwise after each send until one
    finds the reply and wakes it (a woken receiver re-checks itself when it resumes).
    Either way the reply whose edge the sends drained reaches the receiver."""
    peer = socks.raw_socket(zmq.ROUTER)
    peer.bind("inproc://burst")
    raw = socks.context.socket(zmq.DEALER, socket_class=EventsCountingSocket)
    socks.raw.append(raw)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect("inproc://burst")
    dealer = socks.wrap(raw)
    dealer.send_multipart_nowait([b"hello"])
    assert peer.poll(GUARD * 1000)
    ident, _ = peer.recv_multipart()
    got: list[list[bytes]] = []

    async def receive() -> None:
        got.append(await dealer.recv_multipart())

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(receive)
            await anyio.wait_all_tasks_blocked()  # the receiver waits on the fd
            peer.send_multipart([ident, b"reply"])
            time.sleep(0.01)  # let libzmq's send process commands (drain the fd)
            before = raw.events_reads
            if batched:
                with dealer.batched_sends():
                    for i in range(16):
                        dealer.send_multipart_nowait([b"%d" % i])
                    assert raw.events_reads == before  # nothing re-read inside the block
                assert raw.events_reads == before + 1
            else:
                for i in range(16):
                    dealer.send_multipart_nowait([b"%d" % i])
                assert raw.events_reads == before + 1  # the first found the reply
    assert got == [[b"reply"]]
    for i in range(16):
        assert peer.poll(GUARD * 1000)
        assert peer.recv_multipart() == [ident, b"%d" % i]


@pytest.mark.anyio
async def test_a_send_leaves_a_still_readable_fd_to_the_watcher(socks: Sockets) -> None:
    """A reply arrives while the receiver watches the fd and a send follows before the
    loop polls it (a busy machine). While the fd stays readable after the send, the
    send reads no ``EVENTS``: that read would take the edge and force the receiver's
    watch to be cancelled and parked again. The receiver wakes on the fd itself."""
    peer = socks.raw_socket(zmq.ROUTER)
    peer.bind("inproc://still-readable")
    raw = socks.context.socket(zmq.DEALER, socket_class=EventsCountingSocket)
    socks.raw.append(raw)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect("inproc://still-readable")
    dealer = socks.wrap(raw)
    dealer.send_multipart_nowait([b"hello"])
    assert peer.poll(GUARD * 1000)
    ident, _ = peer.recv_multipart()
    got: list[list[bytes]] = []
    left_readable = 0

    async def receive() -> None:
        got.append(await dealer.recv_multipart())

    with anyio.fail_after(GUARD):
        for i in range(20):
            async with anyio.create_task_group() as tg:
                tg.start_soon(receive)
                await anyio.wait_all_tasks_blocked()  # the receiver waits on the fd
                peer.send_multipart([ident, b"reply %d" % i])
                assert fd_readable(dealer)
                before = raw.events_reads
                dealer.send_multipart_nowait([b"request %d" % i])
                if fd_readable(dealer):  # libzmq's send did not process commands
                    left_readable += 1
                    assert raw.events_reads == before
                else:
                    assert raw.events_reads == before + 1
            assert peer.poll(GUARD * 1000)
            assert peer.recv_multipart() == [ident, b"request %d" % i]
    assert got == [[b"reply %d" % i] for i in range(20)]
    assert left_readable > 0


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
        expect("send_pair_nowait", lambda: sock.send_pair_nowait(b"x", b"y"))
        expect("recv_many_nowait", lambda: sock.recv_many_nowait(8))
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
        "send_pair_nowait",
        "recv_many_nowait",
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


@pytest.mark.anyio
async def test_wait_readable_returns_once_a_message_can_be_taken(socks: Sockets,
                                                                endpoint: str) -> None:
    """``wait_readable`` suspends while nothing is queued, across sends made on the
    same socket meanwhile, and returns once a message can be taken; a second
    receiving task is refused meanwhile."""
    peer, raw_dealer = router_dealer(socks, endpoint)
    dealer = socks.wrap(raw_dealer)
    dealer.send_multipart_nowait([b"hello"])
    assert peer.poll(GUARD * 1000)
    ident, _ = peer.recv_multipart()
    returned = anyio.Event()

    async def wait() -> None:
        await dealer.wait_readable()
        returned.set()

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            for i in range(3):  # traffic on the socket that brings nothing to read
                await dealer.send_multipart([b"%d" % i])
                await anyio.wait_all_tasks_blocked()
            assert not returned.is_set()
            with pytest.raises(anyio.BusyResourceError):
                dealer.recv_multipart_nowait()
            peer.send_multipart([ident, b"reply"])
            await returned.wait()
    assert dealer.recv_multipart_nowait() == [b"reply"]


@pytest.mark.anyio
async def test_interrupt_wait_ends_a_wait_readable_with_nothing_queued(socks: Sockets,
                                                                       endpoint: str) -> None:
    """``interrupt_wait`` makes a suspended ``wait_readable`` return although nothing can
    be taken; the socket then receives as before."""
    peer, raw_dealer = router_dealer(socks, endpoint)
    dealer = socks.wrap(raw_dealer)
    dealer.send_multipart_nowait([b"hello"])
    assert peer.poll(GUARD * 1000)
    ident, _ = peer.recv_multipart()
    returned = anyio.Event()

    async def wait() -> None:
        await dealer.wait_readable()
        returned.set()

    with anyio.fail_after(GUARD):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait)
            await anyio.wait_all_tasks_blocked()
            assert not returned.is_set()
            dealer.interrupt_wait()
            await returned.wait()
        assert dealer.recv_multipart_nowait() is None
        peer.send_multipart([ident, b"reply"])
        assert await dealer.recv_multipart() == [b"reply"]


def test_a_burst_taken_at_once_keeps_each_messages_sender_under_curve(
        ctx: zmq.Context[zmq.Socket[bytes]], socks: Sockets) -> None:
    """With User-Ids tracked, every message a receive returns was sent by the key
    :attr:`last_user_id` names then: a burst from two keys, queued together, is
    never attributed wholesale to the sender of its last message."""
    from ctlwire.transports.curve import CurveAuthenticator, CurveServerConfig, generate_keypair

    server, alice, bob = generate_keypair(), generate_keypair(), generate_keypair()
    auth = CurveAuthenticator(ctx, CurveServerConfig.allowing(
        server, [alice.public, bob.public], any_rank=True))
    auth.start()
    try:
        router = socks.raw_socket(zmq.ROUTER)
        CurveServerConfig.allowing(server, any_rank=True).apply(router)
        port = router.bind_to_random_port("tcp://127.0.0.1")
        senders = {}
        for name, keys in ((b"alice", alice), (b"bob", bob)):
            dealer = socks.raw_socket(zmq.DEALER)
            dealer.curve_secretkey, dealer.curve_publickey = keys.secret, keys.public
            dealer.curve_serverkey = server.public
            dealer.connect(f"tcp://127.0.0.1:{port}")
            senders[name] = dealer
        sock = socks.wrap(router)
        sock.track_user_id()
        key_of = {b"alice": alice.public.decode(), b"bob": bob.public.decode()}
        for i in range(5):
            for name, dealer in senders.items():
                dealer.send(name + b"-%d" % i)
        got: list[bytes] = []
        deadline = time.monotonic() + GUARD
        while len(got) < 10:
            assert time.monotonic() < deadline, got
            if not router.poll(100):
                continue
            if not got:
                time.sleep(0.3)  # the rest queue behind the first: one burst
            for msg in sock.recv_many_nowait(16):
                sender = msg[1].split(b"-")[0]
                assert sock.last_user_id == key_of[sender], (msg, sock.last_user_id)
                got.append(msg[1])
        assert sorted(got) == sorted(n + b"-%d" % i for n in senders for i in range(5))
    finally:
        auth.stop()
