"""Start, watch, kill and restart engine processes (demo, benchmarks, tests).

:class:`EngineFleet` spawns ``python -m ctlwire.app.engine_process`` once
per rank, waits for each to print ``READY``, and on :meth:`EngineFleet.stop`
(or leaving its ``with`` block) terminates every process and reaps it —
escalating to SIGKILL after a grace period — so no process is left behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from ctlwire.kernel.errors import CtlwireError

__all__ = ["EngineFleet", "EngineProcess", "EngineStartError"]


class EngineStartError(CtlwireError, RuntimeError):
    """An engine process exited or stayed silent instead of reporting READY."""


@dataclass
class EngineProcess:
    rank: int
    argv: list[str]
    proc: subprocess.Popen[str]
    incarnation: int = 0
    output: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None


def _read_ready(proc: subprocess.Popen[str], timeout: float) -> tuple[int, list[str]]:
    assert proc.stdout is not None
    lines: list[str] = []
    result: list[int] = []

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("READY "):
                result.append(int(line.split()[2]))
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    if not result:
        raise EngineStartError(f"engine did not report READY within {timeout} s: {lines[-5:]}")
    return result[0], lines


class EngineFleet:
    """N engine processes; ``args_for(rank)`` gives each one's CLI arguments."""

    def __init__(self, ranks: int | Sequence[int], args_for: Callable[[int], list[str]], *,
                 python: str | None = None, env: dict[str, str] | None = None,
                 ready_timeout: float = 30.0) -> None:
        self.ranks = list(range(ranks)) if isinstance(ranks, int) else list(ranks)
        self.args_for = args_for
        self.python = python or sys.executable
        self.env = env
        self.ready_timeout = ready_timeout
        self.engines: dict[int, EngineProcess] = {}

    def __enter__(self) -> EngineFleet:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def command(self, rank: int) -> list[str]:
        """``rank``'s command line: ``python -m ctlwire.app.engine_process`` with
        ``args_for(rank)``; the engine stops by itself if this process dies without
        stopping it."""
        return [self.python, "-m", "ctlwire.app.engine_process", "--rank", str(rank),
                "--exit-with-parent", str(os.getpid()), *self.args_for(rank)]

    def spawn(self, rank: int) -> EngineProcess:
        """Start ``rank``'s process (:meth:`command`) and record it in :attr:`engines`,
        without waiting for it (see :meth:`await_ready`)."""
        argv = self.command(rank)
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=None, text=True, env=env,
                                start_new_session=True)
        engine = self.engines[rank] = EngineProcess(rank, argv, proc)
        return engine

    def start(self) -> None:
        """Spawn every rank, then wait for all of them to be READY."""
        for rank in self.ranks:
            self.spawn(rank)
        for rank in self.ranks:
            self.await_ready(rank)

    def await_ready(self, rank: int) -> EngineProcess:
        """Wait until the process :meth:`spawn` started for ``rank`` reports READY; its
        incarnation and output are set then. EngineStartError after ``ready_timeout``
        (the process is stopped)."""
        engine = self.engines[rank]
        try:
            engine.incarnation, engine.output = _read_ready(engine.proc, self.ready_timeout)
        except EngineStartError:
            self._reap(engine, grace=0.0)
            raise
        return engine

    def kill(self, rank: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to ``rank`` (SIGKILL by default: a crash) and reap it."""
        engine = self.engines[rank]
        if engine.alive:
            os.kill(engine.pid, sig)
        engine.proc.wait(timeout=10)

    def restart(self, rank: int) -> EngineProcess:
        """Start ``rank`` again (after :meth:`kill`); a new incarnation."""
        old = self.engines.get(rank)
        if old is not None and old.alive:
            self._reap(old, grace=2.0)
        self.spawn(rank)
        return self.await_ready(rank)

    def _reap(self, engine: EngineProcess, grace: float) -> None:
        proc = engine.proc
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=grace) if grace else None
            except subprocess.TimeoutExpired:
                pass
            if proc.poll() is None:
                proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()

    def stop(self, grace: float = 3.0) -> None:
        """Terminate and reap every engine (SIGKILL after ``grace`` seconds)."""
        deadline = time.monotonic() + grace
        for engine in self.engines.values():
            if engine.alive:
                with contextlib.suppress(ProcessLookupError):
                    engine.proc.send_signal(signal.SIGTERM)
        for engine in self.engines.values():
            remaining = max(0.0, deadline - time.monotonic())
            try:
                engine.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                engine.proc.kill()
            self._reap(engine, grace=0.0)

    def pids(self) -> dict[int, int]:
        return {r: e.pid for r, e in self.engines.items()}
