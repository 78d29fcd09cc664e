"""What one engine ``poll()`` costs: ``ctlwire bench --only engine_calls``.

Two rows, on an :class:`~ctlwire.kernel.engine.endpoint.EngineEndpoint` over the
default transport (a DEALER engine dialing a ROUTER client, in this process):

* **Python calls per plain request** -- counted (:mod:`ctlwire.benchmarks.call_counter`)
  inside one round of the engine process's loop (``poll(1, timeout)``: the
  wait is the receive) that handles one request with no key, no fence and a
  sync handler (the handler and pyzmq's ``Socket.send`` included), inside one
  ``poll()`` that handles one (it then asks for another and finds none), and per
  request inside one ``poll()`` that handles a burst; the baseline being the
  bare pyzmq engine's loop
  (:mod:`ctlwire.benchmarks.baseline_engine`: receive, decode, the method, encode,
  send -- counted the same way). Exact and independent of the machine's load.
* **An idle poll()** -- one ``poll()`` that finds nothing, against a bare
  non-blocking receive attempt on a pyzmq socket with nothing queued (the
  ``zmq.Again`` it raises caught), timed alternately in one run, medians of
  rounds.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import zmq

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.transports.codec import MsgpackCodec
from ctlwire.transports.envelope import Request
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

from .call_counter import CallCounter, Counts
from .report import Row, Target

__all__ = ["GROUPS", "EngineCalls", "count_baseline", "count_poll", "rows", "time_idle"]

GROUPS = ("engine_calls",)
_ADDRESS = "inproc://ctlwire-bench-engine-calls"
_TOP = 16
_COUNTER = "call_counter.py"
_BURST = 16
_WAIT = 10.0  # the loop round's receive timeout (s): never reached, a request is queued


@dataclass
class EngineCalls:
    """Counted Python calls: the loop's round (``poll(1, timeout)``) handling one
    plain request, one ``poll()`` handling one, a request within a burst one
    ``poll()`` takes, one ``poll()`` finding none, and the bare engine's loop for
    one request."""

    loop_round: Counts
    request: Counts
    in_burst: Counts
    idle: Counts
    baseline: Counts


class _Rig:
    """A ROUTER client and one polled engine over inproc (one context)."""

    def __init__(self) -> None:
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(_ADDRESS)
        self.codec = MsgpackCodec()
        transport = ZmqDealerEngineTransport(_ADDRESS, 0, context=self.ctx)
        self.endpoint = EngineEndpoint(transport, rank=0, heartbeat_interval=None)
        self.endpoint.register("echo", lambda value=None: value, payload_type=Any)
        self.endpoint.open()
        self.identity = b"rank-0"
        self.next_id = 1
        self.payload = self.codec.encode_value(7)
        self._wait_connected()

    def _wait_connected(self) -> None:
        self.request()  # the first request tells the router the engine's identity
        # the loop's round, as counted below (its receive timeout set once, here)
        assert self.endpoint.poll(1, _WAIT), "engine_calls: the engine got no request"
        self.reply()

    def request(self) -> None:
        data = self.codec.encode(Request(self.next_id, 0, "echo", self.payload))
        self.next_id += 1
        for _ in range(1000):
            try:
                self.router.send_multipart([self.identity, data], zmq.NOBLOCK)
                return
            except zmq.ZMQError:  # not connected yet (ROUTER_MANDATORY) or no peer
                time.sleep(0.01)
        self.router.send_multipart([self.identity, data])

    def arrived(self) -> None:
        """Block until the engine's socket has the request queued."""
        self.endpoint.transport.wait_readable(10.0)

    def reply(self) -> None:
        assert self.router.poll(10_000), "engine_calls: no reply"
        self.router.recv_multipart()

    def close(self) -> None:
        self.endpoint.close()
        self.router.close(0)
        self.ctx.term()


def count_poll(rounds: int = 50) -> tuple[Counts, Counts, Counts, Counts]:
    """Summed counts of ``rounds`` loop rounds (``poll(1, timeout)``) each handling
    one plain request, of ``rounds`` ``poll()`` calls each handling one, of
    ``rounds`` that each handle a burst of ``_BURST``, and of ``rounds`` that find
    nothing."""
    rig = _Rig()
    try:
        loop_round, request, burst, idle = Counts(), Counts(), Counts(), Counts()
        for _ in range(rounds):
            rig.request()
            rig.arrived()
            with CallCounter() as counter:
                handled = rig.endpoint.poll(1, _WAIT)
            assert handled == 1, handled
            loop_round = loop_round + counter.counts
            rig.reply()
            rig.request()
            rig.arrived()
            with CallCounter() as counter:
                handled = rig.endpoint.poll()
            assert handled == 1, handled
            request = request + counter.counts
            rig.reply()
            with CallCounter() as counter:
                handled = rig.endpoint.poll()
            assert handled == 0, handled
            idle = idle + counter.counts
            for _ in range(_BURST):
                rig.request()
            rig.arrived()
            time.sleep(0.001)  # the rest of the burst queued behind the first
            with CallCounter() as counter:
                handled = rig.endpoint.poll(_BURST)
            assert handled == _BURST, handled
            burst = burst + counter.counts
            for _ in range(_BURST):
                rig.reply()
        return loop_round, request, burst, idle
    finally:
        rig.close()


