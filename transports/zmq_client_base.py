"""What the ZeroMQ client transports share: context, options, CURVE, monitors, orderly close.

:class:`_ZmqClientBase` is the base of the ROUTER client
(:class:`~ctlwire.transports.zmq_client.ZmqRouterClientTransport`) and of the
per-rank clients of :mod:`ctlwire.transports.zmq_per_rank_client`.
Closing never hangs: monitors first, then sockets with a bounded linger, then
the authenticator and the context the transport created, then the ipc files it bound.
Closing is cancellation-proof: leaving ``async with`` (or :meth:`aclose`) from a
cancelled scope, or because a sibling task failed, still closes every socket, the
context and the ipc files, on asyncio and trio (the close is synchronous and runs
once the transport's tasks have ended, whatever their task group's exit raises).
"""

from __future__ import annotations

import weakref
from types import TracebackType
from typing import Any

import anyio
import zmq
from anyio.abc import TaskGroup

from ctlwire.transports.codec import Codec, MsgpackCodec
from ctlwire.transports.curve import CurveAuthenticator
from ctlwire.transports.envelope import Envelope, Heartbeat
from ctlwire.transports.errors import ProtocolVersionRefused, TransportClosed
from ctlwire.transports.protocol_version import (
    PROTOCOL_VERSION,
    supported_version,
    version_text,
)
from ctlwire.transports.transport import ClientTransport, Dropped, Received, TransportEvent
from ctlwire.transports.zmq_config import (
    TransportContext,
    ZmqOptions,
    bind_socket,
    make_socket,
    private_ipc_address,
    remove_ipc_file,
)
from ctlwire.transports.zmq_monitor import SocketMonitor
from ctlwire.transports.zmq_socket import AsyncZmqSocket

__all__ = ["_ZmqClientBase"]

#: the most ranks remembered as refused for their protocol version (peers choose ranks)
_REFUSED_LIMIT = 4096


