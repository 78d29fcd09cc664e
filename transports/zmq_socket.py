"""An anyio-native wrapper around a plain (synchronous) pyzmq socket, for asyncio and trio.

libzmq signals readiness through ``zmq.FD``, which is *edge-triggered* and shared by both
directions: it becomes readable when the socket's command mailbox receives something, and
any call into the socket (``send``, ``recv``, ``getsockopt(EVENTS)``) may drain it. The
only reliable question is ``getsockopt(EVENTS)``; the fd only says "ask again".

How waiting works (see :class:`AsyncZmqSocket`):

* At most one task at a time waits on the fd (``trio.lowlevel.wait_readable`` inside a
  ``trio.CancelScope`` stored on the object on trio, resolved once per socket; a future
  resolved by the socket's reader callback on asyncio): the *fd waiter*. Any other task
  that has to wait (the receiver, or a sender blocked on the high-water mark) waits on a
  shared event (the backend's own) instead. Both backends refuse two waiters on one fd, so this is
  not an optimisation but a requirement.
* The fd waiter wakes the event waiters when the fd fires; a task leaving an operation
  while others still wait hands the fd role over by setting the event.
* Every task that touched the socket while others are suspended re-reads ``EVENTS``
  afterwards; if a suspended receiver could now receive (``POLLIN``), or a suspended
  sender could now send (``POLLOUT``), it wakes the waiters (cancels the fd waiter's
  scope and sets the event). So a send that swallows the edge announcing a reply
  cannot strand the receiver.
* A ROUTER with ``ROUTER_MANDATORY`` reports ``POLLOUT`` while *any* peer has room, so a
  send to a full peer can fail although ``POLLOUT`` is set. Such a sender waits for the
  fd with a bounded back-off (1 ms doubling to 50 ms) instead of spinning.
* On asyncio the fd reader is registered once per socket (first wait to close); its
  callback resolves the current fd waiter's future, or drains the fd when nobody waits.
  On trio (or another anyio backend) the backend's own wait, cancel scope, clock and
  event are resolved once per socket (:class:`_Native`), not looked up through anyio
  on every wait.

Why this module is one file of ~750 lines: the receive, send and wait paths share one
small state machine (who holds the fd, who waits on the event, which re-check of EVENTS
is owed to whom). Its invariants — no lost edge, one fd waiter per backend, hand-over on
every exit path — are only checkable when every transition of that state is read
together; the asyncio and trio fd waiters are ~40 lines each and read and write the same
slots as the rest. Splitting them into modules would spread the state across files
without making any part usable on its own. What is not that state (frame helpers) is at
the top.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from functools import partial
from typing import Any, Final, NamedTuple, cast

import anyio
import anyio.lowlevel
import zmq
import zmq.asyncio
import zmq.backend

from .errors import ForeignThreadError, SocketClosed

__all__ = ["AsyncZmqSocket", "ForeignThreadError", "Frames", "ReceiveInterrupted", "SocketClosed"]

Frames = Sequence[bytes | bytearray | memoryview | zmq.Frame]
"""What :meth:`AsyncZmqSocket.send_multipart` accepts: one buffer per frame."""

_NOBLOCK: Final = int(zmq.NOBLOCK)
#: The send of pyzmq's C socket: ``zmq.Socket.send`` adds a Python frame (DRAFT
#: routing-id/group handling) that costs more than libzmq's own send of a small frame.
_BACKEND_SEND: Final = cast(Callable[..., None], zmq.backend.Socket.send)
_NOBLOCK_SNDMORE: Final = int(zmq.NOBLOCK) | int(zmq.SNDMORE)
_EVENTS: Final = int(zmq.EVENTS)
_POLLIN: Final = int(zmq.POLLIN)
_POLLOUT: Final = int(zmq.POLLOUT)

#: What ``AsyncZmqSocket._fd_scope`` holds while a task waits on the fd outside asyncio
#: with no cancel scope of its own: wake it with ``notify_closing(fd)``.
_NOTIFY_WAKES: Final = object()
#: Consecutive operations that completed without suspending before one forced checkpoint,
#: so that a flood of queued messages cannot starve the event loop or hide cancellation.
_FAIRNESS_BUDGET: Final = 64
#: Consecutive right "empty" guesses after which :attr:`AsyncZmqSocket.likely_empty` says so.
_GUESS_TRUSTED: Final = 2
#: Back-off of a sender whose peer is full while POLLOUT is set (ROUTER_MANDATORY), seconds.
_RETRY_MIN: Final = 0.001
_RETRY_MAX: Final = 0.05


class _Native(NamedTuple):
    """The fd wait of a non-asyncio backend, its primitives resolved once (anyio's
    module-level functions look the backend up through sniffio on every call, and
    ``anyio.CancelScope`` wraps trio's own)."""

    wait_readable: Callable[[int], Awaitable[None]]
    cancel_scope: Callable[..., Any]  # (deadline=) -> a cancel scope (cancel())
    current_time: Callable[[], float]
    new_event: Callable[[], Any]  # -> an event (set, wait)
    closed_error: type[BaseException]  # what wait_readable raises on notify_closing
    notify_closing: Callable[[int], None]


def _native_backend() -> _Native:
    """The running backend's own primitives (trio's); anyio's for another backend."""
    import sniffio

    if sniffio.current_async_library() == "trio":
        import trio

        return _Native(trio.lowlevel.wait_readable, trio.CancelScope, trio.current_time,
                       trio.Event, trio.ClosedResourceError,
                       trio.lowlevel.notify_closing)
    return _Native(anyio.wait_readable, anyio.CancelScope,  # pragma: no cover
                   anyio.current_time, anyio.Event, anyio.ClosedResourceError,
                   anyio.notify_closing)


class ReceiveInterrupted(Exception):
    """:meth:`AsyncZmqSocket.recv_multipart` was woken by
    :meth:`AsyncZmqSocket.interrupt_receive`; nothing was received."""


def _recv_frames(socket: zmq.Socket[bytes], meta: list[str | None] | None = None
                 ) -> list[bytes]:
    """``socket.recv_multipart(NOBLOCK)``, reading each part's "more" flag from the
    received frame (pyzmq's version asks ``getsockopt(RCVMORE)`` per part, which builds
    a ``SocketOption`` enum member on every call). Raises ``zmq.Again`` when no message
    is queued; the parts of a message arrive together, so only the first can."""
    recv = socket.recv
    frame = recv(_NOBLOCK, copy=False)
    parts = [frame.bytes]
    while frame.more:
        frame = recv(_NOBLOCK, copy=False)
        parts.append(frame.bytes)
    if meta is not None:  # the ZAP User-Id the authenticator gave the sending peer
        try:
            meta[0] = str(frame.get("User-Id"))
        except zmq.ZMQError:
            meta[0] = None
    return parts


def _sender(socket: zmq.Socket[bytes]) -> Callable[[Any, int], None]:
    """``socket.send`` as ``send(data, flags)``: pyzmq's C send when ``socket`` is a
    plain ``zmq.Socket`` (whose ``send`` only adds DRAFT routing-id/group options)."""
    if type(socket).send is zmq.Socket.send:
        return cast(Callable[[Any, int], None], partial(_BACKEND_SEND, socket))
    return cast(Callable[[Any, int], None], socket.send)


def _send_frames(socket: zmq.Socket[bytes], frames: Frames,
                 send: Callable[[Any, int], None] | None = None) -> None:
    """``socket.send_multipart(frames, NOBLOCK)`` with plain int flags.

    Same checks and the same libzmq calls as pyzmq's version (every frame is checked
    before the first is queued; libzmq takes all parts or, at the first, none), minus
    its per-frame ``SNDMORE | flags`` on ``IntFlag`` members, a Python-level enum
    operation that costs more than the send itself.
    """
    for i, frame in enumerate(frames):
        if not isinstance(frame, (bytes, zmq.Frame, memoryview)):
            try:
                memoryview(frame)
            except Exception:
                raise TypeError(f"Frame {i} ({repr(frame)[:32]}) does not support the "
                                "buffer interface.") from None
    if send is None:
        send = socket.send
    last = len(frames) - 1
    for i in range(last):
        send(frames[i], _NOBLOCK_SNDMORE)
    send(frames[last], _NOBLOCK)


def _socket_type_name(socket: zmq.Socket[bytes]) -> str:
    try:
        return zmq.SocketType(cast(int, socket.get(zmq.TYPE))).name
    except (ValueError, zmq.ZMQError):
        return "UNKNOWN"


class AsyncZmqSocket:
    """Awaitable multipart send and receive on one plain ``zmq.Socket``, on asyncio or trio.

    Guarantees:

    * The socket belongs to the thread that created this object. Every method raises
      :class:`ForeignThreadError` when called from another thread (libzmq sockets are not
      thread-safe; misuse corrupts memory).
    * Frames are delivered in libzmq order: messages are received in the order libzmq
      hands them out, and a task's successive sends reach libzmq in the order it made
      them. Concurrent senders are not ordered relative to each other (a blocked sender
      does not hold back others, e.g. to other ROUTER peers).
    * One task at a time may receive (:class:`anyio.BusyResourceError` otherwise); any
      number of tasks of the owner thread may send.
    * A message already queued is returned without suspending, except for one checkpoint
      every 64 consecutive non-suspending operations (fairness).
    * Cancellation never loses or half-sends a message: a cancelled receive took nothing
      off the socket, a cancelled send queued nothing.
    * Waiting never blocks the event loop and never busy-spins. A send to a full peer of a
      ``ROUTER_MANDATORY`` socket that other peers keep writable re-checks on a back-off
      (1 ms doubling to 50 ms) as libzmq gives no per-peer readiness signal.
    * After :meth:`close`, waiting and new operations raise :class:`SocketClosed`.
    """

    __slots__ = (
        "_batch",
        "_changed",
        "_check_pending",
        "_check_queued",
        "_closed",
        "_divert",
        "_divert_error",
        "_diverted_back",
        "_empty_guesses",
        "_fd",
        "_fd_future",
        "_fd_scope",
        "_fires_carry",
        "_get",
        "_interrupt",
        "_meta",
        "_native",
        "_owner",
        "_pollout_waiters",
        "_reader_loop",
        "_receiving",
        "_recv_missed",
        "_recv_streak",
        "_recv_waiting",
        "_send",
        "_send_streak",
        "_socket",
        "_type_name",
    )

    def __init__(self, socket: zmq.Socket[bytes]) -> None:
        """Wrap ``socket``; the calling thread becomes its owner.

        :raises TypeError: if ``socket`` is a ``zmq.asyncio`` socket (pass a plain one).
        :raises SocketClosed: if ``socket`` is already closed.
        """
        if isinstance(socket, zmq.asyncio.Socket):
            raise TypeError("AsyncZmqSocket wraps a plain zmq.Socket, not a zmq.asyncio one")
        if socket.closed:
            raise SocketClosed("cannot wrap a closed zmq socket")
        self._socket = socket
        self._owner = threading.get_ident()
        self._type_name = _socket_type_name(socket)
        self._get = cast(Callable[[int], int], socket.get)
        self._send = _sender(socket)
        self._fd = cast(int, socket.get(zmq.FD))
        self._closed = False
        self._receiving = False  # a recv call is in progress
        self._recv_waiting = False  # ... and is suspended
        self._pollout_waiters = 0  # senders suspended until POLLOUT
        # the cancel scope of the current fd waiter (not on asyncio; _NOTIFY_WAKES when it
        # has none), and the backend's primitives it uses (resolved at the first wait
        # outside asyncio)
        self._fd_scope: Any = None
        self._native: _Native | None = None
        # ... or, on asyncio, the future it awaits (the reader callback resolves it)
        self._fd_future: asyncio.Future[bool | None] | None = None
        # the asyncio loop on which this socket's fd reader stays registered (from the
        # first wait until close: no epoll_ctl pair per wait), None while none is
        self._reader_loop: asyncio.AbstractEventLoop | None = None
        self._changed: Any = None  # an event: wakes the tasks that are not the fd waiter
        self._recv_streak = 0
        self._send_streak = 0
        # the last receive attempt found the queue empty: ask EVENTS before recv next
        # time (a miss costs a zmq.Again exception, which is several times dearer)
        self._recv_missed = False
        # how many times in a row the queue was indeed empty when _recv_missed guessed
        # so (0.._GUESS_TRUSTED): see likely_empty
        self._empty_guesses = 0
        self._interrupt = False  # interrupt_receive() was called for the receive in progress
        self._meta: list[str | None] | None = None  # [User-Id of the last message] when tracked
        # while a receive that passed ``divert`` is suspended (asyncio): the callable the
        # reader callback hands arriving messages to; what it raised; the message it
        # declined, which that receive returns
        self._divert: Callable[[list[bytes]], bool] | None = None
        self._divert_error: BaseException | None = None
        # how many of the last fires of the fd (0.._GUESS_TRUSTED) brought a message
        self._fires_carry = 0
        self._diverted_back: list[bytes] | None = None
        # a re-check of EVENTS on behalf of suspended tasks is owed at the end of
        # batched_sends() / queued on the asyncio loop (see _after_send)
        self._check_pending = False
        self._check_queued = False
        self._batch = 0

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"<AsyncZmqSocket {self._type_name} {state} owner={self._owner}>"

    @property
    def socket(self) -> zmq.Socket[bytes]:
        """The wrapped socket. Options may be set on it; do not send or receive on it."""
        return self._socket

    def track_user_id(self) -> None:
        """Record the ZAP ``User-Id`` of each received message (:attr:`last_user_id`)."""
        self._meta = [None]

    @property
    def last_user_id(self) -> str | None:
        """The ZAP ``User-Id`` of the last received message (None: untracked or none)."""
        return None if self._meta is None else self._meta[0]

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called (or the socket was closed underneath)."""
        return self._closed or self._socket.closed

    # ------------------------------------------------------------------ receive

    def recv_multipart_nowait(self) -> list[bytes] | None:
        """Return the next queued message, or None if none is queued. Never suspends.

        :raises ForeignThreadError: if called from a thread other than the owner.
        :raises SocketClosed: if the socket is closed.
        :raises anyio.BusyResourceError: if a task is suspended in :meth:`recv_multipart`.
        """
        if self._closed or threading.get_ident() != self._owner:
            self._raise_unusable()
        if self._receiving:
            raise anyio.BusyResourceError("receiving from")
        try:
            if self._recv_missed:
                if not self._get(_EVENTS) & _POLLIN:
                    self._guessed(True)
                    return None
                self._guessed(False)
            msg = _recv_frames(self._socket, self._meta)
        except zmq.Again:
            self._recv_missed = True
            return None
        finally:
            if self._pollout_waiters:
                self._after_io()
        self._recv_missed = False
        return msg

    async def recv_multipart(self, divert: Callable[[list[bytes]], bool] | None = None
                             ) -> list[bytes]:
        """Receive the next message, suspending until one arrives.

        ``divert`` (asyncio only; ignored elsewhere): while this receive is suspended,
        messages that arrive are handed to ``divert(message)`` from the event loop's
        reader callback, in libzmq order, without waking the receiving task; it returns
        True when it consumed the message. The first message it declines (False) is
        the one this receive returns, and so is, after 64 consumed in one callback, the
        next one (fairness). An exception ``divert`` raises (the message is consumed)
        is raised by this receive. ``divert`` must not use this socket.

        :raises ForeignThreadError: if called from a thread other than the owner.
        :raises SocketClosed: if the socket is or gets closed.
        :raises anyio.BusyResourceError: if another task is receiving.
        :raises zmq.ZMQError: what libzmq reports otherwise.
        """
        if self._closed or threading.get_ident() != self._owner:
            self._raise_unusable()
        if self._receiving:
            raise anyio.BusyResourceError("receiving from")
        self._receiving = True
        self._interrupt = False
        try:
            if self._recv_streak >= _FAIRNESS_BUDGET:
                self._recv_streak = 0
                await anyio.lowlevel.checkpoint()
                if self._closed:
                    self._raise_unusable()
                if self._interrupt:
                    raise ReceiveInterrupted("receive interrupted")
            if self._recv_missed:  # just found empty: go straight to EVENTS and waiting
                self._recv_streak = 0
                return await self._recv_slow(divert)
            try:
                msg = _recv_frames(self._socket, self._meta)
            except zmq.Again:
                self._recv_streak = 0
                return await self._recv_slow(divert)
            self._recv_streak += 1
            if self._pollout_waiters:
                self._after_io()
            return msg
        finally:
            self._receiving = False

    @property
    def likely_empty(self) -> bool:
        """True when the receive queue is most likely empty: the last receive found it
        so (or its message had to be waited for), and that guess was right the last
        few times. A receiver may then skip a non-blocking attempt
        (:meth:`recv_multipart_nowait`, an ``EVENTS`` read when it finds nothing) and
        go straight to :meth:`recv_multipart`, which checks before it waits: only the
        cost changes, never what is received."""
        return self._recv_missed and self._empty_guesses >= _GUESS_TRUSTED

    def _fire_brought(self, message: bool) -> None:
        """A fire of the fd was checked: did it bring a message? (:attr:`_fires_carry`:
        after _GUESS_TRUSTED fires in a row that did, receive before reading EVENTS)."""
        self._fires_carry = min(self._fires_carry + 1, _GUESS_TRUSTED) if message else 0

    def _guessed(self, right: bool) -> None:
        """An "empty" guess (``_recv_missed``) was checked against EVENTS."""
        if not right:
            self._empty_guesses = 0
        elif self._empty_guesses < _GUESS_TRUSTED:
            self._empty_guesses += 1

    async def _recv_slow(self, divert: Callable[[list[bytes]], bool] | None = None
                         ) -> list[bytes]:
        waited = False
        fired = False  # the last wait ended because the fd fired
        guessed = self._recv_missed
        try:
            while True:
                if fired and self._fires_carry >= _GUESS_TRUSTED and not self._pollout_waiters:
                    # the last fires brought a message: receive first (a non-blocking
                    # receive processes libzmq's commands itself; finding nothing, it
                    # has drained the fd as the EVENTS read would have)
                    try:
                        msg = _recv_frames(self._socket, self._meta)
                    except zmq.Again:
                        self._fire_brought(False)  # EVENTS first next time
                        events = 0
                    else:
                        self._recv_missed = True  # waited for: it most likely came alone
                        return msg
                else:
                    events = self._get(_EVENTS)  # drains the fd: a later edge means news
                    if fired:
                        self._fire_brought(bool(events & _POLLIN))
                fired = False
                if guessed:
                    guessed = False
                    self._guessed(not events & _POLLIN)
                if events & _POLLIN:
                    try:
                        msg = _recv_frames(self._socket, self._meta)
                    except zmq.Again:
                        continue
                    # a message that had to be waited for most likely came alone: ask
                    # EVENTS before the next recv rather than pay for a zmq.Again
                    self._recv_missed = waited
                    if self._pollout_waiters:
                        self._after_io()
                    return msg
                if self._pollout_waiters and events & _POLLOUT:
                    self._wake()
                self._recv_waiting = True
                self._divert = divert
                waited = True
                try:
                    fired = await self._wait(None)
                finally:
                    self._recv_waiting = False
                    self._divert = None
                if self._diverted_back is not None:
                    msg, self._diverted_back = self._diverted_back, None
                    self._recv_missed = True  # it most likely came alone
                    return msg
                if self._divert_error is not None:
                    error, self._divert_error = self._divert_error, None
                    raise error
                if self._interrupt:
                    raise ReceiveInterrupted("receive interrupted")
        finally:
            self._hand_over()

    def poll_readable(self, timeout: float) -> bool:
        """Block the calling (owner) thread up to ``timeout`` seconds until a message can
        be received: the wait of a synchronous engine loop, without an event loop. True
        when one can (the next :meth:`recv_multipart_nowait` then takes it at once).

        :raises ForeignThreadError: if called from a thread other than the owner.
        :raises SocketClosed: if the socket is closed.
        :raises anyio.BusyResourceError: if a task is suspended in :meth:`recv_multipart`.
        """
        if self._closed or self._socket.closed or threading.get_ident() != self._owner:
            self._raise_unusable()
        if self._receiving:
            raise anyio.BusyResourceError("receiving from")
        # zmq_poll itself: Socket.poll builds and registers a Poller on every call
        ready = bool(zmq.zmq_poll([(self._socket, _POLLIN)], int(timeout * 1000)))
        if ready:
            self._recv_missed = False
        return ready

    def interrupt_receive(self) -> None:
        """Wake the task suspended in :meth:`recv_multipart`, which then raises
        :class:`ReceiveInterrupted` having received nothing (a message that is queued
        stays queued). No effect when no receive is in progress.

        Lets the owner of the receiving task hand it something other than a message
        without wrapping every receive in a cancel scope of its own.

        :raises ForeignThreadError: if called from a thread other than the owner.
        """
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        if self._receiving and not self._closed:
            self._interrupt = True
            self._wake()

    # --------------------------------------------------------------------- send

    def send_multipart_nowait(self, frames: Frames) -> None:
        """Queue one multipart message in libzmq, or raise. Never suspends.

        :raises zmq.Again: if the high-water mark is reached (nothing was queued).
        :raises zmq.ZMQError: what libzmq reports, e.g. ``EHOSTUNREACH`` from a ROUTER with
            ``ROUTER_MANDATORY`` for an unknown identity.
        :raises ForeignThreadError: if called from a thread other than the owner.
        :raises SocketClosed: if the socket is closed.
        """
        if self._closed or threading.get_ident() != self._owner:
            self._raise_unusable()
        try:
            _send_frames(self._socket, frames, self._send)
        finally:
            if self._recv_waiting or self._pollout_waiters:
                self._after_send()

    def send_pair_nowait(self, first: bytes, second: bytes) -> None:
        """:meth:`send_multipart_nowait` of the two-frame message ``[first, second]``
        (a ROUTER's identity and payload), without the per-frame checks of a frame
        list: for a fan-out's many sends. Same errors, same guarantees."""
        if self._closed or threading.get_ident() != self._owner:
            self._raise_unusable()
        send = self._send
        try:
            send(first, _NOBLOCK_SNDMORE)
            send(second, _NOBLOCK)
        finally:
            if self._recv_waiting or self._pollout_waiters:
                self._after_send()

    @contextlib.contextmanager
    def batched_sends(self) -> Iterator[None]:
        """Within the block, sends re-check readiness for suspended tasks once, at
        its end, instead of once per send (``getsockopt(EVENTS)`` costs more than a
        small send): for fanning one request out to many ROUTER peers. The block
        must not suspend.

        :raises ForeignThreadError: if used from a thread other than the owner.
        """
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        self._batch += 1
        try:
            yield
        finally:
            self._batch -= 1
            if not self._batch and self._check_pending:
                self._check_pending = False
                self._after_io()

    async def send_multipart(self, frames: Frames) -> None:
        """Queue one multipart message in libzmq, suspending while the high-water mark is
        reached.

        Returns once libzmq accepted the message (not once the peer received it). When
        this raises, including on cancellation, nothing was queued.

        :raises zmq.ZMQError: what libzmq reports, e.g. ``EHOSTUNREACH`` (see
            :meth:`send_multipart_nowait`).
        :raises ForeignThreadError: if called from a thread other than the owner.
        :raises SocketClosed: if the socket is or gets closed.
        """
        if self._closed or threading.get_ident() != self._owner:
            self._raise_unusable()
        if self._send_streak >= _FAIRNESS_BUDGET:
            self._send_streak = 0
            await anyio.lowlevel.checkpoint()
            if self._closed:
                self._raise_unusable()
        try:
            _send_frames(self._socket, frames, self._send)
        except zmq.Again:
            pass
        else:
            self._send_streak += 1
            return
        finally:
            if self._recv_waiting or self._pollout_waiters:
                self._after_send()
        self._send_streak = 0
        await self._send_slow(frames)

    async def _send_slow(self, frames: Frames) -> None:
        delay = _RETRY_MIN
        try:
            while True:
                events = self._get(_EVENTS)  # drains the fd: a later edge means news
                if self._recv_waiting and events & _POLLIN:
                    self._wake()
                if events & _POLLOUT:
                    try:
                        _send_frames(self._socket, frames, self._send)
                        return
                    except zmq.Again:
                        # Room for some peer but not this one (ROUTER_MANDATORY): no event
                        # tells when this peer drains, so wait for the fd with a back-off.
                        pass
                    finally:
                        if self._recv_waiting or self._pollout_waiters:
                            self._after_io()
                    await self._wait(delay)
                    delay = min(delay * 2, _RETRY_MAX)
                    continue
                self._pollout_waiters += 1
                try:
                    await self._wait(None)
                finally:
                    self._pollout_waiters -= 1
        finally:
            self._hand_over()

    # -------------------------------------------------------------------- close

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket; tasks waiting on it raise :class:`SocketClosed`. Idempotent.

        Never blocks: ``linger_ms`` bounds how long libzmq keeps sending queued messages in
        the background (0: drop them). Safe outside an event loop.

        :raises ForeignThreadError: if called from a thread other than the owner.
        """
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        if self._closed:
            return
        self._closed = True
        if self._fd_scope is not None:
            # A task is inside wait_readable(fd), so an event loop runs in this thread.
            native = self._native
            with contextlib.suppress(RuntimeError):  # no running event loop after all
                if native is not None:
                    native.notify_closing(self._fd)
                else:  # pragma: no cover - a scope is only set with _native resolved
                    anyio.notify_closing(self._fd)
            if self._fd_scope is not _NOTIFY_WAKES:
                self._fd_scope.cancel()
        loop, self._reader_loop = self._reader_loop, None
        if loop is not None:
            # the asyncio reader is registered on the fd: unregister before libzmq closes
            # it (a no-op on a loop that is closed already)
            loop.remove_reader(self._fd)
        future = self._fd_future
        if future is not None and not future.done():
            future.set_result(None)
        self._set_changed()
        self._socket.close(linger=linger_ms)

    # ---------------------------------------------------------------- internals

    async def _wait(self, timeout: float | None) -> bool:
        """Suspend until the fd fires, another task calls :meth:`_wake`, or ``timeout``.
        True when this task waited on the fd and it fired.

        The caller must have read EVENTS (draining the fd) after its last socket call, and
        must re-check readiness afterwards: every wake-up may be spurious.
        """
        if self._fd_scope is None and self._fd_future is None:
            loop = asyncio._get_running_loop()
            if loop is not None:
                fired = False
                if timeout is None:
                    fired = await self._wait_fd_asyncio(loop)
                else:
                    with anyio.move_on_after(timeout):
                        fired = await self._wait_fd_asyncio(loop)
                if self._closed:
                    raise SocketClosed(f"{self._type_name} socket was closed")
                return fired
            native = self._native
            if native is None:
                native = self._native = _native_backend()
            # An untimed wait has no cancel scope around it (entering and leaving one
            # costs ~7 µs on trio, more than the rest of a reply's handling): _wake() ends
            # it with notify_closing(fd), which wakes the waiter with closed_error and
            # drops the fd's registration (the next wait registers it again).
            holder: Any = (_NOTIFY_WAKES if timeout is None
                           else native.cancel_scope(deadline=native.current_time() + timeout))
            self._fd_scope = holder
            fired = False
            try:
                if holder is _NOTIFY_WAKES:
                    await native.wait_readable(self._fd)
                    fired = True
                else:
                    with holder:
                        await native.wait_readable(self._fd)
                        fired = True
            except native.closed_error:
                if self._closed:
                    raise SocketClosed(f"{self._type_name} socket was closed") from None
            finally:
                if self._fd_scope is holder:
                    self._fd_scope = None
            if fired:
                self._set_changed()
            if self._closed:
                raise SocketClosed(f"{self._type_name} socket was closed")
            return fired
        else:
            event = self._changed
            if event is None:
                native = self._native
                if native is None and asyncio._get_running_loop() is None:
                    native = self._native = _native_backend()
                event = self._changed = (anyio.Event() if native is None
                                         else native.new_event())
            if timeout is None:
                await event.wait()
            else:
                with anyio.move_on_after(timeout):
                    await event.wait()
        if self._closed:
            raise SocketClosed(f"{self._type_name} socket was closed")
        return False

    async def _wait_fd_asyncio(self, loop: asyncio.AbstractEventLoop) -> bool:
        """The fd waiter on asyncio: a future that the socket's reader callback
        (:meth:`_on_readable`) resolves (what ``anyio.wait_readable`` does, without a
        cancel scope around it; anyio's cancellation still reaches the ``await``).

        The reader is registered once, at the first wait on ``loop``, and stays
        registered until :meth:`close`: no ``epoll_ctl`` add/remove pair per wait."""
        if self._reader_loop is not loop:
            old = self._reader_loop
            if old is not None and not old.is_closed():
                old.remove_reader(self._fd)  # the socket moved to another loop
            loop.add_reader(self._fd, self._on_readable)
            self._reader_loop = loop
        future: asyncio.Future[bool | None] = loop.create_future()
        self._fd_future = future
        try:
            fired = await future
        finally:
            if self._fd_future is future:
                self._fd_future = None
        self._set_changed()
        return bool(fired)

    def _on_readable(self) -> None:
        """The asyncio reader callback: the fd fired (it stays readable until a socket
        call drains it, and asyncio's epoll is level-triggered).

        With a task waiting on the fd: resolve its future; the task drains the fd
        (reads EVENTS) when it runs. With none: drain it here, by the check any socket
        call owes suspended tasks (:meth:`_after_io`), so the loop does not spin on a
        readable fd while nobody waits, and a task waiting on the shared event that
        can now go on is woken."""
        future = self._fd_future
        if future is not None:
            if not future.done():
                if self._divert is None:
                    future.set_result(True)  # the fd fired: the waiter receives
                elif not self._diverted(True) and not future.done():
                    future.set_result(None)
            return
        if self._socket.closed and not self._closed:
            # closed underneath this object: its fd is gone, drop the reader
            loop, self._reader_loop = self._reader_loop, None
            if loop is not None:
                loop.remove_reader(self._fd)
            return
        self._after_io()

    def _diverted(self, fired: bool = False) -> bool:
        """The reader callback, while a receive with ``divert`` is suspended: hand what
        is queued to ``divert``. True when everything was consumed and the receive may
        stay suspended; False when it must be woken (a message declined, an error,
        the fairness budget spent, the socket closed, or senders to wake).

        ``fired``: called because the fd fired. When the last fires brought a message
        (:attr:`_fires_carry`), the first receive is tried before any EVENTS read: a
        non-blocking receive processes libzmq's pending commands itself, so it finds
        a message that just arrived, and when it finds none it has drained the fd as
        the EVENTS read would have."""
        divert = self._divert
        assert divert is not None
        if not self._recv_waiting or self._pollout_waiters or self._closed:
            return False
        socket, meta, get = self._socket, self._meta, self._get
        probe = fired and self._fires_carry >= _GUESS_TRUSTED
        for i in range(_FAIRNESS_BUDGET):
            if self._closed or self._socket.closed:
                return False
            if not probe and not get(_EVENTS) & _POLLIN:  # drains the fd: a later edge
                if fired and not i:                        # means news
                    self._fire_brought(False)
                return True
            try:
                msg = _recv_frames(socket, meta)
            except zmq.Again:
                if probe:  # this fire brought no message: EVENTS first next time
                    self._fire_brought(False)
                    return True
                continue
            if fired and not i:
                self._fire_brought(True)
            try:
                if not divert(msg):
                    self._diverted_back = msg
                    return False
            except BaseException as exc:  # raised by the suspended receive instead
                self._divert_error = exc
                return False
            if probe:
                # The fire brought its message, as usual. The EVENTS read that tells
                # whether more is queued (and re-arms the fd) runs as the deferred check
                # instead, after the tasks this message woke (a caller whose reply it
                # was): off their path, and shared with the check their next send owes.
                # Until then a later message either fires the fd again or is found by
                # that check.
                loop = self._reader_loop
                if loop is not None and not self._check_queued:
                    self._check_queued = True
                    loop.call_soon(self._deferred_check)
                    return True
            probe = False
        return False

    def _after_send(self) -> None:
        """After a send made while others are suspended: make sure EVENTS is re-read
        for them (:meth:`_after_io`) before they could wait for an edge this send
        swallowed. On asyncio the check is deferred to a callback that runs before the
        loop next waits, so that a burst of sends (a fan-out) costs one check, not one
        per send; inside :meth:`batched_sends` it runs at the block's end."""
        if self._batch:
            self._check_pending = True
            return
        if self._check_queued:
            return
        loop = asyncio._get_running_loop()
        if loop is None:  # trio (or no loop): check now
            self._after_io()
            return
        self._check_queued = True
        loop.call_soon(self._deferred_check)

    def _deferred_check(self) -> None:
        self._check_queued = False
        future = self._fd_future
        if (self._divert is not None and future is not None and not future.done()
                and not self._pollout_waiters):
            if not self._diverted():  # what a send's edge announced, handed to divert
                self._wake()
            return
        self._after_io()

    def _after_io(self) -> None:
        """After a socket call made while others are suspended: wake them if they can go on.

        The call may have drained the fd edge that would have woken them.
        """
        if self._closed:
            return
        events = self._get(_EVENTS)
        if (self._recv_waiting and events & _POLLIN) or (
            self._pollout_waiters and events & _POLLOUT
        ):
            self._wake()

    def _wake(self) -> None:
        """Make every suspended task re-check EVENTS."""
        scope = self._fd_scope
        if scope is _NOTIFY_WAKES:
            assert self._native is not None
            self._native.notify_closing(self._fd)
        elif scope is not None:
            scope.cancel()
        future = self._fd_future
        if future is not None and not future.done():
            future.set_result(None)
        self._set_changed()
        # The receiver is certain to run and re-check EVENTS itself: until it suspends
        # again, later socket calls need not re-read EVENTS on its behalf.
        self._recv_waiting = False

    def _set_changed(self) -> None:
        event = self._changed
        if event is not None:
            self._changed = None
            event.set()

    def _hand_over(self) -> None:
        """Leaving an operation: if others wait but none holds the fd, let one take it."""
        if self._changed is not None and self._fd_scope is None and self._fd_future is None:
            self._set_changed()

    def _raise_unusable(self) -> None:
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        raise SocketClosed(f"{self._type_name} socket is closed")

    def _raise_foreign(self) -> None:
        raise ForeignThreadError(
            f"{self._type_name} socket is owned by thread {self._owner} but was used from "
            f"thread {threading.get_ident()}; libzmq sockets are not thread-safe"
        )