def count_baseline(rounds: int = 50) -> Counts:
    """The bare pyzmq engine's loop body (:mod:`ctlwire.benchmarks.baseline_engine`)
    for one request, counted the same way."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind(_ADDRESS + "-base")
    b.connect(_ADDRESS + "-base")
    encode = msgspec.msgpack.Encoder().encode
    decode = msgspec.msgpack.Decoder().decode
    methods: dict[str, Callable[..., Any]] = {"echo": lambda value=None: value}
    recv, send = b.recv, b.send
    total = Counts()
    try:
        for i in range(rounds):
            a.send(encode((i, "echo", [7])))
            b.poll(10_000)
            with CallCounter() as counter:
                call_id, method, args = decode(recv())
                reply = encode((call_id, True, methods[method](*args)))
                send(reply)
            total = total + counter.counts
            a.recv()
    finally:
        a.close(0)
        b.close(0)
        ctx.term()
    return total


def time_idle(rounds: int = 15, n: int = 20_000) -> tuple[float, float]:
    """Median ns of an idle ``poll()`` and of a bare non-blocking receive attempt,
    timed alternately (``rounds`` rounds of ``n`` each)."""
    rig = _Rig()
    bare = rig.ctx.socket(zmq.DEALER)
    bare.connect(_ADDRESS)
    try:
        poll = rig.endpoint.poll
        recv = bare.recv
        noblock = zmq.NOBLOCK
        polls: list[float] = []
        bares: list[float] = []
        for _ in range(rounds):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                poll()
            t1 = time.perf_counter_ns()
            for _ in range(n):
                try:  # noqa: SIM105 - the bare attempt, as a hand-written loop makes it
                    recv(noblock)
                except zmq.Again:
                    pass
            t2 = time.perf_counter_ns()
            polls.append((t1 - t0) / n)
            bares.append((t2 - t1) / n)
        return statistics.median(polls), statistics.median(bares)
    finally:
        bare.close(0)
        rig.close()


def measure(quick: bool = False) -> tuple[EngineCalls, tuple[float, float]]:
    rounds = 20 if quick else 50
    loop_round, request, burst, idle = count_poll(rounds)
    calls = EngineCalls(_per(loop_round, rounds), _per(request, rounds),
                        _per(burst, rounds * _BURST),
                        _per(idle, rounds), _per(count_baseline(rounds), rounds))
    return calls, time_idle(5 if quick else 15, 5_000 if quick else 20_000)


def _per(counts: Counts, n: int) -> Counts:
    """``counts`` per ``n``, without the counter's own frames (its ``stop``)."""
    own = sum(v for k, v in counts.by_function.items() if _COUNTER in k)
    return Counts((counts.py_calls - own) // n, counts.c_calls // n, counts.task_steps // n,
                  Counter({k: v // n for k, v in counts.by_function.items()
                           if _COUNTER not in k}), counts.bytecodes // n)


def rows(quick: bool = False) -> list[Row]:
    calls, (idle_ns, bare_ns) = measure(quick)
    base = calls.baseline.py_calls
    base_name = "bare sync pyzmq engine loop (recv, decode, method, encode, send)"
    out = []
    for scenario, counts in (("engine Python calls per plain request (the loop's round, "
                              "poll(1, timeout))", calls.loop_round),
                             ("engine Python calls per plain request (one poll(), "
                              "one request)", calls.request),
                             (f"engine Python calls per plain request (one poll(), a "
                              f"burst of {_BURST})", calls.in_burst)):
        out.append(Row(
            "engine_calls", scenario, "count", counts.py_calls, base, base_name,
            counts.py_calls, "ctlwire's count (the baseline's for context)",
            Target("info"),
            {"ctlwire_calls": dict(counts.by_function.most_common(_TOP)),
             "c_calls": counts.c_calls, "baseline_c_calls": calls.baseline.c_calls,
             "bytecodes": counts.bytecodes, "baseline_bytecodes": calls.baseline.bytecodes},
            ratio_unit=""))
    out.append(Row(
        "engine_calls", "idle poll() vs a bare non-blocking receive attempt", "ns",
        idle_ns, bare_ns, "pyzmq socket.recv(NOBLOCK) raising zmq.Again, caught",
        idle_ns / bare_ns, "poll / bare receive (timed alternately, medians)",
        Target("<=", 1.2, "<= 1.2x"),
        {"idle_poll_python_calls": calls.idle.py_calls,
         "idle_poll_calls": dict(calls.idle.by_function.most_common(_TOP))}))
    return out
