"""Test tools over transports: fault injection.

Fault injection: wrap any transport to delay, drop, duplicate, reorder, partition or close.

For your own tests of code built on ctlwire (and for ctlwire's soak)::

    plan = FaultPlan(seed=7, faults=[
        Fault.drop(probability=0.01),                       # 1% of frames, both ways
        Fault.duplicate(probability=0.01, kinds={"reply"}),  # only Reply frames
        Fault.delay(0.001, 0.020, probability=0.05),         # uniform 1-20 ms
        Fault.reorder(probability=0.01),                     # swap with the next frame
        Fault.drop(every=10, direction="send", kinds={"request"}),
    ], partitions=[Partition(rank=2, start=1.0, end=2.0)])
    transport = FaultyClientTransport(MemoryNetwork().client_transport(), plan)
    async with ControlClient(transport, ranks=4) as client:
        transport.partition(1)          # by hand, as well as on the schedule
        ...
        transport.heal(1)
    print(transport.faults.counters)    # {"drop.send.request": 12, ...}

:class:`FaultyClientTransport` wraps a :class:`ClientTransport`,
:class:`FaultyEngineTransport` an :class:`EngineTransport`. Each frame is
matched by direction (``"send"`` or ``"receive"``, seen from the wrapped end),
envelope kind (``"request"``, ``"reply"``, ``"heartbeat"``), rank and time
window against the plan's :class:`Fault` rules, which fire every Nth matching
frame and/or with a probability.

Guarantees:

* **Deterministic given the seed.** Each link — one direction to or from one
  rank — has its own ``random.Random`` seeded from ``(seed, direction, rank)``:
  the fate of the n-th frame on a link depends only on the seed, n and the
  time (virtual time in tests makes that exact), not on how links interleave.
  Injections are recorded (:attr:`FaultInjector.log`) and counted
  (:attr:`FaultInjector.counters`): ``"<action>.<direction>.<kind>"`` for
  ``frames`` (seen), ``drop``, ``duplicate``, ``delay``, ``reorder``,
  ``partition`` (frames blocked) and ``lost`` (a delayed, held or duplicate
  copy that could not be delivered later); plus ``partitions_started``,
  ``partitions_healed``, ``partition_notices``, ``disconnects_suppressed`` and
  ``closed``.
* **A partition is a silent engine.** While ``rank`` is partitioned no frame
  passes either way, heartbeats included, and disconnection reports for it
  are suppressed; the client only learns through its liveness bound (unless
  ``notify=True``, which reports the link closed at once). Healing lets frames,
  hence heartbeats, flow again and the rank rejoins.
* **What passes keeps its order.** Frames without a fault keep their relative
  order; a delayed frame is overtaken by later ones; a reordered frame is held
  until the next frame on its link has passed (at most ``hold`` seconds).
* A frame sent now that the wrapped transport refuses raises as it would
  unwrapped (Unroutable, WouldBlock); copies delivered later (delayed, held,
  duplicated) that are refused are counted as ``lost`` instead.
* A disconnection of a rank (reported by the wrapped transport, or a send
  refused as Unroutable) loses that rank's frames still delayed or held, as a
  closed connection loses what it carried: no frame of a dead peer arrives
  after its death was reported.
* **Close.** The plan's ``close_at`` (or :meth:`FaultyClientTransport.close`)
  closes the client's side: sends and ``receive`` raise TransportClosed. On
  an engine it closes the wrapped transport, so the client sees it disconnect.
* Undecodable frames (``Dropped``) pass through untouched.

Delays run on anyio timers in a task group the wrapper owns, entered in
``__aenter__`` (so virtual clocks apply). A :class:`FaultyEngineTransport`
used synchronously (``open``/``try_receive``/``wait_readable``) releases
delayed frames whenever it is polled, on the monotonic clock.
"""

# Why here and not in ctlwire.testing: fault injection wraps a transport
# and needs only ctlwire.transports; transports never import the kernel, and
# living here lets ctlwire.transports re-export FaultPlan, FaultyClientTransport
# and FaultyEngineTransport. This facade is the documented home; the modules
# behind it are private: _faults (the plan and the verdicts), _injector (the
# seeded decisions), _faulty_base (delay line, held frames, schedule shared by
# both wrappers), _faulty_client and _faulty_engine (the two wrappers).

from __future__ import annotations

from ctlwire.testing.faults._faults import (
    Fault,
    FaultPlan,
    Injection,
    Partition,
    Verdict,
    envelope_kind,
)
from ctlwire.testing.faults._faulty_client import FaultyClientTransport
from ctlwire.testing.faults._faulty_engine import FaultyEngineTransport
from ctlwire.testing.faults._injector import FaultInjector

__all__ = [
    "Fault",
    "FaultInjector",
    "FaultPlan",
    "FaultyClientTransport",
    "FaultyEngineTransport",
    "Injection",
    "Partition",
    "Verdict",
    "envelope_kind",
]
