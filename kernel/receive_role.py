"""Which task receives from a client's transport on trio: its receive loop, or a caller.

On asyncio a reply is handled in the event loop's reader callback and its caller
runs next. On trio only a task can wait on a socket: the client's receive loop
takes a reply, wakes its caller, and the caller runs one scheduler pass and one
task step later; the receive loop then yields and waits again, and each of
those steps costs trio about twice what it costs asyncio. :class:`ReceiveRole`
lets a caller of ``ControlClient.call`` that waits for its reply receive for
itself instead, so that its reply reaches it straight from the socket::

    role = ReceiveRole(transport, handle_reply, on_event, on_closed, quiet)
    tg.start_soon(role.run_loop)          # the client's receive loop
    ...
    entry = core.register(role.new_waiter())
    ...                                   # send
    await role.wait(entry)                # decided: a reply, expiry, loss, close

Guarantees:

* **One receiver at a time.** The role is held by the receive loop or by one
  caller; only its holder receives (the transport would raise
  ``BusyResourceError`` otherwise).
* **Nothing left unread.** Whatever the holder receives is handled as the
  receive loop would handle it (replies for any caller, heartbeats,
  disconnections, drops). A caller gives the role back, or on to another
  waiting caller, as soon as its own request is decided, whatever decided it
  (its reply, the deadline reaper, a lost rank, close), and when it is
  cancelled. Given back while another request is open or another caller
  waits, the receive loop runs next. Given back while nothing else awaits a
  reply (``quiet(entry)`` is true, no other caller waits), the receive loop is woken
  at the latest :attr:`ReceiveRole.GIVE_BACK_DELAY` later, unless a caller
  takes the role first (a sequential caller's next call): heartbeats and
  disconnections wait that long at most, and a sequential caller's calls do
  not wake the receive loop once each.
* **Handed over only at a message boundary, to a caller that is alone.** The
  receive loop passes the role to a waiting caller before it takes its next
  message or before it would wait for one, never in the middle of one, and
  only while that caller is the only one waiting (with more, the receive loop
  takes their replies in batches). A caller waiting while the receive loop
  waits on the socket is answered by the receive loop, as without the role.
* A caller's wait ends when its request is decided, as ``waiter.wait()`` does.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ctlwire.kernel.core.request_registry import PendingRequest
from ctlwire.kernel.loop_native import TrioTaskWaiter, event_loop_clock
from ctlwire.transports.errors import TransportClosed
from ctlwire.transports.transport import TransportEvent

__all__ = ["ReceiveRole", "RoleWaiter"]

log = logging.getLogger("ctlwire.client")


class RoleWaiter(TrioTaskWaiter):
    """The waiter of one :meth:`ReceiveRole.wait` caller: ``set()`` (its request is
    decided) also takes it off the role's candidates and, while it receives,
    interrupts its receive; ``wake()`` (no flag) wakes it to take the role."""

    __slots__ = ("receiving", "role")

    def __init__(self, role: ReceiveRole) -> None:
        super().__init__()
        self.role = role
        self.receiving = False

    def set(self) -> None:
        if self._flag:
            return
        self._flag = True
        role = self.role
        role.candidates.pop(self, None)
        if self.receiving:
            role.transport.interrupt_receive()  # its receive returns: it is decided
        self.wake()


class ReceiveRole:
    """Who receives from ``transport`` (trio); see the module docstring.

    ``handle(event)`` handles a reply where it is received (True) or declines the
    event; ``on_event(event)`` handles a declined one; ``on_closed()`` runs in
    the receive loop when the transport closed under it; ``quiet(entry)`` is
    true when no request but ``entry``, whose caller gives the role back, awaits
    a reply (None: never). The transport must have ``receive_or_handle(handle, until)``
    and ``interrupt_receive()``.
    """

    #: how long (s) the receive loop may stay parked after a caller gave the role
    #: back while nothing else awaited a reply
    GIVE_BACK_DELAY = 0.01

    def __init__(self, transport: Any, handle: Callable[[TransportEvent], bool],
                 on_event: Callable[[TransportEvent], None],
                 on_closed: Callable[[], Awaitable[None]],
                 quiet: Callable[[PendingRequest], bool] | None = None) -> None:
        self.transport = transport
        self._handle = handle
        self._on_event = on_event
        self._on_closed = on_closed
        self._quiet = quiet
        #: the cancel scope the receive loop parks in (None: it is not parked); its
        #: deadline is armed when the role is given back without waking the loop
        self._park_scope: Any = None
        self._clock: Callable[[], float] = time.monotonic  # the run's clock, in run_loop
        #: the caller holding the role (None: the receive loop)
        self.holder: RoleWaiter | None = None
        #: callers waiting for an open request, oldest first (a set one is removed)
        self.candidates: dict[RoleWaiter, PendingRequest] = {}
        self._loop_receiving = False
        self._loop_parking = TrioTaskWaiter()  # where the receive loop parks
        #: callers in :meth:`wait` (the holder among them): the role goes to a caller
        #: only while it is the only one (with more, the receive loop takes their
        #: replies in batches, as a passing role would not)
        self._waiting = 0
        #: how many times the role went to a caller (tests read it)
        self.handed = 0
        #: how many times it was given back without waking the receive loop
        self.given_back_quietly = 0

    def new_waiter(self) -> RoleWaiter:
        return RoleWaiter(self)

    # -- the receive loop -----------------------------------------------------------
    async def run_loop(self) -> None:
        """The client's receive loop: receive and handle while no caller holds the
        role; hand it to a caller waiting alone, at a message boundary."""
        import trio

        new_scope = trio.CancelScope
        self._clock = event_loop_clock()
        receive = self.transport.receive_or_handle
        handle, wanted = self._handle, self._wanted
        parking = self._loop_parking
        while True:
            if self.holder is not None:
                # until a holder gives the role back: woken, or at the deadline armed
                # by a quiet give-back
                with new_scope() as scope:
                    self._park_scope = scope
                    try:
                        await parking.park()
                    finally:
                        self._park_scope = None
                continue
            self._loop_receiving = True
            try:
                event = await receive(handle, wanted)
            except TransportClosed:
                await self._on_closed()  # pending calls fail now, typed
                return
            finally:
                self._loop_receiving = False
            if event is None:
                self._pass_on()
                continue
            self._dispatch(event)

    def _wanted(self) -> bool:
        return self._waiting == 1 and bool(self.candidates)

    def _pass_on(self) -> None:
        """The role is free: to the one caller waiting, if it is alone, else to the
        receive loop."""
        waiter = next(iter(self.candidates), None) if self._waiting == 1 else None
        self.holder = waiter
        if waiter is None:
            self._loop_parking.wake()
            return
        del self.candidates[waiter]
        self.handed += 1
        waiter.wake()  # it holds the role now

    def _dispatch(self, event: TransportEvent) -> None:
        try:
            self._on_event(event)
        except Exception:  # pragma: no cover - a bug must not kill the receiver
            log.exception("ctlwire client: failed to handle %r", event)

    # -- a caller ---------------------------------------------------------------------
    async def wait(self, entry: PendingRequest) -> None:
        """Wait until ``entry`` (whose waiter is a :class:`RoleWaiter` of this role) is
        decided, receiving for it (and for everyone) while this task holds the role."""
        waiter = entry.waiter
        assert isinstance(waiter, RoleWaiter)
        self._waiting += 1
        try:
            if self.holder is None and not self._loop_receiving and self._waiting == 1:
                self.holder = waiter  # the receive loop is parked, or will see it
                self.handed += 1
            elif entry.is_open:
                self.candidates[waiter] = entry
                if self._loop_receiving and self._wanted():
                    self.transport.interrupt_receive()  # the loop's receive asks again
                await waiter.wait()  # decided, or handed the role
            if self.holder is waiter:
                await self._receive_for(entry, waiter)
            elif entry.is_open:  # pragma: no cover - woken for neither
                await waiter.wait()
        finally:
            self._waiting -= 1
            self.candidates.pop(waiter, None)
            if self.holder is waiter:
                if self._waiting or self._quiet is None or not self._quiet(entry):
                    self._pass_on()
                else:
                    self._give_back_quietly()

    def _give_back_quietly(self) -> None:
        """The role is free and nothing awaits a reply: leave the receive loop
        parked for at most :attr:`GIVE_BACK_DELAY` (a caller may take the role
        back first), instead of waking it now."""
        self.holder = None
        scope = self._park_scope
        if scope is None or not self._loop_parking.parked:
            self._loop_parking.wake()  # not parked: it will find the role free
            return
        if scope.deadline == math.inf:
            scope.deadline = self._clock() + self.GIVE_BACK_DELAY
        self.given_back_quietly += 1

    async def _receive_for(self, entry: PendingRequest, waiter: RoleWaiter) -> None:
        receive = self.transport.receive_or_handle
        handle = self._handle

        def decided() -> bool:
            return not entry.is_open

        while entry.is_open:
            waiter.receiving = True
            try:
                event = await receive(handle, decided)
            except TransportClosed:
                # the receive loop closes the client, which decides this request
                waiter.receiving = False  # before the wait below, not after it
                self._pass_on()
                await waiter.wait()
                return
            finally:
                waiter.receiving = False
            if event is None:
                return
            self._dispatch(event)
