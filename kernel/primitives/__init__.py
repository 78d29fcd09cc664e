"""Small, complete primitives for any anyio program (asyncio or trio), no client needed.

Each can be built in a synchronous ``__init__`` (nothing binds to an event loop
until a task uses it) and has the guarantees it has inside
:class:`~ctlwire.kernel.client.control_client.ControlClient`:

* :class:`AdmissionGate` -- first come, first served admission, one holder, the
  wake-up window closed, a deadline on the whole wait;
* :class:`Coalescer` (and :class:`SharedOutcome`) -- concurrent callers share
  one call in flight, each told whether it started it;
* :class:`OwnIoFanOut` -- a fan-out over your own sends and receive loop, even
  when replies carry no id: register before send, deadlines, typed per-slot
  results, cleanup.

Names are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ctlwire.transports._lazy_exports import lazy_exports

if TYPE_CHECKING:
    from ctlwire.kernel.primitives.admission_gate import AdmissionGate as AdmissionGate
    from ctlwire.kernel.primitives.coalescer import Coalescer as Coalescer
    from ctlwire.kernel.primitives.coalescer import SharedOutcome as SharedOutcome
    from ctlwire.kernel.primitives.own_io_fan_out import OwnIoFanOut as OwnIoFanOut

if not TYPE_CHECKING:
    __getattr__, __dir__ = lazy_exports(globals())
