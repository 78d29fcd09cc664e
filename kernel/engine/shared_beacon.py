"""One liveness beacon for the engine ranks one process hosts.

A process that hosts several ranks (one endpoint each, dialling the same
client) can send all their heartbeats as one message a beat from one thread
and socket (:func:`~ctlwire.transports.zmq_engine.group_beacon`) instead of a
beacon per rank: the client reads one message a beat for the process, not one
per rank. What each heartbeat says and how the client judges each rank are
unchanged: a blocked handler on one rank still shows as busy, a frozen or
killed process still loses all its ranks. There is no opt-in on the wire: every
client of protocol 1.0 accepts group beacons, so any client can be sent one.
"""

from __future__ import annotations

from collections.abc import Sequence

from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.transports.envelope import Heartbeat
from ctlwire.transports.zmq_beacon import LivenessBeacon
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport, group_beacon

__all__ = ["start_shared_beacon"]


def start_shared_beacon(endpoints: Sequence[EngineEndpoint]) -> LivenessBeacon:
    """Start one beacon sending the heartbeats of ``endpoints`` and return it (its
    :meth:`~ctlwire.transports.zmq_beacon.LivenessBeacon.stop` ends it; the
    endpoints' :meth:`~EngineEndpoint.close` does not).

    ``endpoints``: consecutive ranks over :class:`ZmqDealerEngineTransport` to one
    client, one heartbeat interval, built with ``beacon=False``. Call before
    :meth:`~EngineEndpoint.open` (an endpoint opened earlier sent one in-band
    heartbeat meanwhile). From then on the endpoints send no heartbeats of their
    own. Raises ValueError for endpoints that do not qualify."""
    if not endpoints:
        raise ValueError("a shared beacon needs at least one endpoint")
    interval = endpoints[0].heartbeat_interval or 0.0
    transports = []
    for endpoint in endpoints:
        transport = endpoint.transport
        if not isinstance(transport, ZmqDealerEngineTransport):
            raise ValueError(f"rank {endpoint.rank}: a shared beacon needs "
                             "ZmqDealerEngineTransport")
        if endpoint.liveness.use_beacon or endpoint.liveness.beacon_active:
            raise ValueError(f"rank {endpoint.rank}: build it with beacon=False")
        if not interval or endpoint.heartbeat_interval != interval:
            raise ValueError("a shared beacon's endpoints share one heartbeat interval")
        transports.append(transport)
    lives = [endpoint.liveness for endpoint in endpoints]
    statuses = [live.status_heartbeat for live in lives]

    def status() -> list[Heartbeat]:
        beats = []
        for one in statuses:
            hb = one()
            if hb is not None:
                beats.append(hb)
        return beats

    beacon = group_beacon(transports, interval, status)
    beacon.start()
    for live in lives:
        live.use_shared_beacon()
    return beacon
