"""Which channels authenticate their peers: the one rule that gates pickle.

Unpickling runs code chosen by the sender, so a pickling codec is accepted only
on a socket where **every** peer that can connect is authenticated:

* CURVE with an allow-list (the transport installs the authenticator);
* ``inproc://`` (the same process);
* a filesystem ``ipc://`` socket whose directory is owner-only (``0700``, ours or
  root's): only this user can reach the socket file.

Everything else is refused when the transport is constructed, with
:class:`~ctlwire.transports.errors.PickleRefused` saying why: tcp without CURVE
(loopback too: any local user can connect), abstract ipc (``ipc://@name``, no
file permissions), ``tipc://``, ``ws://``, ``pgm://`` and any other scheme. The
rule is checked for every address of every socket a transport binds or connects,
in both orientations, whether the socket sends or receives (a client that only
receives replies on a PULL still unpickles them).
"""

from __future__ import annotations

from collections.abc import Iterable

from ctlwire.transports.errors import PickleRefused
from ctlwire.transports.ipc_path import directory_problem, ipc_path, is_abstract

__all__ = ["check_pickle_channel", "unauthenticated_reason"]


def unauthenticated_reason(address: str, *, curve: bool) -> str | None:
    """Why a peer reaching ``address`` is not authenticated, or None when every peer is."""
    if address.startswith("inproc://"):
        return None
    path = ipc_path(address)
    if path is not None:
        if is_abstract(path):
            return "an abstract ipc name has no file permissions: any local user can connect"
        why = directory_problem(path, owner_only=True)
        if curve or why is None:
            return None
        return f"the socket's directory is not owner-only ({why})"
    if curve and address.startswith("tcp://"):
        return None
    scheme = address.split("://", 1)[0] if "://" in address else address
    if scheme == "tcp":
        return "tcp without CURVE: any process that can connect is unauthenticated"
    return f"{scheme}:// has no peer authentication ctlwire can check"


def check_pickle_channel(uses_pickle: bool, addresses: Iterable[str], *, curve: bool) -> None:
    """Raise :class:`PickleRefused` when ``uses_pickle`` and any address is a channel
    on which a peer could be unauthenticated."""
    if not uses_pickle:
        return
    for address in addresses:
        why = unauthenticated_reason(address, curve=curve)
        if why is not None:
            raise PickleRefused(
                f"refusing pickle on {address}: {why}. Unpickling runs code chosen by the "
                "peer: use the msgpack codec, CURVE (tcp), inproc, or an ipc socket in a "
                "0700 directory")
