"""Counting the work one thread does: Python calls, C calls, task steps and bytecodes.

:class:`CallCounter` installs a ``sys.setprofile`` hook on the thread that
starts it and counts, until stopped:

* ``py_calls`` -- Python frames entered, a coroutine or generator resumed
  included (each resumption is a frame entered again);
* ``c_calls`` -- calls of C functions (``sock.recv``, ``dict.get``, ...);
* ``task_steps`` -- steps of tasks: a coroutine frame entered from a frame that
  is not a coroutine (the event loop's ``Handle._run`` on asyncio, trio's run
  loop on trio), i.e. the scheduler resuming a task, on either backend;
* ``bytecodes`` -- bytecode instructions executed (``sys.settrace`` opcode events;
  the frames already running when counting starts are counted from there on): the
  interpreted work, which calls of different sizes do not show;
* ``by_function`` -- Python calls per function (``file:line name``).

Counts are exact and independent of the machine's load (what a timing on a
shared 2-core machine is not). The hook makes the counted code several times
slower: count, do not time, while it is installed.

:func:`serve_counting_signals` lets an engine process be counted from outside:
``SIGUSR1`` starts a fresh count on its main thread, ``SIGUSR2`` stops it and
writes the counts as JSON to the given path.
"""

from __future__ import annotations

import inspect
import json
import signal
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

__all__ = ["CallCounter", "Counts", "serve_counting_signals"]

_CO_COROUTINE = inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE


@dataclass
class Counts:
    py_calls: int = 0
    c_calls: int = 0
    task_steps: int = 0
    by_function: Counter[str] = field(default_factory=Counter)
    bytecodes: int = 0

    def to_json(self, top: int = 40) -> dict[str, Any]:
        return {"py_calls": self.py_calls, "c_calls": self.c_calls,
                "task_steps": self.task_steps, "bytecodes": self.bytecodes,
                "by_function": dict(self.by_function.most_common(top))}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Counts:
        return cls(data["py_calls"], data["c_calls"], data["task_steps"],
                   Counter(data["by_function"]), data["bytecodes"])

    def __add__(self, other: Counts) -> Counts:
        return Counts(self.py_calls + other.py_calls, self.c_calls + other.c_calls,
                      self.task_steps + other.task_steps, self.by_function + other.by_function,
                      self.bytecodes + other.bytecodes)


def _where(frame: FrameType) -> str:
    code = frame.f_code
    path = code.co_filename
    for marker in ("/site-packages/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    else:
        path = path.rsplit("/", 2)[-2] + "/" + path.rsplit("/", 1)[-1] if "/" in path else path
    return f"{path}:{code.co_firstlineno} {code.co_name}"


class CallCounter:
    """``with CallCounter() as c: ...`` counts this thread's work (see the module)."""

    def __init__(self) -> None:
        self.counts = Counts()
        self._names: dict[Any, str] = {}
        self._running: list[FrameType] = []

    def _hook(self, frame: FrameType, event: str, arg: Any) -> None:
        counts = self.counts
        if event == "call":
            counts.py_calls += 1
            code = frame.f_code
            name = self._names.get(code)
            if name is None:
                name = self._names[code] = _where(frame)
            counts.by_function[name] += 1
            if code.co_flags & _CO_COROUTINE:
                back = frame.f_back
                if back is None or not back.f_code.co_flags & _CO_COROUTINE:
                    counts.task_steps += 1
        elif event == "c_call":
            counts.c_calls += 1

    def _trace(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return self._opcode

    def _opcode(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        if event == "opcode":
            self.counts.bytecodes += 1
        return self._opcode

    def start(self) -> None:
        self.counts = Counts()
        # the frames running now (the caller's, a signal's interrupted loop) count too
        frame = inspect.currentframe()
        self._running = []
        while frame is not None:
            self._trace(frame, "call", None)
            frame.f_trace = self._opcode
            self._running.append(frame)
            frame = frame.f_back
        sys.settrace(self._trace)
        sys.setprofile(self._hook)

    def stop(self) -> Counts:
        sys.setprofile(None)
        sys.settrace(None)
        for frame in self._running:
            frame.f_trace = None
            frame.f_trace_opcodes = False
        self._running = []
        return self.counts

    def __enter__(self) -> CallCounter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_counting_signals(path: str) -> None:
    """``SIGUSR1``: start counting this (main) thread; ``SIGUSR2``: stop, write JSON to
    ``path`` (see the module docstring)."""
    counter = CallCounter()

    def on_start(signum: int, frame: Any) -> None:
        counter.start()

    def on_stop(signum: int, frame: Any) -> None:
        counts = counter.stop()
        with open(path, "w") as f:
            json.dump(counts.to_json(), f)

    signal.signal(signal.SIGUSR1, on_start)
    signal.signal(signal.SIGUSR2, on_stop)
