"""The ctlwire kernel: drives the state tables of :mod:`ctlwire.states` over the
transports of :mod:`ctlwire.transports` on anyio (asyncio or trio).

The public API is importable from here (``from ctlwire.kernel import ControlClient,
EngineEndpoint, RequestTimedOut``); every name also stays at its deep path
(``ctlwire.kernel.control_client.ControlClient`` is the same object). Names are
imported on first use. Every error a caller can see is defined in
:mod:`ctlwire.kernel.errors`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ctlwire.kernel._version import __version__ as __version__
from ctlwire.transports._lazy_exports import lazy_exports

# A library does not print unless the application configured logging: without
# this handler, Python's last-resort handler writes warnings to stderr.
logging.getLogger("ctlwire").addHandler(logging.NullHandler())

if TYPE_CHECKING:
    from ctlwire.kernel.app.engine_fleet import (
        EngineFleet,
        EngineProcess,
        EngineStartError,
    )
    from ctlwire.kernel.control_client import (
        ControlClient,
    )
    from ctlwire.kernel.core.fan_out_policy import (
        Policy,
    )
    from ctlwire.kernel.core.fan_out_result import (
        FanOutResult,
    )
    from ctlwire.kernel.core.membership import (
        Membership,
        MembershipEvent,
    )
    from ctlwire.kernel.core.operation_plan import (
        InvalidPlan,
        OperationPlan,
        OperationStep,
        PostCondition,
        PostConditionFailed,
        StepCall,
        new_fence,
        new_operation_id,
        step_key,
    )
    from ctlwire.kernel.core.operation_result import (
        OperationResult,
        Phase,
        ProgressEvent,
        RankReport,
    )
    from ctlwire.kernel.core.quarantine import (
        FleetQuarantine,
        Quarantine,
    )
    from ctlwire.kernel.core.result_cache import (
        ResultCache,
    )
    from ctlwire.kernel.engine.endpoint import (
        EngineEndpoint,
        ErrorCode,
        MethodSpec,
        report_progress,
    )
    from ctlwire.kernel.engine.operation_ledger import (
        LastOperation,
        OperationLedger,
        StepRequest,
    )
    from ctlwire.kernel.errors import (
        ActorStopped,
        AskTimeout,
        AuthenticationFailed,
        ClientClosed,
        CtlwireError,
        EngineDead,
        FanOutFailed,
        Fenced,
        IllegalTransition,
        MailboxFull,
        NoAdmissibleRanks,
        NotDelivered,
        OutcomeUnknown,
        RemoteError,
        RequestTimedOut,
        RequestTooLarge,
        ResultTypeError,
        UnsupportedProtocolVersion,
    )
    from ctlwire.kernel.metrics import (
        EnginePrometheusExporter,
        PrometheusExporter,
        RequestMetrics,
        TransitionLog,
        snapshot,
    )
    from ctlwire.kernel.operation_runner import (
        OperationRunner,
        Recovery,
        ReleaseRefused,
    )
    from ctlwire.kernel.testing import (
        EngineHarness,
        TransitionRecorder,
        virtual_backend,
    )
    from ctlwire.kernel.tracing import (
        TraceProvider,
    )

# name -> the module that defines it (imported on first use, so importing one
# deep module, or running `python -m ctlwire.kernel.app.engine_process`, does not
# import the whole package)
_EXPORTS: dict[str, str] = {
    "ControlClient": "ctlwire.kernel.control_client",
    "EngineEndpoint": "ctlwire.kernel.engine.endpoint",
    "ErrorCode": "ctlwire.kernel.engine.endpoint",
    "MethodSpec": "ctlwire.kernel.engine.endpoint",
    "report_progress": "ctlwire.kernel.engine.endpoint",
    "ActorStopped": "ctlwire.kernel.errors",
    "AskTimeout": "ctlwire.kernel.errors",
    "AuthenticationFailed": "ctlwire.kernel.errors",
    "ClientClosed": "ctlwire.kernel.errors",
    "CtlwireError": "ctlwire.kernel.errors",
    "EngineDead": "ctlwire.kernel.errors",
    "FanOutFailed": "ctlwire.kernel.errors",
    "Fenced": "ctlwire.kernel.errors",
    "IllegalTransition": "ctlwire.kernel.errors",
    "MailboxFull": "ctlwire.kernel.errors",
    "NotDelivered": "ctlwire.kernel.errors",
    "NoAdmissibleRanks": "ctlwire.kernel.errors",
    "Membership": "ctlwire.kernel.core.membership",
    "MembershipEvent": "ctlwire.kernel.core.membership",
    "OutcomeUnknown": "ctlwire.kernel.errors",
    "RemoteError": "ctlwire.kernel.errors",
    "RequestTimedOut": "ctlwire.kernel.errors",
    "RequestTooLarge": "ctlwire.kernel.errors",
    "ResultTypeError": "ctlwire.kernel.errors",
    "UnsupportedProtocolVersion": "ctlwire.kernel.errors",
    "FanOutResult": "ctlwire.kernel.core.fan_out_result",
    "Policy": "ctlwire.kernel.core.fan_out_policy",
    "EngineFleet": "ctlwire.kernel.app.engine_fleet",
    "EngineProcess": "ctlwire.kernel.app.engine_fleet",
    "EngineStartError": "ctlwire.kernel.app.engine_fleet",
    "EnginePrometheusExporter": "ctlwire.kernel.metrics",
    "PrometheusExporter": "ctlwire.kernel.metrics",
    "RequestMetrics": "ctlwire.kernel.metrics",
    "snapshot": "ctlwire.kernel.metrics",
    "TransitionLog": "ctlwire.kernel.metrics",
    "LastOperation": "ctlwire.kernel.engine.operation_ledger",
    "OperationLedger": "ctlwire.kernel.engine.operation_ledger",
    "StepRequest": "ctlwire.kernel.engine.operation_ledger",
    "new_fence": "ctlwire.kernel.core.operation_plan",
    "new_operation_id": "ctlwire.kernel.core.operation_plan",
    "OperationPlan": "ctlwire.kernel.core.operation_plan",
    "OperationStep": "ctlwire.kernel.core.operation_plan",
    "step_key": "ctlwire.kernel.core.operation_plan",
    "StepCall": "ctlwire.kernel.core.operation_plan",
    "InvalidPlan": "ctlwire.kernel.core.operation_plan",
    "PostCondition": "ctlwire.kernel.core.operation_plan",
    "PostConditionFailed": "ctlwire.kernel.core.operation_plan",
    "FleetQuarantine": "ctlwire.kernel.core.quarantine",
    "ReleaseRefused": "ctlwire.kernel.operation_runner",
    "OperationResult": "ctlwire.kernel.core.operation_result",
    "Phase": "ctlwire.kernel.core.operation_result",
    "ProgressEvent": "ctlwire.kernel.core.operation_result",
    "RankReport": "ctlwire.kernel.core.operation_result",
    "OperationRunner": "ctlwire.kernel.operation_runner",
    "Quarantine": "ctlwire.kernel.core.quarantine",
    "Recovery": "ctlwire.kernel.operation_runner",
    "ResultCache": "ctlwire.kernel.core.result_cache",
    "EngineHarness": "ctlwire.kernel.testing",
    "TransitionRecorder": "ctlwire.kernel.testing",
    "virtual_backend": "ctlwire.kernel.testing",
    "TraceProvider": "ctlwire.kernel.tracing",
}

__all__ = [
    "ActorStopped",
    "AskTimeout",
    "AuthenticationFailed",
    "ClientClosed",
    "ControlClient",
    "CtlwireError",
    "EngineDead",
    "EngineEndpoint",
    "EngineFleet",
    "EngineHarness",
    "EngineProcess",
    "EnginePrometheusExporter",
    "EngineStartError",
    "ErrorCode",
    "FanOutFailed",
    "FanOutResult",
    "Fenced",
    "FleetQuarantine",
    "IllegalTransition",
    "InvalidPlan",
    "LastOperation",
    "MailboxFull",
    "Membership",
    "MembershipEvent",
    "MethodSpec",
    "NoAdmissibleRanks",
    "NotDelivered",
    "OperationLedger",
    "OperationPlan",
    "OperationResult",
    "OperationRunner",
    "OperationStep",
    "OutcomeUnknown",
    "Phase",
    "Policy",
    "PostCondition",
    "PostConditionFailed",
    "ProgressEvent",
    "PrometheusExporter",
    "Quarantine",
    "RankReport",
    "Recovery",
    "ReleaseRefused",
    "RemoteError",
    "RequestMetrics",
    "RequestTimedOut",
    "RequestTooLarge",
    "ResultCache",
    "ResultTypeError",
    "StepCall",
    "StepRequest",
    "TraceProvider",
    "TransitionLog",
    "TransitionRecorder",
    "UnsupportedProtocolVersion",
    "new_fence",
    "new_operation_id",
    "report_progress",
    "snapshot",
    "step_key",
    "virtual_backend",
]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
