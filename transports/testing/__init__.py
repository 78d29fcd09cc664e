"""Test tools over transports: fault injection (the documented home).

Fault injection wraps a transport and needs only :mod:`ctlwire.transports`, so it
lives here rather than in :mod:`ctlwire.kernel.testing`: transports never import
the kernel, and this keeps :mod:`ctlwire.transports` able to re-export
``FaultPlan``, ``FaultyClientTransport`` and ``FaultyEngineTransport``. See
:mod:`ctlwire.transports.testing.fault_injection` for the guarantees.
"""

from __future__ import annotations

from ctlwire.transports.testing.fault_injection import (
    Fault,
    FaultInjector,
    FaultPlan,
    FaultyClientTransport,
    FaultyEngineTransport,
    Injection,
    Partition,
    Verdict,
    envelope_kind,
)

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
