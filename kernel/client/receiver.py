"""The client's receive loop: frames in, each handed to the request map or the peer table.

:class:`ClientReceiver` is one task of a
:class:`~ctlwire.kernel.client.control_client.ControlClient`: it awaits the
transport's ``receive_many()`` and hands each event on, without awaiting in between:

* a reply to the request map (after the peer table saw its rank), and the
  request's waiters are woken when the reply decided it;
* a heartbeat to the liveness monitor, and what it says about a request in
  flight to that call's ``on_progress`` callbacks;
* a drop (counted by reason) and a disconnection (to the liveness monitor).

**Whose turn it is to receive** is the ``ReceiveTurn`` machine
(:mod:`ctlwire.states.receive_turn`), driven through its table. A caller that
waits for the decision of its request (:meth:`ClientReceiver.wait`), to one rank,
the only one in flight, nobody else waiting on it, while no one receives, takes
the turn: it receives itself, handing on every event as the loop would, until
its own request is decided. The reply reaches its caller without waking the loop
first, and a sequential caller keeps the turn from one call to the next. The
loop parks meanwhile and is woken when the caller gives the turn back, to
receive again unless the caller's next call took the turn first. Other callers
wait on their request's waiter. A decision that does not come from the receiving
caller's own events (its deadline, a lost rank, close) ends its receive by
cancelling it, which takes nothing off the transport.

Guarantees: one task receives at a time; every event is handed on by
whoever received it, in order; an event of a kind the client does not expect
is counted (``dropped_wrong_type``), a reply from a stale incarnation is
counted (``stale_incarnation``), and a bug in a handler is logged without
ending the loop. When the transport closes under a receiver, ``on_closed()`` is
awaited (the client closes: pending calls fail ClientClosed) and the loop ends.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel

from ctlwire.kernel.client.liveness_monitor import LivenessMonitor
from ctlwire.kernel.client.progress_callbacks import ProgressCallbacks
from ctlwire.kernel.core.request_registry import PendingRequest, ReplyDisposition, RequestRegistry
from ctlwire.states import RECEIVE_TURN_TABLE, TurnEvent, TurnState
from ctlwire.transports.envelope import Heartbeat, Reply
from ctlwire.transports.errors import TransportClosed
from ctlwire.transports.task_waits import Backend, CancelScope, TaskWaiter
from ctlwire.transports.transport import ClientTransport, Dropped, PeerDisconnected, Received

__all__ = ["ClientReceiver", "waiter_of"]

log = logging.getLogger("ctlwire.client")
_S = TurnState
_E = TurnEvent
_TURN = RECEIVE_TURN_TABLE.apply


def waiter_of(entry: PendingRequest, make: Callable[[], Any]) -> Any:
    """``entry``'s waiter (``set()`` and ``wait()``), made by ``make`` on first use:
    a decision sets the waiter only if one exists, so a caller about to wait
    checks ``entry.is_open`` and calls this without an await in between."""
    waiter = entry.waiter
    if waiter is None:
        waiter = entry.waiter = make()
    return waiter


class _HolderWaiter:
    """The waiter of the request whose caller receives: its decision ends the caller's
    receive, unless the caller is handing on the events that decided it."""

    __slots__ = ("receiver", "scope")

    def __init__(self, receiver: ClientReceiver, scope: CancelScope) -> None:
        self.receiver = receiver
        self.scope = scope

    def set(self) -> None:
        if self.receiver.turn is _S.CALLER:
            self.scope.cancel()


class ClientReceiver:
    """Receives a client's frames and hands each on; see the module docstring.

    ``on_closed()`` is awaited when the transport closes under a receiver.
    """

    def __init__(self, transport: ClientTransport, registry: RequestRegistry,
                 liveness: LivenessMonitor, counters: dict[str, int],
                 on_closed: Callable[[], Awaitable[None]],
                 progress_callbacks: ProgressCallbacks) -> None:
        self.transport = transport
        self.registry = registry
        self.liveness = liveness
        self.peers = liveness.peers
        self.counters = counters
        self.on_closed = on_closed
        self.progress_callbacks = progress_callbacks
        #: the loop's clock and the maker of a caller's waiter (the running loop's,
        #: see :meth:`bind`)
        self.now: Callable[[], float] = anyio.current_time
        self.new_waiter: Callable[[], Any] = anyio.Event
        self.new_scope: Callable[[], CancelScope] = anyio.CancelScope
        #: whose turn it is to receive (the ReceiveTurn machine's state)
        self.turn = _S.IDLE
        #: the request whose caller receives now (None: the loop receives, or no one)
        self.holder: PendingRequest | None = None
        self._parked: TaskWaiter | None = None  # the loop's waiter, while a caller receives
        self._woke: PendingRequest | None = None  # the last request the loop's batch decided
        #: how many calls received their replies themselves (tests read it)
        self.turns = 0

    def bind(self, backend: Backend) -> None:
        """Take the running event loop's clock, waiters and cancel scopes (when the
        client starts)."""
        self.now = backend.clock
        self.new_waiter = backend.new_waiter
        self.new_scope = backend.cancel_scope

    async def run(self) -> None:
        """The receive loop (the client's task): every event queued at a wake-up is
        handed on in order, the loop's clock read once for them. It parks while a
        caller receives (see :meth:`wait`)."""
        receive_many = self.transport.receive_many
        while True:
            if self.turn is not _S.IDLE:  # a caller receives, or the transport closed
                if self.turn is _S.CLOSED:
                    await self.on_closed()
                    return
                parked = self._parked = self.new_waiter()
                await parked.wait()
                continue
            self.turn = _TURN(_S.IDLE, _E.LOOP_RECEIVES)
            try:
                events = await receive_many()
            except TransportClosed:
                # the transport closed under us: pending calls fail now, typed
                self.turn = _TURN(self.turn, _E.TRANSPORT_CLOSED)
                await self.on_closed()
                return
            except BaseException:
                self.turn = _TURN(self.turn, _E.LOOP_RECEIVED)
                raise
            self.turn = _TURN(self.turn, _E.LOOP_RECEIVED)
            self._woke = None
            self._dispatch(events)
            woke = self._woke
            if woke is not None and len(woke.ranks) == 1 and self.registry.live_count == 1:
                # the caller just woken has the only request in flight, to one rank:
                # let it run before this loop waits again, so that its next call may
                # receive for itself (a fan-out's caller never does)
                await anyio.lowlevel.checkpoint()

    def _dispatch(self, events: list[Any]) -> None:
        received_at = self.now()
        on_event = self.on_event
        for event in events:
            try:
                on_event(event, received_at)
            except Exception:  # pragma: no cover - a bug must not kill the receiver
                log.exception("ctlwire client: failed to handle %r", event)

    def wait(self, entry: PendingRequest) -> Awaitable[Any]:
        """Await the result to wait until ``entry`` is decided. Its caller takes the
        turn to receive (see the module docstring) or waits on its waiter. Cancelling
        the caller loses nothing: a cancelled receive took nothing off the
        transport."""
        if (self.turn is _S.IDLE and entry.waiter is None and len(entry.ranks) == 1
                and self.registry.live_count == 1):
            return self._take_turn(entry)
        wait: Awaitable[Any] = waiter_of(entry, self.new_waiter).wait()
        return wait

    async def _take_turn(self, entry: PendingRequest) -> None:
        self.turn = _TURN(self.turn, _E.CALLER_TAKES)
        self.holder = entry
        self.turns += 1
        receive_many = self.transport.receive_many
        scope = self.new_scope()
        entry.waiter = _HolderWaiter(self, scope)  # its decision ends this receive
        try:
            with scope:
                while entry.is_open:
                    try:
                        events = await receive_many()
                    except TransportClosed:
                        self.turn = _TURN(self.turn, _E.TRANSPORT_CLOSED)
                        break
                    self.turn = _TURN(self.turn, _E.CALLER_RECEIVED)
                    self._dispatch(events)
                    self.turn = _TURN(self.turn, _E.CALLER_HANDED_ON)
        finally:
            entry.waiter = None
            self.holder = None
            self.turn = _TURN(self.turn, _E.CALLER_GIVES_BACK)
            parked = self._parked
            if parked is not None:
                self._parked = None
                parked.set()  # the loop receives again (unless a caller is first)
        if entry.is_open:  # the transport closed: the loop closes the client
            await waiter_of(entry, self.new_waiter).wait()

    def on_event(self, event: Any, now: float) -> None:
        """Hand one transport event, received at ``now`` (the loop's clock), on
        (never awaits)."""
        if type(event) is Received:
            env = event.envelope
            if type(env) is Reply:
                rank = env.rank if event.peer is None else event.peer
                if not self.peers.reply_seen(rank, env.incarnation, now):
                    # not the common case (Connected, its admitted incarnation): the general path
                    if self.peers.is_stale(rank, env.incarnation):
                        self.counters["stale_incarnation"] += 1
                        return
                    if not self.liveness.seen(rank, env.incarnation, authoritative=False):
                        return  # an implausible incarnation: refused and counted
                    self.peers.finished(rank, env.id)
                disposition, entry = self.registry.on_reply(env, event.peer)
                if disposition is ReplyDisposition.COMPLETED and entry is not None:
                    entry.wake()
                    self._woke = entry
            elif type(env) is Heartbeat:
                rank = env.rank if event.peer is None else event.peer
                progress = self.liveness.heartbeat(rank, env)
                callbacks = self.progress_callbacks
                if progress is not None and progress.request_id and callbacks:
                    callbacks.dispatch(self.registry, rank, progress)
            else:
                self.counters["dropped_wrong_type"] += 1
        elif type(event) is Dropped:
            key = f"dropped_{event.reason}"
            self.counters[key] = self.counters.get(key, 0) + 1
        elif type(event) is PeerDisconnected and event.rank is not None:
            self.liveness.disconnected(event.rank, event.detail or "disconnected")
