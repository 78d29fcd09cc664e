"""The client's receive loop: frames in, each handed to the request map or the peer table.

:class:`ClientReceiver` is one task of a
:class:`~ctlwire.kernel.client.control_client.ControlClient`: it awaits the
transport's ``receive_many()`` and hands each event on, without awaiting in between:

* a reply to the request map (after the peer table saw its rank), and the
  request's waiters are woken when the reply decided it;
* a heartbeat to the liveness monitor, and what it says about a request in
  flight to that call's ``on_progress`` callbacks;
* a drop (counted by reason) and a disconnection (to the liveness monitor).

**Whose turn it is to receive.** A caller of one rank that waits for its
decision (:meth:`ClientReceiver.wait`) while no one receives and no other
request is in flight receives itself, handing on every event as the loop would, until its own
request is decided: the reply reaches its caller without waking the loop
first, and a sequential caller keeps the turn from one call to the next. The
loop parks meanwhile and is woken when the caller is done (off the reply's
path), to receive again unless the caller's next call took the turn first.
Callers that wait while someone receives, and fan-outs (whose replies come in
bursts the loop hands on at once), wait on their request's waiter. A
decision that does not come from the receiving caller's own events (its
deadline, a lost rank, close) ends its receive by cancelling it, which takes
nothing off the transport.

Guarantees: one task receives at a time; every event is handed on by
whoever received it, in order; an event of a kind the client does not expect
is counted (``dropped_wrong_type``), a reply from a stale incarnation is
counted (``stale_incarnation``), and a bug in a handler is logged without
ending the loop. When the transport closes under the loop, ``on_closed()`` is
awaited (the client closes: pending calls fail ClientClosed) and the loop ends.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel

from ctlwire.kernel.client.call_issuer import CallIssuer
from ctlwire.kernel.client.waiting import waiter_of
from ctlwire.kernel.core.request_registry import PendingRequest, ReplyDisposition
from ctlwire.kernel.liveness_monitor import LivenessMonitor
from ctlwire.transports.envelope import Heartbeat, Reply
from ctlwire.transports.errors import TransportClosed
from ctlwire.transports.transport import (
    ClientTransport,
    Dropped,
    PeerDisconnected,
    Received,
)

__all__ = ["ClientReceiver"]

log = logging.getLogger("ctlwire.client")


class ClientReceiver:
    """Receives a client's frames and hands each on; see the module docstring."""

    def __init__(self, transport: ClientTransport, issuer: CallIssuer,
                 liveness: LivenessMonitor, counters: dict[str, int],
                 on_closed: Callable[[], Awaitable[None]]) -> None:
        self.transport = transport
        self.receive_many = transport.receive_many
        self.issuer = issuer
        self.registry = issuer.registry
        self.liveness = liveness
        self.peers = liveness.peers
        self.counters = counters
        self.on_closed = on_closed
        #: the request whose caller receives now (None: the loop receives, or no one)
        self.holder: PendingRequest | None = None
        self._holder_scope: anyio.CancelScope | None = None  # ends the holder's receive
        self._holder_dispatching = False  # the holder hands events on (its own wake-ups)
        self._loop_receiving = False
        self._parked: anyio.Event | None = None  # the loop's, while a caller receives
        self._woken = 0  # callers woken by the loop's current batch
        self._one_rank = False  # ... the last of them waited for one rank
        self._closed = False  # a holder saw the transport close
        #: how many calls received their replies themselves (tests read it)
        self.turns = 0

    async def run(self) -> None:
        """The receive loop (the client's task): every event queued at a wake-up is
        handed on in order, the loop's clock read once for them. It parks while a
        caller receives (see :meth:`wait`)."""
        receive_many = self.receive_many
        dispatch = self._dispatch
        while True:
            if self.holder is not None:
                parked = self._parked = anyio.Event()
                await parked.wait()
                continue
            self._loop_receiving = True
            try:
                events = await receive_many()
            except TransportClosed:
                # the transport closed under us: pending calls fail now, typed
                await self.on_closed()
                return
            finally:
                self._loop_receiving = False
            self._woken = 0
            dispatch(events)
            if self._woken == 1 and self.registry.live_count == 1 and self._one_rank:
                # the caller just woken has the only request in flight, to one rank:
                # let it run before this loop waits again, so that its next call may
                # receive for itself (a fan-out's caller never does)
                await anyio.lowlevel.checkpoint()

    def _dispatch(self, events: list[Any]) -> None:
        received_at = self.issuer.now()
        on_event = self.on_event
        for event in events:
            try:
                on_event(event, received_at)
            except Exception:  # pragma: no cover - a bug must not kill the receiver
                log.exception("ctlwire client: failed to handle %r", event)

    def wait(self, entry: PendingRequest) -> Awaitable[Any]:
        """Await the result to wait until ``entry`` is decided (its waiter set). A
        caller whose request (to one rank) is the only one in flight, while the loop
        does not receive, receives itself, for everyone, until its own request is decided:
        its reply reaches it without a wake-up of the loop in between. Others wait
        on their waiters. Cancelling the caller loses nothing: a cancelled receive
        took nothing off the transport."""
        if (self.holder is None and not self._loop_receiving and not self._closed
                and len(entry.ranks) == 1 and self.registry.live_count == 1):
            return self._take_turn(entry)
        waiter: Any = entry.waiter
        if waiter is None:
            waiter = entry.waiter = self.issuer.new_waiter()
        wait: Awaitable[Any] = waiter.wait()
        return wait

    async def _take_turn(self, entry: PendingRequest) -> None:
        self.holder = entry
        self.turns += 1
        try:
            await self._receive_for(entry)
        finally:
            self.holder = None
            parked = self._parked
            if parked is not None:
                self._parked = None
                parked.set()  # the loop receives again (unless a caller is first)
        if entry.is_open:  # the transport closed: the loop closes the client
            await waiter_of(entry, self.issuer.new_waiter).wait()

    async def _receive_for(self, entry: PendingRequest) -> None:
        receive_many = self.receive_many
        scope = self._holder_scope = anyio.CancelScope()
        try:
            with scope:
                while entry.is_open:
                    try:
                        events = await receive_many()
                    except TransportClosed:
                        self._closed = True
                        return
                    self._holder_dispatching = True
                    try:
                        self._dispatch(events)
                    finally:
                        self._holder_dispatching = False
        finally:
            self._holder_scope = None

    def decided(self, entry: PendingRequest) -> None:
        """``entry`` was decided: if its caller receives (and this is not its own
        dispatch), its receive ends."""
        if entry is self.holder and not self._holder_dispatching:
            scope = self._holder_scope
            if scope is not None:
                scope.cancel()

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
                    self.issuer.wake(entry)
                    self._woken += 1
                    self._one_rank = len(entry.ranks) == 1
            elif type(env) is Heartbeat:
                rank = env.rank if event.peer is None else event.peer
                progress = self.liveness.heartbeat(rank, env)
                callbacks = self.issuer.progress_callbacks
                if progress is not None and progress.request_id and callbacks:
                    callbacks.dispatch(self.registry, rank, progress)
            else:
                self.counters["dropped_wrong_type"] += 1
        elif type(event) is Dropped:
            key = f"dropped_{event.reason}"
            self.counters[key] = self.counters.get(key, 0) + 1
        elif type(event) is PeerDisconnected and event.rank is not None:
            self.liveness.disconnected(event.rank, event.detail or "disconnected")
