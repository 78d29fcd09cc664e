"""An anyio wrapper around a plain (synchronous) pyzmq socket: one mechanism for asyncio and trio.

libzmq signals readiness through ``zmq.FD``, which is edge-triggered and shared by both
directions: it becomes readable when the socket's command mailbox receives something, and
any call into the socket (``send``, ``recv``, reading ``EVENTS``) may drain it. Only
``EVENTS`` answers "can I receive / send now"; the fd only says "ask again".

The mechanism is pyzmq's ``zmq/_future.py`` one, except that each task does its own
socket call (so a cancelled operation never took or queued a message):

* An operation first makes its non-blocking call. Only when libzmq says ``EAGAIN``
  does the task wait, as a waiter of its direction (receive: ``POLLIN``, send:
  ``POLLOUT``).
* Before waiting it reads ``EVENTS`` (which re-arms the fd's edge) and wakes every
  waiting direction ``EVENTS`` reports ready. So does every task after a socket call
  made while others wait if that call drained the edge that would have woken them:
  if the fd is still readable (a zero-timeout ``poll``, which takes nothing), the
  watcher wakes on it as usual.
* One waiter at a time watches the fd (an interruptible
  :class:`~ctlwire.transports.task_waits.FdWatch`: an event loop allows one waiter per
  fd) that a wake-up of its direction interrupts; the others wait on their
  direction's ``anyio.Event``. When the watcher leaves, for any reason,
  it wakes the others and the first one that still has to wait watches next.
"""

from __future__ import annotations

import contextlib
import select
import threading
from collections.abc import Callable
from typing import Final

import anyio
import anyio.lowlevel
import zmq
import zmq.asyncio

from .errors import ForeignThreadError, SocketClosed
from .task_waits import FdWatch, current_backend
from .zmq_frames import Frames, receiver_for, recv_queued, send_frames, socket_type_name

__all__ = ["AsyncZmqSocket", "ForeignThreadError", "Frames", "SocketClosed"]

_EVENTS: Final = int(zmq.EVENTS)
_POLLIN: Final = int(zmq.POLLIN)
_POLLOUT: Final = int(zmq.POLLOUT)
_NOBLOCK: Final = int(zmq.NOBLOCK)
_NOBLOCK_SNDMORE: Final = int(zmq.NOBLOCK) | int(zmq.SNDMORE)
#: Consecutive operations that completed without suspending before one checkpoint, so
#: that a flood of queued messages cannot starve the event loop or hide cancellation.
_FAIRNESS_BUDGET: Final = 64
#: Back-off of a sender whose peer is full while POLLOUT is set (ROUTER_MANDATORY
#: reports POLLOUT while any peer has room and gives no per-peer signal), seconds.
_RETRY_MIN: Final = 0.001
_RETRY_MAX: Final = 0.05


class _SendBatch:
    """The block of :meth:`AsyncZmqSocket.batched_sends` (one per socket, re-entrant): once
    the outermost of ``depth`` blocks ends, ``recheck()`` if a send inside ``owed`` it."""

    __slots__ = ("depth", "owed", "recheck")

    def __init__(self, recheck: Callable[[], None]) -> None:
        self.depth = 0
        self.owed = False
        self.recheck = recheck

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc_info: object) -> None:
        self.depth -= 1
        if not self.depth and self.owed:
            self.owed = False
            self.recheck()


