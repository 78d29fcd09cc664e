"""Free tcp ports for tests of engines that bind (an engine's beacon takes P+1 too)."""

from __future__ import annotations

import socket

__all__ = ["free_tcp_address", "free_tcp_port"]

def free_tcp_port(host: str = "127.0.0.1", *, attempts: int = 64) -> int:
    """A tcp port P on ``host`` such that P *and* P+1 are free right now.

    An engine that binds ``tcp://H:P`` binds its liveness beacon at P+1
    (:func:`~ctlwire.transports.zmq_config.beacon_address_for`), so a test that
    probes only P can collide on P+1 with any other socket on the machine. Both
    ports are held at once while probing; like any free-port probe this races
    other processes, only far more narrowly. Raises :class:`OSError` after
    ``attempts`` tries without a free pair."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(attempts):
        with socket.socket(family) as first:
            first.bind((host, 0))
            port = int(first.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket(family) as second:
                try:
                    second.bind((host, port + 1))
                except OSError:
                    continue
                return port
    raise OSError(f"no two adjacent free tcp ports on {host} after {attempts} tries")


def free_tcp_address(host: str = "127.0.0.1") -> str:
    """``tcp://host:P`` for :func:`free_tcp_port` (IPv6 hosts bracketed)."""
    shown = f"[{host}]" if ":" in host else host
    return f"tcp://{shown}:{free_tcp_port(host)}"
