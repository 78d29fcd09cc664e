"""A bound on the connections one listening ZeroMQ socket holds, with a counted refusal.

libzmq has no option for the most connections a ``tcp://`` or ``ipc://``
listener accepts: every connection is accepted and holds a descriptor (and
buffers) until its peer closes it. Past the process's descriptor limit, accept
fails with ``EMFILE`` and libzmq's listener retries at once, for ever: a new
legitimate client cannot connect, and a core is spent.

:class:`ConnectionGuard` watches the socket's monitor events from a thread of its
own (the monitor is a socket of its own, so the owner's thread is never
involved): ``ACCEPTED`` carries the new connection's descriptor,
``DISCONNECTED``/``CLOSED`` its end. When more than ``max_connections`` are open,
the guard refuses the excess: it shuts the connection down (``shutdown(2)``,
never ``close``: the descriptor stays libzmq's, which sees the peer gone and
closes it as for any peer that leaves) and counts it (:attr:`refused`). Which
ones: first tcp connections that, ``silent_grace`` seconds after being
accepted, have still not sent a whole ZMTP greeting (64 bytes, read from the
kernel's ``TCP_INFO``), oldest first — peers that open connections and say
nothing cannot keep a talking client out; then the newest. A connection that
has spoken is never refused for a newer one.

Guarantees and limits:

* At most ``max_connections`` connections of the socket stay open longer than
  the guard takes to see the event (a burst may briefly exceed it).
* A descriptor is shut down only when its local address is the listener's
  (never a file or another socket of the process); a connection that closed and
  whose number libzmq re-used in the instant between the event and the
  refusal could be the one refused instead: it reconnects like any refused peer.
* Beyond silence, the bound cannot tell a legitimate peer from a hostile one:
  peers that sent a greeting and hold every slot keep a newcomer out until they
  leave (ipc connections have no ``TCP_INFO``: the newest is refused; only this
  user can reach a safe ipc path). Connections that never complete the ZMTP
  handshake leave after ``ZmqOptions.handshake_ivl_ms`` (libzmq's handshake
  timeout); a refused dialer retries on its own.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections import OrderedDict

import zmq
from zmq.utils.monitor import parse_monitor_message

__all__ = ["ConnectionBound", "ConnectionGuard"]

#: a ZMTP 3 greeting: a peer that has not sent this much has not begun to talk
_GREETING_BYTES = 64
#: struct tcp_info (Linux): where tcpi_bytes_received is, and the size asked for
_TCPI_BYTES_RECEIVED = 128
_TCP_INFO_SIZE = 232

_WATCHED = (zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
            | zmq.EVENT_MONITOR_STOPPED)


def _local_address(endpoint: str) -> tuple[str, object] | None:
    """(family, address) a connection accepted on ``endpoint`` has as its local
    address, for the families a listener can have; None for others."""
    if endpoint.startswith("tcp://"):
        port = endpoint[len("tcp://"):].rpartition(":")[2]
        return ("tcp", int(port)) if port.isdigit() else None
    if endpoint.startswith("ipc://"):
        return ("ipc", endpoint[len("ipc://"):])
    return None


class ConnectionBound:
    """The bookkeeping and the refusal policy, fed with a listening socket's monitor
    events by whoever reads them (:class:`ConnectionGuard`'s thread, or a
    transport's own monitor task): :meth:`note` each event, then
    :meth:`refuse_excess`. Thread-safe."""

    def __init__(self, max_connections: int, *, silent_grace: float = 1.0) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self.max_connections = max_connections
        self.silent_grace = silent_grace
        self._lock = threading.Lock()
        # descriptor -> (the listener's endpoint, time.monotonic() when accepted),
        # oldest first; refused ones until libzmq reports them closed are in _closing
        self._open: OrderedDict[int, tuple[str, float]] = OrderedDict()
        self._closing: set[int] = set()
        #: connections accepted so far
        self.accepted = 0
        #: connections refused because ``max_connections`` were open
        self.refused = 0
        #: the most connections open at once (refused ones included until they closed)
        self.peak = 0

    @property
    def open_connections(self) -> int:
        """Connections open now, as the monitor last reported them (refused ones not
        counted)."""
        with self._lock:
            return len(self._open) - len(self._closing)

    def note(self, event: int, fd: int, endpoint: str) -> None:
        """Apply one monitor event (``ACCEPTED``, ``DISCONNECTED`` or ``CLOSED``, whose
        value is the descriptor; others are ignored)."""
        with self._lock:
            if event == zmq.EVENT_ACCEPTED:
                self.accepted += 1
                self._closing.discard(fd)  # a number libzmq re-used
                self._open.pop(fd, None)
                self._open[fd] = (endpoint, time.monotonic())
                self.peak = max(self.peak, len(self._open))
            elif event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CLOSED):
                self._open.pop(fd, None)
                self._closing.discard(fd)

    def refuse_excess(self) -> int:
        """Refuse connections while more than ``max_connections`` are open (see the
        module docstring for which); how many were refused now."""
        with self._lock:
            excess = len(self._open) - len(self._closing) - self.max_connections
            if excess <= 0:
                return 0
            # libzmq drops monitor events when the monitor falls behind: forget
            # descriptors that are no longer connections of this listener first
            for fd in [fd for fd, (where, _) in self._open.items() if not _is_ours(fd, where)]:
                del self._open[fd]
                self._closing.discard(fd)
            live = [fd for fd in self._open if fd not in self._closing]
            excess = len(live) - self.max_connections
            if excess <= 0:
                return 0
            old = time.monotonic() - self.silent_grace
            silent = [fd for fd in live if self._open[fd][1] <= old and _silent(fd)]
            chosen = silent[:excess]
            if len(chosen) < excess:
                taken = set(chosen)
                chosen += [fd for fd in reversed(live) if fd not in taken][:excess - len(chosen)]
            refused = 0
            for fd in chosen:
                if _shut_down(fd, self._open[fd][0]):
                    self._closing.add(fd)
                    refused += 1
                else:  # not a connection of this listener any more
                    del self._open[fd]
            self.refused += refused
            return refused


class ConnectionGuard:
    """Refuses (shuts down, counts) connections of one bound socket beyond
    ``max_connections``: a :class:`ConnectionBound` fed by the socket's monitor
    from a thread of its own; see the module docstring. Start and stop it from
    the thread that owns the socket; stop it before closing the socket."""

    def __init__(self, sock: zmq.Socket[bytes], max_connections: int, *,
                 silent_grace: float = 1.0, name: str = "ctlwire-connection-guard") -> None:
        self.bound = ConnectionBound(max_connections, silent_grace=silent_grace)
        self._target = sock
        self._name = name
        self._monitor: zmq.Socket[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def refused(self) -> int:
        return self.bound.refused

    @property
    def open_connections(self) -> int:
        return self.bound.open_connections

    def start(self) -> None:
        """Start watching (idempotent)."""
        if self._thread is not None:
            return
        self._monitor = self._target.get_monitor_socket(_WATCHED)
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Stop watching; the guard's thread closes its monitor socket before this
        returns (so the context can be terminated)."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        with contextlib.suppress(zmq.ZMQError):
            if not self._target.closed:
                self._target.disable_monitor()
        thread.join(timeout)
        self._thread = None

    def _run(self) -> None:
        monitor = self._monitor
        assert monitor is not None
        bound = self.bound
        try:
            while not self._stop.is_set():
                if not monitor.poll(50):
                    continue
                # every event queued now, then the refusals: the set of open
                # connections is as recent as it can be when one is shut down
                while True:
                    try:
                        msg = monitor.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    parsed = parse_monitor_message(msg)
                    event = int(parsed["event"])
                    if event == zmq.EVENT_MONITOR_STOPPED:
                        return
                    where = parsed["endpoint"]
                    bound.note(event, int(parsed["value"]),
                               where.decode(errors="replace") if isinstance(where, bytes)
                               else str(where))
                bound.refuse_excess()
        except zmq.ZMQError:
            return  # the context is going away
        finally:
            monitor.close(0)


def _silent(fd: int) -> bool:
    """Whether tcp connection ``fd`` has received less than a ZMTP greeting (False
    where the kernel does not say: not tcp, or an older ``TCP_INFO``)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return False
    try:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return False
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_SIZE)
        if len(info) < _TCPI_BYTES_RECEIVED + 8:
            return False
        received: int = struct.unpack_from("=Q", info, _TCPI_BYTES_RECEIVED)[0]
        return received < _GREETING_BYTES
    except OSError:
        return False
    finally:
        sock.detach()


