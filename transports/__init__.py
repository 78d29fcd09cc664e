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

from ctlwire.transports._lazy_exports import lazy_exports

# nothing is printed unless the application configures logging (see ctlwire.kernel)
logging.getLogger("ctlwire").addHandler(logging.NullHandler())

if TYPE_CHECKING:
    from ctlwire.transports.codec import (
        Codec,
        JsonCodec,
        MsgpackCodec,
        PayloadTypeError,
        PickleCodec,
        codec_by_name,
    )
    from ctlwire.transports.curve import (
        CurveAuthenticator,
        CurveClientConfig,
        CurveServerConfig,
        KeyPair,
        generate_keypair,
        load_keypair,
        load_public_key,
        write_keypair,
    )
    from ctlwire.transports.envelope import (
        ErrorInfo,
        Heartbeat,
        Reply,
        Request,
    )
    from ctlwire.transports.errors import (
        ForeignThreadError,
        MalformedFrame,
        OversizedFrame,
        PickleRefused,
        SocketClosed,
        TransportClosed,
        TransportError,
        Unroutable,
        WouldBlock,
    )
    from ctlwire.transports.memory import (
        MemoryClientTransport,
        MemoryEngineTransport,
        MemoryNetwork,
    )
    from ctlwire.transports.testing import (
        FaultPlan,
        FaultyClientTransport,
        FaultyEngineTransport,
    )
    from ctlwire.transports.transport import (
        ClientTransport,
        EngineTransport,
    )
    from ctlwire.transports.zmq_client import (
        ZmqDealerClientTransport,
        ZmqPairClientTransport,
        ZmqPushPullClientTransport,
        ZmqRouterClientTransport,
    )
    from ctlwire.transports.zmq_config import (
        ZmqOptions,
    )
    from ctlwire.transports.zmq_engine import (
        ZmqDealerEngineTransport,
        ZmqPairEngineTransport,
        ZmqPushPullEngineTransport,
        ZmqRouterEngineTransport,
    )

# name -> the module that defines it (imported on first use, so importing one
# deep module, or running `python -m ctlwire.kernel.app.engine_process`, does not
# import the whole package)
_EXPORTS: dict[str, str] = {
    "Codec": "ctlwire.transports.codec",
    "codec_by_name": "ctlwire.transports.codec",
    "JsonCodec": "ctlwire.transports.codec",
    "MsgpackCodec": "ctlwire.transports.codec",
    "PayloadTypeError": "ctlwire.transports.codec",
    "PickleCodec": "ctlwire.transports.codec",
    "CurveAuthenticator": "ctlwire.transports.curve",
    "CurveClientConfig": "ctlwire.transports.curve",
    "CurveServerConfig": "ctlwire.transports.curve",
    "generate_keypair": "ctlwire.transports.curve",
    "KeyPair": "ctlwire.transports.curve",
    "load_keypair": "ctlwire.transports.curve",
    "load_public_key": "ctlwire.transports.curve",
    "write_keypair": "ctlwire.transports.curve",
    "ErrorInfo": "ctlwire.transports.envelope",
    "Heartbeat": "ctlwire.transports.envelope",
    "Reply": "ctlwire.transports.envelope",
    "Request": "ctlwire.transports.envelope",
    "ForeignThreadError": "ctlwire.transports.errors",
    "MalformedFrame": "ctlwire.transports.errors",
    "OversizedFrame": "ctlwire.transports.errors",
    "PickleRefused": "ctlwire.transports.errors",
    "SocketClosed": "ctlwire.transports.errors",
    "TransportClosed": "ctlwire.transports.errors",
    "TransportError": "ctlwire.transports.errors",
    "Unroutable": "ctlwire.transports.errors",
    "WouldBlock": "ctlwire.transports.errors",
    "FaultPlan": "ctlwire.transports.testing",
    "FaultyClientTransport": "ctlwire.transports.testing",
    "FaultyEngineTransport": "ctlwire.transports.testing",
    "MemoryClientTransport": "ctlwire.transports.memory",
    "MemoryEngineTransport": "ctlwire.transports.memory",
    "MemoryNetwork": "ctlwire.transports.memory",
    "ClientTransport": "ctlwire.transports.transport",
    "EngineTransport": "ctlwire.transports.transport",
    "ZmqDealerClientTransport": "ctlwire.transports.zmq_client",
    "ZmqPairClientTransport": "ctlwire.transports.zmq_client",
    "ZmqPushPullClientTransport": "ctlwire.transports.zmq_client",
    "ZmqRouterClientTransport": "ctlwire.transports.zmq_client",
    "ZmqOptions": "ctlwire.transports.zmq_config",
    "ZmqDealerEngineTransport": "ctlwire.transports.zmq_engine",
    "ZmqPairEngineTransport": "ctlwire.transports.zmq_engine",
    "ZmqPushPullEngineTransport": "ctlwire.transports.zmq_engine",
    "ZmqRouterEngineTransport": "ctlwire.transports.zmq_engine",
}

__all__ = [
    "ClientTransport",
    "Codec",
    "CurveAuthenticator",
    "CurveClientConfig",
    "CurveServerConfig",
    "EngineTransport",
    "ErrorInfo",
    "FaultPlan",
    "FaultyClientTransport",
    "FaultyEngineTransport",
    "ForeignThreadError",
    "Heartbeat",
    "JsonCodec",
    "KeyPair",
    "MalformedFrame",
    "MemoryClientTransport",
    "MemoryEngineTransport",
    "MemoryNetwork",
    "MsgpackCodec",
    "OversizedFrame",
    "PayloadTypeError",
    "PickleCodec",
    "PickleRefused",
    "Reply",
    "Request",
    "SocketClosed",
    "TransportClosed",
    "TransportError",
    "Unroutable",
    "WouldBlock",
    "ZmqDealerClientTransport",
    "ZmqDealerEngineTransport",
    "ZmqOptions",
    "ZmqPairClientTransport",
    "ZmqPairEngineTransport",
    "ZmqPushPullClientTransport",
    "ZmqPushPullEngineTransport",
    "ZmqRouterClientTransport",
    "ZmqRouterEngineTransport",
    "codec_by_name",
    "generate_keypair",
    "load_keypair",
    "load_public_key",
    "write_keypair",
]

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