class _ZmqClientBase(ClientTransport):
    """Context, options, CURVE, monitors and orderly close, shared by the clients."""

    def __init__(self, *, codec: Codec | None, options: ZmqOptions | None,
                 context: zmq.Context[zmq.Socket[bytes]] | None) -> None:
        self.codec = codec or MsgpackCodec()
        self.options = options or ZmqOptions()
        self._context = TransportContext(context)
        self._sockets: list[AsyncZmqSocket] = []
        self._raw: list[zmq.Socket[bytes]] = []  # every socket made, closed on close
        self._monitors: list[SocketMonitor] = []
        self._auth: CurveAuthenticator | None = None
        self._tg: TaskGroup | None = None
        self._closed = False
        self._opened = False
        self._bound_ipc: list[str] = []  # ipc files bound at an address the user gave
        #: private ipc address -> its removal (file and directory): on close, else on GC
        self._private_dirs: dict[str, weakref.finalize[Any, Any]] = {}
        self.counters: dict[str, int] = {"sent": 0, "received": 0, "unknown_peer": 0}
        #: rank -> the unsupported protocol version its engine announced (see _versioned)
        self._refused_versions: dict[int, int] = {}

    @property
    def context(self) -> zmq.Context[zmq.Socket[bytes]]:
        """The context the sockets are made in: the one given, else this transport's
        own, made when it opens and terminated when it closes."""
        return self._context.get()

    def _socket(self, kind: int) -> zmq.Socket[bytes]:
        """A socket with the options applied; a ROUTER (the client's own, which its
        engines dial under their rank names) with ``ROUTER_HANDOVER``: an engine that
        comes back takes its identity back at once."""
        sock = make_socket(self.context, kind)
        self._raw.append(sock)
        self.options.apply(sock, self.codec.max_message_size, handover=kind == zmq.ROUTER)
        return sock

    def _wrap(self, sock: zmq.Socket[bytes]) -> AsyncZmqSocket:
        wrapped = AsyncZmqSocket(sock)
        self._sockets.append(wrapped)
        return wrapped

    def _open(self) -> None:
        raise NotImplementedError

    def _start_tasks(self, tg: TaskGroup) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Any:
        if self._opened:
            raise RuntimeError("a transport can be opened once")
        self._opened = True
        try:
            self._open()
        except BaseException:
            self._close_sync()
            raise
        tg = anyio.create_task_group()
        try:
            await tg.__aenter__()
        except BaseException:
            self._close_sync()
            raise
        self._tg = tg
        self._start_tasks(tg)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    @property
    def auth_failures(self) -> int:
        """CURVE handshakes this side lost: a peer refused our key (monitor events)."""
        return sum(m.auth_failures for m in self._monitors)

    async def aclose(self) -> None:
        """Stop this transport's tasks, then close every socket, the context it made
        and its ipc files. The close happens even when the exit of the tasks' group
        raises (a cancelled enclosing scope re-raises its cancellation there, on trio)."""
        tg, self._tg = self._tg, None
        try:
            if tg is not None:
                tg.cancel_scope.cancel()
                await tg.__aexit__(None, None, None)
        finally:
            self._close_sync()

    def _close_sync(self) -> None:
        if self._closed:
            return
        self._closed = True
        for mon in self._monitors:
            mon.close()
        for sock in self._sockets:
            sock.close(self.options.linger_ms)
        for raw in self._raw:  # one a failed bind/connect left unwrapped
            if not raw.closed:
                raw.close(self.options.linger_ms)
        if self._auth is not None:
            self._auth.stop()
        self._context.close()
        for address in self._bound_ipc:
            remove_ipc_file(address)
        for remove in self._private_dirs.values():  # at most once: its GC then runs none
            remove()

    def _private_address(self, name: str) -> str:
        """A fresh ipc address in a private directory, removed when this transport
        closes, or when it is garbage-collected without ever being opened."""
        address = private_ipc_address(name)
        self._private_dirs[address] = weakref.finalize(self, remove_ipc_file, address,
                                                       private_dir=True)
        return address

    def _bind(self, raw: zmq.Socket[bytes], address: str) -> str:
        address = bind_socket(raw, address)
        if address.startswith("ipc://") and address not in self._private_dirs:
            self._bound_ipc.append(address)
        return address

    @property
    def closed(self) -> bool:
        return self._closed

    def _versioned(self, event: TransportEvent) -> TransportEvent:
        """``event``, unless it is a heartbeat announcing a protocol major version this
        side does not speak: then Dropped (``protocol_version``, counted by the
        receiver) and its rank refused (sends raise ProtocolVersionRefused) until a
        heartbeat of the rank announces a supported version."""
        if type(event) is not Received:
            return event
        env = event.envelope
        if type(env) is not Heartbeat:
            return event
        rank = env.rank if event.peer is None else event.peer
        if supported_version(env.version):
            if self._refused_versions:
                self._refused_versions.pop(rank, None)
            return event
        if rank in self._refused_versions or len(self._refused_versions) < _REFUSED_LIMIT:
            self._refused_versions[rank] = env.version
        return Dropped("protocol_version",
                       f"rank {rank} speaks protocol {version_text(env.version)}, this side "
                       f"{version_text(PROTOCOL_VERSION)}", event.size, rank)

    def _check_version(self, rank: int) -> None:
        """Raise ProtocolVersionRefused when ``rank``'s engine announced a protocol
        major version this side does not speak."""
        refused = self._refused_versions.get(rank)
        if refused is not None:
            raise ProtocolVersionRefused(rank, refused, (
                f"its engine speaks protocol {version_text(refused)}, this side "
                f"{version_text(PROTOCOL_VERSION)}"))

    def _encode(self, envelope: Envelope) -> bytes:
        if self._closed:
            raise TransportClosed("transport is closed")
        return self.codec.encode(envelope)
