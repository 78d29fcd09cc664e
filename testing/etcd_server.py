"""etcd on free loopback ports, its data in a folder of its own (tests, and
``ctlwire demo --membership etcd``): one member (:class:`EtcdServer`) or a
cluster of several (:class:`EtcdCluster`). Each member can be stopped, killed,
frozen (SIGSTOP), thawed and started again on its data. Needs the ``etcd``
binary (Debian: ``etcd-server``) and ``httpx`` (the ``etcd`` extra)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ctlwire.testing._ports import free_tcp_port

__all__ = ["EtcdCluster", "EtcdServer", "etcd_binary", "memory_dir"]


def etcd_binary() -> str | None:
    """The path of the ``etcd`` binary on PATH, or None."""
    return shutil.which("etcd")


def memory_dir(prefix: str = "ctlwire-etcd-") -> Path:
    """A new folder in memory where there is a writable tmpfs (etcd syncs every
    write to disk), else in the system's temp folder. The caller removes it."""
    shm = "/dev/shm"
    where = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=where))


def _answers(endpoint: str, timeout: float = 1.0) -> bool:
    """Whether the member at ``endpoint`` answers a linearizable range request."""
    import httpx

    try:
        return httpx.post(f"{endpoint}/v3/kv/range", json={"key": "eA=="},
                          timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


class EtcdServer:
    """One etcd member on loopback ports, its data in ``data_dir``; restartable.
    :meth:`start` returns once the member answers a range request (RuntimeError
    after ``start_timeout`` s, the member stopped); :meth:`stop` terminates it
    (SIGKILL after 10 s) and reaps it. Its log goes to ``data_dir/etcd.log``.
    Alone by default; :class:`EtcdCluster` makes members of one cluster."""

    def __init__(self, data_dir: Path, *, binary: str | None = None,
                 start_timeout: float = 30.0, name: str = "default",
                 extra_args: Sequence[str] = ()) -> None:
        found = binary or etcd_binary()
        if found is None:
            raise FileNotFoundError("the etcd binary is not installed "
                                    "(Debian: apt-get install etcd-server)")
        self.binary = found
        self.data_dir = data_dir
        self.start_timeout = start_timeout
        self.name = name
        self.extra_args = list(extra_args)
        self.client_port = free_tcp_port()
        self.peer_port = free_tcp_port()
        self.endpoint = f"http://127.0.0.1:{self.client_port}"
        self.peer_url = f"http://127.0.0.1:{self.peer_port}"
        #: ``name=peer-url`` of every member (set by a cluster)
        self.initial_cluster = f"{name}={self.peer_url}"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def launch(self) -> None:
        """Start the process, without waiting for it to answer."""
        with open(self.data_dir / "etcd.log", "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--name", self.name, "--data-dir", str(self.data_dir / "data"),
                 "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
                 "--listen-peer-urls", self.peer_url,
                 "--initial-advertise-peer-urls", self.peer_url,
                 "--initial-cluster", self.initial_cluster, *self.extra_args],
                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)

    def wait_answering(self) -> None:
        """Until the member answers (RuntimeError after ``start_timeout``, stopped)."""
        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            if _answers(self.endpoint):
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"etcd did not start within {self.start_timeout:g} s "
                           f"(its log: {self.data_dir / 'etcd.log'})")

    def start(self) -> None:
        self.launch()
        self.wait_answering()

    def freeze(self) -> None:
        """SIGSTOP: the process holds its sockets and answers nothing."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, reaped: no clean shutdown."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGCONT)  # a frozen one cannot act on SIGTERM
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


class EtcdCluster:
    """``size`` etcd members forming one cluster on loopback ports, each with its data
    in a folder of its own under ``data_dir``. :meth:`start` returns once every
    member answers; ``endpoints`` is the list of their client URLs (a client
    follows the cluster through it); :meth:`leader` finds the leader's index."""

    def __init__(self, data_dir: Path, size: int = 3, *, binary: str | None = None,
                 start_timeout: float = 30.0, extra_args: Sequence[str] = ()) -> None:
        if size < 1:
            raise ValueError("size must be >= 1")
        self.data_dir = data_dir
        self.members: list[EtcdServer] = []
        for i in range(size):
            folder = data_dir / f"member-{i}"
            folder.mkdir(parents=True, exist_ok=True)
            self.members.append(EtcdServer(
                folder, binary=binary, start_timeout=start_timeout, name=f"m{i}",
                extra_args=["--initial-cluster-token", f"ctlwire-{data_dir.name}",
                            *extra_args]))
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.initial_cluster = initial
        self.endpoints = [m.endpoint for m in self.members]

    def start(self) -> None:
        for m in self.members:  # each waits for the others to form a quorum
            m.launch()
        try:
            for m in self.members:
                m.wait_answering()
        except RuntimeError:
            self.stop()
            raise

    def leader(self, timeout: float = 10.0) -> int:
        """The index of the member that is the leader (RuntimeError when no member
        names a leader within ``timeout`` s)."""
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, m in enumerate(self.members):
                if m.proc is None:
                    continue
                try:
                    status = httpx.post(f"{m.endpoint}/v3/maintenance/status", json={},
                                        timeout=1.0).json()
                except (httpx.HTTPError, ValueError):
                    continue
                header = status.get("header", {}) if isinstance(status, dict) else {}
                if status.get("leader") and status.get("leader") == header.get("member_id"):
                    return i
            time.sleep(0.05)
        raise RuntimeError(f"no etcd member is the leader within {timeout:g} s")

    def stop(self) -> None:
        for m in self.members:
            m.stop()
