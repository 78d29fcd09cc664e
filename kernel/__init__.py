"""The ctlwire kernel: drives the state tables of :mod:`ctlwire.states` over the
transports of :mod:`ctlwire.transports` on anyio (asyncio or trio).

The public API is importable from here (``from ctlwire.kernel import ControlClient,
EngineEndpoint, RequestTimedOut``); every name also stays at its deep path
(``ctlwire.kernel.client.control_client.ControlClient`` is the same object). Names are
imported on first use, ``__version__`` too (it reads the installed distribution's
metadata, which importing the kernel does not). Every error a caller can see is
defined in :mod:`ctlwire.kernel.errors`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ctlwire.transports._lazy_exports import lazy_exports

# A library does not print unless the application configured logging: without
# this handler, Python's last-resort handler writes warnings to stderr.
logging.getLogger("ctlwire").addHandler(logging.NullHandler())

# The one list of exported names (see ctlwire.transports._lazy_exports): __all__
# and the lazy imports are derived from it; type checkers read it as re-exports.
if TYPE_CHECKING:
    __version__: str  # read from the installed distribution's metadata on first use
    from ctlwire.app.engine_fleet import EngineFleet as EngineFleet
    from ctlwire.app.engine_fleet import EngineProcess as EngineProcess
    from ctlwire.app.engine_fleet import EngineStartError as EngineStartError
    from ctlwire.kernel.client.control_client import ControlClient as ControlClient
    from ctlwire.kernel.core.fan_out_policy import Policy as Policy
    from ctlwire.kernel.core.fan_out_result import FanOutResult as FanOutResult
    from ctlwire.kernel.core.fan_out_result import RankOutcome as RankOutcome
    from ctlwire.kernel.core.membership import Membership as Membership
    from ctlwire.kernel.core.membership import MembershipEvent as MembershipEvent
    from ctlwire.kernel.core.operation_plan import OperationPlan as OperationPlan
    from ctlwire.kernel.core.operation_plan import OperationStep as OperationStep
    from ctlwire.kernel.core.operation_plan import PostCondition as PostCondition
    from ctlwire.kernel.core.operation_plan import StepCall as StepCall
    from ctlwire.kernel.core.operation_plan import new_fence as new_fence
    from ctlwire.kernel.core.operation_plan import new_operation_id as new_operation_id
    from ctlwire.kernel.core.operation_plan import step_key as step_key
    from ctlwire.kernel.core.operation_result import OperationResult as OperationResult
    from ctlwire.kernel.core.operation_result import Phase as Phase
    from ctlwire.kernel.core.operation_result import ProgressEvent as ProgressEvent
    from ctlwire.kernel.core.operation_result import RankReport as RankReport
    from ctlwire.kernel.core.quarantine import FleetQuarantine as FleetQuarantine
    from ctlwire.kernel.core.quarantine import Quarantine as Quarantine
    from ctlwire.kernel.core.result_cache import ResultCache as ResultCache
    from ctlwire.kernel.engine.endpoint import EngineEndpoint as EngineEndpoint
    from ctlwire.kernel.engine.endpoint import ErrorCode as ErrorCode
    from ctlwire.kernel.engine.endpoint import MethodSpec as MethodSpec
    from ctlwire.kernel.engine.endpoint import report_progress as report_progress
    from ctlwire.kernel.engine.operation_ledger import LastOperation as LastOperation
    from ctlwire.kernel.engine.operation_ledger import OperationLedger as OperationLedger
    from ctlwire.kernel.engine.operation_ledger import StepRequest as StepRequest
    from ctlwire.kernel.engine.shared_beacon import start_shared_beacon as start_shared_beacon
    from ctlwire.kernel.engine.step_abort import step_aborted as step_aborted
    from ctlwire.kernel.errors import ActorStopped as ActorStopped
    from ctlwire.kernel.errors import AskTimeout as AskTimeout
    from ctlwire.kernel.errors import AuthenticationFailed as AuthenticationFailed
    from ctlwire.kernel.errors import Busy as Busy
    from ctlwire.kernel.errors import ClientClosed as ClientClosed
    from ctlwire.kernel.errors import CtlwireError as CtlwireError
    from ctlwire.kernel.errors import EngineDead as EngineDead
    from ctlwire.kernel.errors import FanOutFailed as FanOutFailed
    from ctlwire.kernel.errors import Fenced as Fenced
    from ctlwire.kernel.errors import IllegalTransition as IllegalTransition
    from ctlwire.kernel.errors import InvalidPlan as InvalidPlan
    from ctlwire.kernel.errors import MailboxFull as MailboxFull
    from ctlwire.kernel.errors import NoAdmissibleRanks as NoAdmissibleRanks
    from ctlwire.kernel.errors import NotDelivered as NotDelivered
    from ctlwire.kernel.errors import OutcomeUnknown as OutcomeUnknown
    from ctlwire.kernel.errors import PostConditionFailed as PostConditionFailed
    from ctlwire.kernel.errors import RankLeftOut as RankLeftOut
    from ctlwire.kernel.errors import ReleaseRefused as ReleaseRefused
    from ctlwire.kernel.errors import RemoteError as RemoteError
    from ctlwire.kernel.errors import RequestTimedOut as RequestTimedOut
    from ctlwire.kernel.errors import RequestTooLarge as RequestTooLarge
    from ctlwire.kernel.errors import ResultTypeError as ResultTypeError
    from ctlwire.kernel.errors import UnknownMethod as UnknownMethod
    from ctlwire.kernel.errors import UnsupportedProtocolVersion as UnsupportedProtocolVersion
    from ctlwire.kernel.observability.metrics import (
        EnginePrometheusExporter as EnginePrometheusExporter,
    )
    from ctlwire.kernel.observability.metrics import PrometheusExporter as PrometheusExporter
    from ctlwire.kernel.observability.metrics import RequestMetrics as RequestMetrics
    from ctlwire.kernel.observability.metrics import TransitionLog as TransitionLog
    from ctlwire.kernel.observability.metrics import snapshot as snapshot
    from ctlwire.kernel.observability.tracing import TraceProvider as TraceProvider
    from ctlwire.kernel.operations.recovery import Recovery as Recovery
    from ctlwire.kernel.operations.runner import OperationRunner as OperationRunner
    from ctlwire.kernel.primitives.admission_gate import AdmissionGate as AdmissionGate
    from ctlwire.kernel.primitives.coalescer import Coalescer as Coalescer
    from ctlwire.kernel.primitives.coalescer import SharedOutcome as SharedOutcome
    from ctlwire.kernel.primitives.own_io_fan_out import OwnIoFanOut as OwnIoFanOut
    from ctlwire.testing import EngineHarness as EngineHarness
    from ctlwire.testing import TransitionRecorder as TransitionRecorder
    from ctlwire.testing import virtual_backend as virtual_backend

if not TYPE_CHECKING:  # type checkers see the names above, and no catch-all __getattr__
    _exported, __dir__ = lazy_exports(globals())

    def __getattr__(name: str) -> object:
        if name == "__version__":  # importing the kernel reads no package metadata
            from ctlwire.kernel._version import __version__ as version

            globals()["__version__"] = version
            return version
        return _exported(name)
