"""A minimal actor runtime on anyio (asyncio and trio).

An :class:`Actor` owns a bounded mailbox (an anyio memory object stream) and
handles one message at a time, in mailbox order, inside a task group that is
tied to its ``async with`` block: no task outlives it.

* :meth:`Actor.tell` — fire and forget; waits when the mailbox is full
  (backpressure). :meth:`Actor.tell_nowait` raises :class:`MailboxFull` instead.
* :meth:`Actor.ask` — the handler's return value, or its exception re-raised in
  the asker, or :class:`~ctlwire.kernel.errors.AskTimeout` after ``timeout``.
  An ask whose asker gave up before it was handled is skipped, not run.
* An exception in a handler never kills the actor; for a ``tell`` it is passed
  to :meth:`Actor.on_tell_error` (counted and logged by default).
* :meth:`Actor.stop` (or leaving the ``async with``) cancels the message being
  handled and fails it and every queued ``ask`` with
  :class:`~ctlwire.kernel.errors.ActorStopped`; later ``tell``/``ask`` raise it.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import Generic, TypeVar

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ctlwire.kernel.errors import ActorStopped, AskTimeout, MailboxFull

__all__ = ["Actor", "MailboxFull"]

M = TypeVar("M")
R = TypeVar("R")
log = logging.getLogger("ctlwire.actor")


class _Slot(Generic[R]):
    __slots__ = ("abandoned", "done", "error", "value")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.value: R | None = None
        self.error: BaseException | None = None
        self.abandoned = False

    def resolve(self, value: R) -> None:
        self.value = value
        self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


class Actor(Generic[M, R]):
    """Subclass and implement :meth:`handle`; use as ``async with actor:``."""

    def __init__(self, *, mailbox_size: int = 64, name: str | None = None) -> None:
        if mailbox_size < 1:
            raise ValueError("mailbox_size must be >= 1")
        self.name = name or type(self).__name__
        self.mailbox_size = mailbox_size
        send, recv = anyio.create_memory_object_stream[tuple[M, "_Slot[R] | None"]](mailbox_size)
        self._send: MemoryObjectSendStream[tuple[M, _Slot[R] | None]] = send
        self._recv: MemoryObjectReceiveStream[tuple[M, _Slot[R] | None]] = recv
        self._tg: TaskGroup | None = None
        self._current: _Slot[R] | None = None
        self._run_scope = anyio.CancelScope()
        self._stopped = False
        self.handled = 0
        self.failed = 0
        self.skipped = 0

    async def handle(self, message: M) -> R:
        """Handle one message; runs one at a time, in mailbox order."""
        raise NotImplementedError

    def on_tell_error(self, message: M, error: Exception) -> None:
        """A ``tell``'s handler raised. Default: log it."""
        log.warning("%s: handler failed for %r: %r", self.name, message, error)

    # -- lifetime ------------------------------------------------------------
    async def __aenter__(self) -> Actor[M, R]:
        if self._tg is not None or self._stopped:
            raise RuntimeError(f"{self.name} was already started")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        tg.start_soon(self._run, name=f"{self.name}.run")
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        self.stop()
        tg, self._tg = self._tg, None
        assert tg is not None
        await tg.__aexit__(None, None, None)
        return None

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def queued(self) -> int:
        return self._recv.statistics().current_buffer_used

    def stop(self) -> None:
        """Stop now: the message in hand and every queued ask fail with ActorStopped."""
        if self._stopped:
            return
        self._stopped = True
        self._send.close()
        if self._current is not None:
            self._current.fail(ActorStopped(f"{self.name} stopped while handling the message"))
            self._current = None
        while True:
            try:
                _, slot = self._recv.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break
            if slot is not None:
                slot.fail(ActorStopped(f"{self.name} stopped before handling the message"))
            else:
                self.skipped += 1
        self._recv.close()
        self._run_scope.cancel()

    async def _run(self) -> None:
        with self._run_scope:
            await self._loop()

    async def _loop(self) -> None:
        recv = self._recv
        while True:
            try:
                message, slot = await recv.receive()
            except (anyio.EndOfStream, anyio.ClosedResourceError):
                return
            if slot is not None and slot.abandoned:
                self.skipped += 1
                continue
            self._current = slot
            try:
                result = await self.handle(message)
            except Exception as exc:
                self.failed += 1
                if slot is not None:
                    slot.fail(exc)
                else:
                    try:
                        self.on_tell_error(message, exc)
                    except Exception:  # pragma: no cover - never let a hook kill the actor
                        log.exception("%s: on_tell_error failed", self.name)
            else:
                self.handled += 1
                if slot is not None:
                    slot.resolve(result)
            finally:
                self._current = None

    # -- sending -------------------------------------------------------------
    def _check(self) -> None:
        if self._stopped:
            raise ActorStopped(f"{self.name} is stopped")

    async def tell(self, message: M) -> None:
        """Queue ``message``; waits while the mailbox is full."""
        self._check()
        try:
            await self._send.send((message, None))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise ActorStopped(f"{self.name} is stopped") from None

    def tell_nowait(self, message: M) -> None:
        """Queue ``message`` or raise MailboxFull / ActorStopped."""
        self._check()
        try:
            self._send.send_nowait((message, None))
        except anyio.WouldBlock:
            raise MailboxFull(f"{self.name}: mailbox of {self.mailbox_size} is full") from None
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise ActorStopped(f"{self.name} is stopped") from None

    async def ask(self, message: M, *, timeout: float | None = None) -> R:
        """The handler's answer; re-raises its exception; AskTimeout after ``timeout``."""
        self._check()
        slot: _Slot[R] = _Slot()
        try:
            with anyio.move_on_after(timeout if timeout is not None else float("inf")):
                try:
                    await self._send.send((message, slot))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    raise ActorStopped(f"{self.name} is stopped") from None
                await slot.done.wait()
        finally:
            if not slot.done.is_set():
                slot.abandoned = True
        if not slot.done.is_set():
            raise AskTimeout(f"{self.name} did not answer within {timeout:g} s")
        if slot.error is not None:
            raise slot.error
        return slot.value  # type: ignore[return-value]

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else ("running" if self._tg else "new")
        return f"<{self.name} {state} queued={self.queued}>"