class AsyncZmqSocket:
    """Awaitable multipart send and receive on one plain ``zmq.Socket``, on asyncio or trio.

    Guarantees:

    * The socket belongs to the thread that created this object; every method raises
      :class:`ForeignThreadError` from another thread (libzmq sockets are not
      thread-safe).
    * Messages are received in the order libzmq hands them out, and a task's successive
      sends reach libzmq in the order it made them. Concurrent senders are not ordered
      relative to each other (a blocked sender does not hold back others).
    * One task at a time may receive (:class:`anyio.BusyResourceError` otherwise); any
      number of tasks of the owner thread may send.
    * A message already queued is returned without suspending, except for one checkpoint
      every 64 consecutive operations that did not suspend (fairness).
    * Cancellation never loses or half-sends a message: a cancelled receive took nothing
      off the socket, a cancelled send queued nothing.
    * Waiting never blocks the event loop and never busy-spins. A send to a full peer of a
      ``ROUTER_MANDATORY`` socket that other peers keep writable re-checks on a back-off
      (1 ms doubling to 50 ms).
    * After :meth:`close`, waiting and new operations raise :class:`SocketClosed`.
    """

    __slots__ = ("_closed", "_events", "_fd", "_fd_poll", "_fd_watch", "_meta", "_owner",
                 "_poller", "_receiving", "_recv", "_send_batch", "_socket", "_streak",
                 "_type_name", "_waiting", "_watch", "_watch_flag")

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
        self._type_name = socket_type_name(socket)
        self._recv = receiver_for(socket)  # how one message is received
        fd = socket.get(zmq.FD)
        assert isinstance(fd, int)
        self._fd = fd
        self._fd_poll = select.poll()  # is the fd readable now (see _after_call)
        self._fd_poll.register(fd, select.POLLIN)
        self._poller: zmq.Poller | None = None  # poll_readable()'s
        self._closed = False
        self._receiving = False
        self._streak = 0  # operations in a row that did not suspend (fairness)
        self._meta: list[str | None] | None = None  # [User-Id of the last message]
        # per direction (POLLIN, POLLOUT): how many tasks wait, and the event that
        # wakes those not watching the fd (made by the first of them)
        self._waiting = {_POLLIN: 0, _POLLOUT: 0}
        self._events: dict[int, anyio.Event | None] = {_POLLIN: None, _POLLOUT: None}
        self._watch: FdWatch | None = None  # the fd watch while a task waits on it
        self._fd_watch: FdWatch | None = None  # made in the event loop, on first use
        self._watch_flag = 0  # ... and its direction
        self._send_batch = _SendBatch(self._after_send)

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

    # ------------------------------------------------------------------------------- receive

    def recv_multipart_nowait(self) -> list[bytes] | None:
        """The next queued message, or None if none is queued. Never suspends.

        :raises ForeignThreadError: if called from a thread other than the owner.
        :raises SocketClosed: if the socket is closed.
        :raises anyio.BusyResourceError: if a task is suspended in :meth:`recv_multipart`.
        """
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        if self._receiving:
            raise anyio.BusyResourceError("receiving from")
        msg: list[bytes] | None = None
        try:
            # EVENTS first, as the FD technique does: a receive that finds nothing
            # costs an EAGAIN exception, a read of EVENTS does not
            if int(self._socket.get(_EVENTS)) & _POLLIN:
                msg = self._recv(self._socket, self._meta)
        except zmq.Again:
            pass
        except zmq.ZMQError as exc:
            raise self._closed_error(exc) from None
        if self._waiting[_POLLOUT]:
            self._after_call()
        return msg

    def recv_many_nowait(self, limit: int) -> list[list[bytes]]:
        """Up to ``limit`` queued messages, in order (empty if none is queued): what
        :meth:`recv_multipart_nowait` returns, called until it returns None, with one
        thread and state check for the batch. Never suspends; raises as it does (a
        closed socket's ``SocketClosed`` only when no message was taken). While
        User-Ids are tracked (:meth:`track_user_id`) it takes at most one message,
        so :attr:`last_user_id` is the sender of every message it returns.
        """
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        if self._receiving:
            raise anyio.BusyResourceError("receiving from")
        if self._meta is not None:
            limit = min(limit, 1)
        out: list[list[bytes]] = []
        try:
            recv_queued(self._socket, self._meta, limit, out, self._recv)
        except zmq.ZMQError as exc:
            if not out:
                raise self._closed_error(exc) from None
        if self._waiting[_POLLOUT]:
            self._after_call()
        return out

    async def recv_multipart(self) -> list[bytes]:
        """Receive the next message, suspending until one arrives.

        :raises ForeignThreadError: if called from a thread other than the owner.
        :raises SocketClosed: if the socket is or gets closed.
        :raises anyio.BusyResourceError: if another task is receiving.
        :raises zmq.ZMQError: what libzmq reports otherwise.
        """
        self._check_usable()
        if self._receiving:
            raise anyio.BusyResourceError("receiving from")
        self._receiving = True
        try:
            await self._fair()
            while True:
                try:
                    msg = self._recv(self._socket, self._meta)
                except zmq.Again:
                    await self._wait(_POLLIN)
                    continue
                if self._waiting[_POLLOUT]:
                    self._after_call()
                return msg
        finally:
            self._receiving = False

    def poll_readable(self, timeout: float) -> bool:
        """Block the calling (owner) thread up to ``timeout`` seconds until a message can
        be received: the wait of a synchronous engine loop, without an event loop.

        :raises ForeignThreadError: if called from a thread other than the owner.
        :raises SocketClosed: if the socket is closed.
        :raises anyio.BusyResourceError: if a task is suspended in :meth:`recv_multipart`.
        """
        self._check_usable()
        if self._receiving:
            raise anyio.BusyResourceError("receiving from")
        poller = self._poller
        if poller is None:  # one for the socket's life, not one per wait
            poller = self._poller = zmq.Poller()
            poller.register(self._socket, zmq.POLLIN)
        return bool(poller.poll(int(timeout * 1000)))

    # ---------------------------------------------------------------------------------- send

    def send_multipart_nowait(self, frames: Frames) -> None:
        """Queue one multipart message in libzmq, or raise. Never suspends.

        :raises zmq.Again: if the high-water mark is reached (nothing was queued).
        :raises zmq.ZMQError: what libzmq reports, e.g. ``EHOSTUNREACH`` from a ROUTER with
            ``ROUTER_MANDATORY`` for an unknown identity.
        :raises ForeignThreadError: if called from a thread other than the owner.
        :raises SocketClosed: if the socket is closed.
        """
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        try:
            send_frames(self._socket, frames)
        except zmq.ZMQError as exc:
            raise self._closed_error(exc) from None
        finally:
            self._after_send()

    def send_pair_nowait(self, first: bytes, second: bytes) -> None:
        """:meth:`send_multipart_nowait` of ``[first, second]`` (both ``bytes``, e.g. a
        ROUTER's ``[identity, data]``) without a frame list; raises as it does."""
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        socket = self._socket
        try:
            socket.send(first, _NOBLOCK_SNDMORE)
            socket.send(second, _NOBLOCK)
        except zmq.ZMQError as exc:
            raise self._closed_error(exc) from None
        finally:
            self._after_send()

    def refresh_events(self) -> int:
        """Read ``EVENTS`` now (libzmq processes its I/O thread's news); wake ready waiters."""
        self._check_usable()
        return self._recheck()

    def _after_send(self) -> None:
        """A send may have taken the fd's edge that would wake the others: re-check for them
        now, or at the end of the batched_sends() block (a woken one re-checks itself)."""
        if self._events[_POLLIN] is not None or self._events[_POLLOUT] is not None or (
                self._watch_flag and self._watch is not None):
            if self._send_batch.depth:
                self._send_batch.owed = True
            elif not (self._closed or self._socket.closed):
                self._after_call()

    def batched_sends(self) -> contextlib.AbstractContextManager[None]:
        """Sends inside the block re-read ``EVENTS`` for suspended tasks once, at its end,
        instead of once per send: a fan-out to many ROUTER peers pays one readiness check
        rather than one per peer. The block must not suspend; blocks may nest.

        :raises ForeignThreadError: if used from a thread other than the owner.
        """
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        return self._send_batch

    async def send_multipart(self, frames: Frames) -> None:
        """Queue one multipart message in libzmq, suspending while the high-water mark is
        reached. Returns once libzmq accepted the message (not once the peer received
        it); when this raises, including on cancellation, nothing was queued.

        :raises zmq.ZMQError: what libzmq reports, e.g. ``EHOSTUNREACH`` (see
            :meth:`send_multipart_nowait`).
        :raises ForeignThreadError: if called from a thread other than the owner.
        :raises SocketClosed: if the socket is or gets closed.
        """
        self._check_usable()
        await self._fair()
        backoff: float | None = None
        while True:
            try:
                self.send_multipart_nowait(frames)
                return
            except zmq.Again:
                pass
            if await self._wait(_POLLOUT, backoff):
                # POLLOUT was set, yet this send failed: its peer is full
                backoff = _RETRY_MIN if backoff is None else min(backoff * 2, _RETRY_MAX)
            else:
                backoff = None

    # --------------------------------------------------------------------------------- close

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
        if self._watch is not None:
            # a task waits on the fd: tell the event loop before libzmq closes it
            with contextlib.suppress(RuntimeError):
                self._watch.close()
        self._wake(_POLLIN)
        self._wake(_POLLOUT)
        self._socket.close(linger=linger_ms)

    # ----------------------------------------------------------------------------- internals

    async def _fair(self) -> None:
        """A checkpoint every ``_FAIRNESS_BUDGET`` operations that did not suspend
        (before the operation: a cancellation there loses nothing)."""
        self._streak += 1
        if self._streak >= _FAIRNESS_BUDGET:
            self._streak = 0
            await anyio.lowlevel.checkpoint()
            if self._closed:
                self._check_usable()

    async def _wait(self, flag: int, backoff: float | None = None) -> bool:
        """Suspend until ``EVENTS`` may show ``flag`` (a wake-up may be spurious: the
        caller retries its call). Returns whether ``EVENTS`` showed ``flag`` already
        before waiting: then it returns at once, or with ``backoff`` after at most that
        many seconds.

        :raises SocketClosed: if the socket is or gets closed.
        """
        self._streak = 0
        ready = bool(self._recheck() & flag)
        if ready and backoff is None:
            return True
        if ready:
            # not counted as waiting: a re-check that sees ``flag`` would wake it at once
            with anyio.move_on_after(backoff):
                await self._park(flag)
        else:
            self._waiting[flag] += 1
            try:
                # the fd also fires for commands that change nothing for ``flag``: ask
                # EVENTS (a plain read: leaving the watch woke the others) and watch again
                while await self._park(flag) and not self._closed and not (
                        int(self._socket.get(_EVENTS)) & flag):
                    pass
            finally:
                self._waiting[flag] -= 1
        if self._closed:
            raise SocketClosed(f"{self._type_name} socket was closed")
        return ready

    async def wait_readable(self) -> None:
        """Suspend until a message may be received (:meth:`recv_multipart_nowait` then
        most likely returns one; a wake-up may be spurious).

        :raises ForeignThreadError: if called from a thread other than the owner.
        :raises SocketClosed: if the socket is or gets closed.
        :raises anyio.BusyResourceError: if another task is receiving.
        """
        self._check_usable()
        if self._receiving:
            raise anyio.BusyResourceError("receiving from")
        self._receiving = True
        try:
            await self._wait(_POLLIN)
        finally:
            self._receiving = False

    def interrupt_wait(self) -> None:
        """Make a :meth:`wait_readable` in progress return now (as a spurious wake-up)."""
        self._wake(_POLLIN)

    async def _park(self, flag: int) -> bool:
        """Wait as the fd watcher if there is none, else on ``flag``'s event. True when
        this task watched the fd and it fired."""
        if self._watch is not None:
            event = self._events[flag]
            if event is None:
                event = self._events[flag] = anyio.Event()
            await event.wait()
            return False
        watch = self._fd_watch
        if watch is None:
            watch = self._fd_watch = current_backend().fd_watch(self._fd)
        self._watch = watch
        self._watch_flag = flag
        try:
            fired = await watch.wait()
        finally:
            self._watch = None
            # hand the watch over: the others (if any) re-check, one of them watches next
            events = self._events
            if events[_POLLIN] is not None:
                self._wake(_POLLIN)
            if events[_POLLOUT] is not None:
                self._wake(_POLLOUT)
        return fired

    def _after_call(self) -> None:
        """After a socket call made while others wait: re-check for them if the call took
        the fd's edge. While the fd is readable, the watcher wakes on it and reads
        ``EVENTS`` itself: reading it here would take that edge and leave a cancelled
        watch to re-park (a reply that arrived during a send, on a busy machine)."""
        if not self._fd_poll.poll(0):
            self._recheck()

    def _recheck(self) -> int:
        """Read ``EVENTS`` (re-arming the fd's edge) and wake each waiting direction it
        reports ready; returns ``EVENTS``."""
        events = int(self._socket.get(_EVENTS))
        if events & _POLLIN and self._waiting[_POLLIN]:
            self._wake(_POLLIN)
        if events & _POLLOUT and self._waiting[_POLLOUT]:
            self._wake(_POLLOUT)
        return events

    def _wake(self, flag: int) -> None:
        """Make the tasks waiting for ``flag`` re-check."""
        event = self._events[flag]
        if event is not None:
            self._events[flag] = None
            event.set()
        watch = self._watch
        if watch is not None and self._watch_flag == flag:
            watch.interrupt()
            self._watch_flag = 0  # cancelled: later wakes until it resumes need not cancel

    def _check_usable(self) -> None:
        if threading.get_ident() != self._owner:
            self._raise_foreign()
        if self._closed or self._socket.closed:
            raise SocketClosed(f"{self._type_name} socket is closed")

    def _closed_error(self, exc: zmq.ZMQError) -> Exception:
        """What a socket call that raised ``exc`` raises: SocketClosed when the socket
        is closed (libzmq's ``ENOTSOCK``), else ``exc`` itself."""
        if exc.errno == zmq.ENOTSOCK:
            return SocketClosed(f"{self._type_name} socket is closed")
        return exc

    def _raise_foreign(self) -> None:
        raise ForeignThreadError(
            f"{self._type_name} socket is owned by thread {self._owner} but was used from "
            f"thread {threading.get_ident()}; libzmq sockets are not thread-safe"
        )
