"""Network namespaces as separate hosts for the multi-host tests (needs root and iproute2).

:class:`NetnsHosts` makes ``n`` namespaces ``ctlw-e<i>-<pid>-<seq>``, each joined
to the root namespace (where the test's client runs) by its own veth pair with
point-to-point addresses. No bridge, so no kernel module beyond veth::

    root namespace                    namespace ctlw-e0-<pid>-<seq>
    10.77.S.1  cwv0_<pid>_<seq> ===== cwn0_<pid>_<seq>  10.77.S.2   (engine rank 0)
    10.77.S.1  cwv1_<pid>_<seq> ===== cwn1_<pid>_<seq>  10.77.S.3   (engine rank 1)

The client binds ``tcp://10.77.S.1:PORT`` (the same local address on every
link); ``S`` varies with the pid so concurrent runs do not collide.
:meth:`link_down` / :meth:`link_up` cut and restore one engine's link (its
interface inside its namespace). :meth:`destroy` removes everything, is
idempotent and is safe after a partial :meth:`create`; :func:`sweep_stale`
removes what a killed run (its pid gone) left behind.

Run as a script for a manual check: ``python tests/transports/netns_hosts.py`` creates two
hosts, probes tcp from each to the root address, and tears them down.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Sequence
from types import TracebackType

__all__ = [
    "NetnsError",
    "NetnsHosts",
    "net_namespace_id",
    "sweep_stale",
    "tcp_connections",
    "unavailable_reason",
]

_SEQ = itertools.count(1)
_NS_RE = re.compile(r"^ctlw-e\d+-(\d+)-\d+$")
_LINK_RE = re.compile(r"^cwv\d+_(\d+)_\d+$")


class NetnsError(RuntimeError):
    """An ``ip`` command failed."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc


def unavailable_reason() -> str | None:
    """Why namespaces cannot be used here (None when they can): not Linux, not
    root, no ``ip`` (iproute2), or the kernel/container refuses to create one."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if shutil.which("ip") is None:
        return "no `ip` command: install iproute2 (apt-get install -y iproute2)"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"ctlw-probe-{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Delete namespaces and links of earlier runs whose process is gone."""
    removed: list[str] = []
    listing = _ip("netns", "list", check=False).stdout.split("\n")
    for line in listing:
        name = line.split(" ")[0]
        m = _NS_RE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _ip("netns", "del", name, check=False)
            removed.append(name)
    links = _ip("-o", "link", "show", check=False).stdout.split("\n")
    for line in links:
        parts = line.split(": ")
        if len(parts) < 2:
            continue
        name = parts[1].split("@")[0]
        m = _LINK_RE.match(name)
        if m and not _pid_alive(int(m.group(1))):
            _ip("link", "del", name, check=False)
            removed.append(name)
    return removed


class NetnsHosts:
    """``n`` engine hosts (namespaces) linked to the root namespace; see the module."""

    def __init__(self, n: int = 2) -> None:
        pid = os.getpid()
        seq = next(_SEQ)
        tag = f"{pid}_{seq}"  # interface names: 15 characters at most
        self.subnet = f"10.77.{(pid + seq) % 250 + 1}"
        self.root_address = f"{self.subnet}.1"
        self.namespaces = [f"ctlw-e{i}-{pid}-{seq}" for i in range(n)]
        self.root_links = [f"cwv{i}_{tag}" for i in range(n)]
        self.host_links = [f"cwn{i}_{tag}" for i in range(n)]
        self.addresses = [f"{self.subnet}.{i + 2}" for i in range(n)]
        self.created: list[tuple[str, str]] = []  # ("netns"|"link", name), for destroy

    def __enter__(self) -> NetnsHosts:
        try:
            self.create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.destroy()

    def create(self) -> None:
        """Make the namespaces and links; raises NetnsError (call destroy() after)."""
        for i, ns in enumerate(self.namespaces):
            root, host = self.root_links[i], self.host_links[i]
            _ip("netns", "add", ns)
            self.created.append(("netns", ns))
            _ip("link", "add", root, "type", "veth", "peer", "name", host)
            self.created.append(("link", root))
            _ip("link", "set", host, "netns", ns)
            _ip("addr", "add", self.root_address, "peer", self.addresses[i], "dev", root)
            _ip("link", "set", root, "up")
            _ip("-n", ns, "addr", "add", self.addresses[i], "peer", self.root_address,
                "dev", host)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", host, "up")

    def destroy(self) -> None:
        """Remove every link and namespace made so far; never raises."""
        while self.created:
            kind, name = self.created.pop()
            if kind == "link":
                _ip("link", "del", name, check=False)  # deletes its peer too
            else:
                _ip("netns", "del", name, check=False)

    def link_down(self, i: int) -> None:
        """Cut host ``i`` off: its interface goes down (a pulled cable)."""
        _ip("-n", self.namespaces[i], "link", "set", self.host_links[i], "down")

    def link_up(self, i: int) -> None:
        """Plug host ``i`` back in (its address and route come back with the link)."""
        _ip("-n", self.namespaces[i], "link", "set", self.host_links[i], "up")

    def exec_prefix(self, i: int) -> list[str]:
        """The command prefix that runs a program on host ``i``."""
        return ["ip", "netns", "exec", self.namespaces[i]]

    def python_wrapper(self, i: int, directory: str, python: str = sys.executable) -> str:
        """A script that runs ``python`` inside host ``i`` (for EngineFleet's ``python=``).
        ``exec`` all the way down: the engine keeps the wrapper's pid."""
        path = os.path.join(directory, f"python-on-{self.namespaces[i]}")
        with open(path, "w") as f:
            f.write(f'#!/bin/sh\nexec ip netns exec {self.namespaces[i]} "{python}" "$@"\n')
        os.chmod(path, 0o755)
        return path

    def probe_tcp(self, timeout: float = 5.0) -> list[str]:
        """Plain TCP from every host to the root address; returns the failures."""
        failures: list[str] = []
        with socket.socket() as server:
            server.bind((self.root_address, 0))
            server.listen(len(self.namespaces))
            port = server.getsockname()[1]
            code = (f"import socket; socket.create_connection(({self.root_address!r}, {port}), "
                    f"timeout={timeout}).close()")
            for i, ns in enumerate(self.namespaces):
                proc = subprocess.run([*self.exec_prefix(i), sys.executable, "-c", code],
                                      capture_output=True, text=True, timeout=timeout + 10)
                if proc.returncode != 0:
                    failures.append(f"{ns}: {proc.stderr.strip().splitlines()[-1:]}")
        return failures


def net_namespace_id(pid: int | str = "self") -> int:
    """The inode of a process's network namespace (equal inodes: same namespace)."""
    return os.stat(f"/proc/{pid}/ns/net").st_ino


def tcp_connections(pid: int, remote: str, port: int) -> set[int]:
    """Local ports of ``pid``'s network namespace's established tcp connections to
    ``remote:port`` (a new port means the connection was made again)."""
    want = f"{socket.inet_aton(remote)[::-1].hex().upper()}:{port:04X}"
    ports: set[int] = set()
    with open(f"/proc/{pid}/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[2] == want and fields[3] == "01":  # 01: ESTABLISHED
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def main(argv: Sequence[str] | None = None) -> int:
    reason = unavailable_reason()
    if reason:
        print(f"netns unavailable: {reason}")
        return 2
    print("swept stale:", sweep_stale())
    with NetnsHosts(2) as hosts:
        failures = hosts.probe_tcp()
        print(f"hosts {hosts.namespaces} at {hosts.addresses}, root {hosts.root_address}:",
              failures or "tcp ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
