"""SGLang's ``FanOutCommunicator``, on ctlwire's primitives: a one-line swap.

::

    # from sglang.srt.managers.communicator import FanOutCommunicator
    from ctlwire.integrations.sglang import FanOutCommunicator

The interface followed is the class in SGLang's release 0.5.23
(:data:`SGLANG_INTERFACE`, ``sglang/srt/managers/communicator.py``): the
constructor ``(send, fan_out, mode="queueing")``, ``__call__``,
``queueing_call``, ``watching_call``, ``handle_recv``, ``set_fan_out`` and
``merge_results``, with the cancellation behaviour SGLang's main branch tests
(newer than 0.5.23). sglang is not a dependency: nothing here imports it.

What the swap changes for the tokenizer manager that builds these in its
synchronous ``__init__`` and feeds ``handle_recv`` from its receive loop:

* **FIFO proven.** Calls go out strictly in arrival order, each sent on the tick
  it is admitted (by the reply that drains its predecessor), through the core the
  interleaving explorer checks: a caller in the wake-up window cannot overtake.
* **Replies never cross.** SGLang's replies carry no request id; a request's
  replies are counted, and the next request goes out only when every one of the
  previous request's replies is in, even when its caller was cancelled. A queued
  call that is cancelled is never sent; a ``send`` that raises fails only its own
  call.
* **Deadlines, if wanted.** ``timeout=`` (seconds; default none, as SGLang) bounds
  each call, queueing included, with a typed
  :class:`~ctlwire.kernel.errors.RequestTimedOut`.
* **Counted, not crashed.** A reply while nothing is in flight is dropped and
  counted (``counters``), as is a late one; :meth:`FanOutCommunicator.close`
  ends every waiting call with ClientClosed.

Watching mode shares the request in flight with every concurrent caller (the
first caller's request is sent), and each caller gets its own deep copy of the
replies, as SGLang does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from ctlwire.kernel.core.fan_out_result import FanOutResult
from ctlwire.kernel.primitives.own_io_fan_out import OwnIoFanOut

__all__ = ["SGLANG_INTERFACE", "FanOutCommunicator", "UnknownMode"]

#: the SGLang release whose ``FanOutCommunicator`` interface this class follows
SGLANG_INTERFACE = "0.5.23"

T = TypeVar("T")


class UnknownMode(ValueError, AssertionError):
    """A mode other than ``"queueing"`` and ``"watching"``: a ValueError, and an
    AssertionError as SGLang's constructor raises."""


class _Collecting:
    """What SGLang calls ``_result_event`` (its tests read it): the replies of the
    request in flight being collected; ``is_set()`` once they are all in."""

    __slots__ = ("_comm", "_entry")

    def __init__(self, comm: FanOutCommunicator[Any], entry: object) -> None:
        self._comm = comm
        self._entry = entry

    def is_set(self) -> bool:
        return self._comm.fan_out.in_flight is not self._entry


def _replies(result: FanOutResult) -> list[Any]:
    """Every slot's reply in order, or the error of the first slot without one (a
    reply given up on: ``fan_out.reset()``)."""
    result.raise_for_errors()
    return [result.results[slot] for slot in result.ranks]


class FanOutCommunicator(Generic[T]):
    """Sends one request to ``fan_out`` schedulers and collects their ``fan_out``
    replies, one request in flight at a time.

    ``send(obj)``: hands a request to the schedulers (read when each request is
    sent; a None request is not sent, its replies are still collected).
    ``mode``: ``"queueing"`` (callers in arrival order, each its own request) or
    ``"watching"`` (concurrent callers share the request in flight); anything
    else raises :class:`UnknownMode`. ``timeout``: a deadline for each call, in
    seconds (None: none). Built without an event loop; the loop of the first
    caller is used.
    """

    def __init__(self, send: Callable[[T], object] | None, fan_out: int,
                 mode: str = "queueing", *, timeout: float | None = None) -> None:
        if mode != "queueing" and mode != "watching":
            raise UnknownMode(f"mode must be 'queueing' or 'watching', not {mode!r}")
        self._send = send
        self._mode = mode
        #: the fan-out over SGLang's own socket and receive loop
        self.fan_out: OwnIoFanOut[T | None] = OwnIoFanOut(
            self._send_request, fan_out, mode="queueing" if mode == "queueing" else "watching",
            joins="any", timeout=timeout,
            name="FanOutCommunicator")

    def _send_request(self, obj: T | None) -> None:
        if obj is not None:
            send = self._send
            if send is None:
                raise TypeError("FanOutCommunicator has no send function")
            send(obj)

    @property
    def _result_event(self) -> _Collecting | None:
        """SGLang's name for the replies being collected: None while no request is in
        flight (SGLang's own tests read it)."""
        entry = self.fan_out.in_flight
        return None if entry is None else _Collecting(self, entry)

    @property
    def counters(self) -> dict[str, int]:
        """Replies dropped (``unexpected``: nothing in flight; ``stray``), failed
        sends, and the request map's late and duplicate replies."""
        stats = self.fan_out.registry.stats
        return {**self.fan_out.counters, "late": stats.late, "duplicate": stats.duplicate}

    async def queueing_call(self, obj: T | None) -> list[Any]:
        """Send ``obj`` when every earlier caller's request is done; its replies,
        in the order they came."""
        return _replies(await self.fan_out.call(obj, mode="queueing"))

    async def watching_call(self, obj: T | None) -> list[Any]:
        """Join the request in flight, or send ``obj``; this caller's copy of its
        replies, in the order they came."""
        return _replies(await self.fan_out.call(obj, mode="watching"))

    async def __call__(self, obj: T | None) -> list[Any]:
        if self._mode == "queueing":
            return await self.queueing_call(obj)
        return await self.watching_call(obj)

    def set_fan_out(self, fan_out: int) -> None:
        """How many replies requests sent from now on collect (one in flight keeps
        its own count)."""
        self.fan_out.slots = fan_out

    def handle_recv(self, recv_obj: T) -> None:
        """One reply from a scheduler (the receive loop's dispatcher calls it)."""
        self.fan_out.deliver(recv_obj)

    def close(self) -> None:
        """End every waiting call with ClientClosed; later calls raise it."""
        self.fan_out.close()

    @staticmethod
    def merge_results(results: Sequence[Any]) -> tuple[bool, str]:
        """Whether every result has ``success``, and their ``message`` joined with
        ``" | "``."""
        return all(r.success for r in results), " | ".join(r.message for r in results)
