"""Transports move frames and report peer events; they know nothing of request states.

The transports, their configurations, codecs, envelopes and transport errors are
importable from here (``from ctlwire.transports import ZmqRouterClientTransport,
ZmqOptions``); deep paths keep working. Names are imported on first use, so
importing one transport does not import the others (nor pyzmq, for the
in-memory one). ``AuthenticationFailed`` is not re-exported here: callers see
:class:`ctlwire.kernel.AuthenticationFailed`; the transport-level one stays at
``ctlwire.transports.errors.AuthenticationFailed``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ctlwire.transports import _moved_modules
from ctlwire.transports._lazy_exports import lazy_exports

# nothing is printed unless the application configures logging (see ctlwire.kernel)
logging.getLogger("ctlwire").addHandler(logging.NullHandler())
# modules that moved keep their old names for the deprecation period, with a warning
_moved_modules.install()

# The one list of exported names (see ctlwire.transports._lazy_exports): __all__
# and the lazy imports are derived from it; type checkers read it as re-exports.
if TYPE_CHECKING:
    from ctlwire.testing.faults import FaultPlan as FaultPlan
    from ctlwire.testing.faults import FaultyClientTransport as FaultyClientTransport
    from ctlwire.testing.faults import FaultyEngineTransport as FaultyEngineTransport
    from ctlwire.transports.codec import Codec as Codec
    from ctlwire.transports.codec import JsonCodec as JsonCodec
    from ctlwire.transports.codec import MsgpackCodec as MsgpackCodec
    from ctlwire.transports.codec import PayloadTypeError as PayloadTypeError
    from ctlwire.transports.codec import PickleCodec as PickleCodec
    from ctlwire.transports.codec import codec_by_name as codec_by_name
    from ctlwire.transports.curve import CurveAuthenticator as CurveAuthenticator
    from ctlwire.transports.curve import CurveClientConfig as CurveClientConfig
    from ctlwire.transports.curve import CurveServerConfig as CurveServerConfig
    from ctlwire.transports.curve import KeyPair as KeyPair
    from ctlwire.transports.curve import generate_keypair as generate_keypair
    from ctlwire.transports.curve import load_keypair as load_keypair
    from ctlwire.transports.curve import load_public_key as load_public_key
    from ctlwire.transports.curve import write_keypair as write_keypair
    from ctlwire.transports.envelope import ErrorInfo as ErrorInfo
    from ctlwire.transports.envelope import Heartbeat as Heartbeat
    from ctlwire.transports.envelope import Reply as Reply
    from ctlwire.transports.envelope import Request as Request
    from ctlwire.transports.errors import ForeignThreadError as ForeignThreadError
    from ctlwire.transports.errors import MalformedFrame as MalformedFrame
    from ctlwire.transports.errors import OversizedFrame as OversizedFrame
    from ctlwire.transports.errors import PickleRefused as PickleRefused
    from ctlwire.transports.errors import SocketClosed as SocketClosed
    from ctlwire.transports.errors import TransportClosed as TransportClosed
    from ctlwire.transports.errors import TransportError as TransportError
    from ctlwire.transports.errors import Unroutable as Unroutable
    from ctlwire.transports.errors import WouldBlock as WouldBlock
    from ctlwire.transports.memory import MemoryClientTransport as MemoryClientTransport
    from ctlwire.transports.memory import MemoryEngineTransport as MemoryEngineTransport
    from ctlwire.transports.memory import MemoryNetwork as MemoryNetwork
    from ctlwire.transports.transport import ClientTransport as ClientTransport
    from ctlwire.transports.transport import EngineTransport as EngineTransport
    from ctlwire.transports.zmq_client import ZmqDealerClientTransport as ZmqDealerClientTransport
    from ctlwire.transports.zmq_client import ZmqPairClientTransport as ZmqPairClientTransport
    from ctlwire.transports.zmq_client import (
        ZmqPushPullClientTransport as ZmqPushPullClientTransport,
    )
    from ctlwire.transports.zmq_client import ZmqRouterClientTransport as ZmqRouterClientTransport
    from ctlwire.transports.zmq_config import ZmqOptions as ZmqOptions
    from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport as ZmqDealerEngineTransport
    from ctlwire.transports.zmq_engine import ZmqPairEngineTransport as ZmqPairEngineTransport
    from ctlwire.transports.zmq_engine import (
        ZmqPushPullEngineTransport as ZmqPushPullEngineTransport,
    )
    from ctlwire.transports.zmq_engine import ZmqRouterEngineTransport as ZmqRouterEngineTransport

if not TYPE_CHECKING:  # type checkers see the names above, and no catch-all __getattr__
    __getattr__, __dir__ = lazy_exports(globals())
