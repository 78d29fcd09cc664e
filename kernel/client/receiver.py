"""The client's receive loop: frames in, each handed to the request map or the peer table.

:class:`ClientReceiver` is one task of a
:class:`~ctlwire.kernel.client.control_client.ControlClient`: it awaits the
transport's ``receive_many()`` and hands each event on, without awaiting in between:

* a reply to the request map (after the peer table saw its rank), and the
  request's waiters are woken when the reply decided it;
* a heartbeat to the liveness monitor, and what it says about a request in
  flight to that call's ``on_progress`` callbacks;
* a drop (counted by reason) and a disconnection (to the liveness monitor).

Guarantees: an event of a kind the client does not expect is counted
(``dropped_wrong_type``), a reply from a stale incarnation is counted
(``stale_incarnation``), and a bug in a handler is logged without ending the
loop. When the transport closes under the loop, ``on_closed()`` is awaited
(the client closes: pending calls fail ClientClosed) and the loop ends.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ctlwire.kernel.client.call_issuer import CallIssuer
from ctlwire.kernel.core.request_registry import ReplyDisposition
from ctlwire.kernel.liveness_monitor import LivenessMonitor
from ctlwire.transports.envelope import Heartbeat, Reply
from ctlwire.transports.errors import TransportClosed
from ctlwire.transports.transport import ClientTransport, Dropped, PeerDisconnected, Received

__all__ = ["ClientReceiver"]

log = logging.getLogger("ctlwire.client")


class ClientReceiver:
    """Receives a client's frames and hands each on; see the module docstring."""

    def __init__(self, transport: ClientTransport, issuer: CallIssuer,
                 liveness: LivenessMonitor, counters: dict[str, int],
                 on_closed: Callable[[], Awaitable[None]]) -> None:
        self.transport = transport
        self.issuer = issuer
        self.registry = issuer.registry
        self.liveness = liveness
        self.peers = liveness.peers
        self.counters = counters
        self.on_closed = on_closed

    async def run(self) -> None:
        """The receive loop (the client's task): every event queued at a wake-up is
        handed on in order, the loop's clock read once for them."""
        receive_many = self.transport.receive_many
        on_event = self.on_event
        now = self.issuer.now
        while True:
            try:
                events = await receive_many()
            except TransportClosed:
                # the transport closed under us: pending calls fail now, typed
                await self.on_closed()
                return
            received_at = now()
            for event in events:
                try:
                    on_event(event, received_at)
                except Exception:  # pragma: no cover - a bug must not kill the receiver
                    log.exception("ctlwire client: failed to handle %r", event)

    def on_event(self, event: Any, now: float) -> None:
        """Hand one transport event, received at ``now`` (the loop's clock), on
        (never awaits)."""
        if type(event) is Received:
            env = event.envelope
            if type(env) is Reply:
                self.on_reply(env, event.peer, now)
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

    def on_reply(self, reply: Reply, peer: int | None, now: float) -> None:
        rank = reply.rank if peer is None else peer
        if not self.peers.reply_seen(rank, reply.incarnation, now):
            # not the common case (Connected, its admitted incarnation): the general path
            if self.peers.is_stale(rank, reply.incarnation):
                self.counters["stale_incarnation"] += 1
                return
            if not self.liveness.seen(rank, reply.incarnation, authoritative=False):
                return  # an implausible incarnation: refused and counted
            self.peers.finished(rank, reply.id)
        disposition, entry = self.registry.on_reply(reply, peer)
        if disposition is ReplyDisposition.COMPLETED and entry is not None:
            self.issuer.wake(entry)
