"""One etcd member on free loopback ports, its data in a folder of its own
(tests, and ``ctlwire demo --membership etcd``). Needs the ``etcd`` binary
(Debian: ``etcd-server``) and ``httpx`` (the ``etcd`` extra)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from ctlwire.kernel.testing._ports import free_tcp_port

__all__ = ["EtcdServer", "etcd_binary", "memory_dir"]


def etcd_binary() -> str | None:
    """The path of the ``etcd`` binary on PATH, or None."""
    return shutil.which("etcd")


def memory_dir(prefix: str = "ctlwire-etcd-") -> Path:
    """A new folder in memory where there is a writable tmpfs (etcd syncs every
    write to disk), else in the system's temp folder. The caller removes it."""
    shm = "/dev/shm"
    where = shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=where))


class EtcdServer:
    """One etcd member on loopback ports, its data in ``data_dir``; restartable.
    :meth:`start` returns once the member answers a range request (RuntimeError
    after ``start_timeout`` s, the member stopped); :meth:`stop` terminates it
    (SIGKILL after 10 s) and reaps it. Its log goes to ``data_dir/etcd.log``."""

    def __init__(self, data_dir: Path, *, binary: str | None = None,
                 start_timeout: float = 30.0) -> None:
        found = binary or etcd_binary()
        if found is None:
            raise FileNotFoundError("the etcd binary is not installed "
                                    "(Debian: apt-get install etcd-server)")
        self.binary = found
        self.data_dir = data_dir
        self.start_timeout = start_timeout
        self.client_port = free_tcp_port()
        self.peer_port = free_tcp_port()
        self.endpoint = f"http://127.0.0.1:{self.client_port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import httpx

        peer = f"http://127.0.0.1:{self.peer_port}"
        with open(self.data_dir / "etcd.log", "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--data-dir", str(self.data_dir / "data"),
                 "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"default={peer}"],
                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                if httpx.post(f"{self.endpoint}/v3/kv/range", json={"key": "eA=="},
                              timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"etcd did not start within {self.start_timeout:g} s "
                           f"(its log: {self.data_dir / 'etcd.log'})")

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