def _shut_down(fd: int, endpoint: str) -> bool:
    """Shut down the connection on descriptor ``fd`` if it is one accepted on
    ``endpoint``; the descriptor stays open (libzmq closes it). False when ``fd``
    is not such a connection."""
    return _is_ours(fd, endpoint, shut_down=True)


def _is_ours(fd: int, endpoint: str, *, shut_down: bool = False) -> bool:
    """Whether descriptor ``fd`` is a connection accepted on ``endpoint`` (its local
    address is the listener's); ``shut_down``: then shut it down too. The
    descriptor is never closed."""
    expected = _local_address(endpoint)
    if expected is None:
        return False
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return False
    try:
        local = sock.getsockname()
        family, where = expected
        if family == "tcp":
            ok = (sock.family in (socket.AF_INET, socket.AF_INET6)
                  and isinstance(local, tuple) and local[1] == where)
        else:
            path = local.decode(errors="replace") if isinstance(local, bytes) else local
            ok = sock.family == socket.AF_UNIX and path == where
        # never the listener itself (a re-bind could re-use a stale number)
        ok = ok and not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        if ok and shut_down:
            sock.shutdown(socket.SHUT_RDWR)
        return ok
    except OSError:
        return False
    finally:
        sock.detach()  # never close: the descriptor is libzmq's
