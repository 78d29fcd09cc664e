"""Observability: latency histograms, structured transition logs, snapshots, Prometheus.

* :class:`RequestMetrics` — a transition observer that times every request
  (from Sent to its outcome) into a per-method histogram and counts outcomes
  per method: ``DONE``, ``PARTIAL``, ``FAILED``, ``TIMED_OUT``, ``CANCELLED``,
  from what the ranks answered (:mod:`~ctlwire.kernel.core.request_outcome`).
  Add it with ``ControlClient(observer=...)`` or
  ``client.registry.observers.append(...)``.
* :class:`MethodLabels` — the bounded set of values a ``method`` label takes:
  the methods declared or built in, and those an engine served, up to a limit;
  every other method is counted as ``(other)``. Nothing a caller or a peer
  chooses adds a series without bound; operation ids and other unbounded
  values are never labels (they are in the snapshot's JSON, spans and logs).
* :class:`TransitionLog` — a transition observer that emits one structured
  :mod:`logging` record per state transition, carrying ``request_id``,
  ``method``, ``ranks``, ``old``, ``event`` and ``new`` as record attributes
  (``extra``), at DEBUG level by default.
* :func:`client_metrics` and :func:`engine_metrics` — the one metrics shape
  (``role``, ``live_requests``, ``outcomes``, ``frames_dropped``, ``counters``,
  then each side's own keys; the README's metrics table), returned by
  ``ControlClient.metrics()`` and ``EngineEndpoint.metrics()``. Every endpoint
  serves its own as the built-in, read-only ``ctlwire.metrics`` method
  (:data:`ENGINE_METRICS_METHOD`), which ``await client.engine_metrics(rank)`` calls.
* :func:`snapshot` — one dict of everything a dashboard wants: live requests,
  tombstones, per-method latency histograms, counters per transition,
  late/duplicate/unknown replies, peer link states, mailbox queue depths,
  transport counters; with an :class:`~ctlwire.kernel.operations.runner.OperationRunner`,
  its quarantined ranks, operations in flight and outcome counters.
* :class:`PrometheusExporter` — exposes the snapshot (engines' last-read metrics
  included; :class:`EnginePrometheusExporter` for an engine's own) through
  ``prometheus-client`` (the ``prometheus`` extra) as a custom collector, read
  at scrape time; nothing is computed on the request path.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ctlwire.kernel.core.membership import Membership
from ctlwire.kernel.core.peer_table import PeerTable
from ctlwire.kernel.core.quarantine import FleetQuarantine
from ctlwire.kernel.core.request_outcome import request_outcome
from ctlwire.kernel.core.request_registry import PendingRequest, RequestRegistry
from ctlwire.kernel.engine.builtin_methods import BUILTIN_METHODS, ENGINE_METRICS_METHOD
from ctlwire.states import CONTROL_REQUEST_TABLE, RequestEvent, RequestState
from ctlwire.transports.transport import ClientTransport

__all__ = [
    "DEFAULT_BUCKETS",
    "ENGINE_METRICS_METHOD",
    "EngineMetricsSource",
    "EnginePrometheusExporter",
    "LatencyHistogram",
    "MethodLabels",
    "PrometheusExporter",
    "RequestMetrics",
    "TransitionLog",
    "client_metrics",
    "engine_families",
    "engine_metrics",
    "snapshot",
]


# What the functions below read, as protocols: this module imports neither the
# client, the endpoint nor the operation runner (each of which reaches for it),
# so there is no import circle; mypy checks the real classes against these.
class _Depth(Protocol):
    @property
    def depth(self) -> int: ...


class _Mailboxes(Protocol):
    @property
    def by_method(self) -> Mapping[str, _Depth]: ...


class _ClientView(Protocol):
    """What :func:`client_metrics` and :func:`snapshot` read of a ControlClient."""

    @property
    def registry(self) -> RequestRegistry: ...
    @property
    def peers(self) -> PeerTable: ...
    @property
    def counters(self) -> Mapping[str, int]: ...
    @property
    def transport(self) -> ClientTransport: ...
    @property
    def mailboxes(self) -> _Mailboxes: ...
    membership: Membership
    quarantine: FleetQuarantine
    last_engine_metrics: dict[int, dict[str, Any]]
    def rank_status(self, rank: int) -> dict[str, Any]: ...


class _OperationsView(Protocol):
    """What :func:`snapshot` reads of an OperationRunner."""

    def metrics(self) -> dict[str, Any]: ...


class EngineMetricsSource(Protocol):
    """Anything with an engine's metrics (an EngineEndpoint)."""

    @property
    def rank(self) -> int: ...
    def metrics(self) -> dict[str, Any]: ...


DEFAULT_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0)
_TERMINAL = CONTROL_REQUEST_TABLE.terminal


@dataclass
class LatencyHistogram:
    """Cumulative-bucket histogram (Prometheus semantics) with sum and count."""

    buckets: tuple[float, ...] = DEFAULT_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.total += seconds
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``(upper bound, observations <= bound)``, ending with ``(+inf, count)``."""
        out, running = [], 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out

    def quantile(self, q: float) -> float:
        """An upper bound of the ``q`` quantile (the bucket it falls in)."""
        if not self.count:
            return float("nan")
        target = q * self.count
        for bound, cum in self.cumulative():
            if cum >= target:
                return bound
        return float("inf")  # pragma: no cover


class MethodLabels:
    """The bounded set of values a ``method`` label takes.

    A method has a label of its own when it is declared (``methods``: say, the
    methods your engines register) or built in, and otherwise once a request of
    it ended without an engine refusing it as unknown (``UnknownMethod``), up
    to ``limit`` such names; every other method is :attr:`OTHER`. So method
    names the engines refuse never add a series, and nothing else can add more
    than ``limit``."""

    OTHER = "(other)"

    def __init__(self, methods: Iterable[str] = (), *, limit: int = 128) -> None:
        self.limit = limit
        self.declared: set[str] = set(BUILTIN_METHODS)
        self.declared.update(methods)
        self.learned: set[str] = set()

    def label(self, method: str) -> str:
        """``method`` when it has a label of its own, else :attr:`OTHER`."""
        return method if method in self.declared or method in self.learned else self.OTHER

    def learn(self, entry: PendingRequest) -> str:
        """The label of ``entry``'s method (a decided request), naming the method
        first unless an engine refused it as unknown or the limit is reached."""
        method = entry.method
        if method in self.declared or method in self.learned:
            return method
        if len(self.learned) >= self.limit or any(
                not r.ok and r.error is not None and r.error.type == "UnknownMethod"
                for r in entry.replies.values()):
            return self.OTHER
        self.learned.add(method)
        return method


class RequestMetrics:
    """Times requests per method and counts their outcomes; a registry observer.

    Outcomes are :func:`~ctlwire.kernel.core.request_outcome.request_outcome`'s:
    a request whose every rank answered with an error is ``FAILED``, one with
    some ranks failed or left out ``PARTIAL``. Methods are labelled through
    ``method_labels`` (:class:`MethodLabels`; ``methods``: the ones to name from
    the start)."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 buckets: Sequence[float] = DEFAULT_BUCKETS, *,
                 methods: Iterable[str] = (),
                 method_labels: MethodLabels | None = None) -> None:
        self.clock = clock
        self.buckets = tuple(buckets)
        self.method_labels = method_labels if method_labels is not None else MethodLabels(
            methods)
        if method_labels is not None:
            self.method_labels.declared.update(methods)
        self.latency: dict[str, LatencyHistogram] = {}
        self.outcomes: dict[tuple[str, str], int] = {}
        self.peak_live = 0
        self._started: dict[int, float] = {}

    def __call__(self, entry: PendingRequest, old: RequestState, event: RequestEvent,
                 new: RequestState) -> None:
        if old is RequestState.REGISTERED:
            self._started[entry.id] = self.clock()
            self.peak_live = max(self.peak_live, len(self._started))
        if new in _TERMINAL:
            start = self._started.pop(entry.id, None)
            method = self.method_labels.learn(entry)
            key = (method, request_outcome(entry))
            self.outcomes[key] = self.outcomes.get(key, 0) + 1
            if start is not None:
                hist = self.latency.get(method)
                if hist is None:
                    hist = self.latency[method] = LatencyHistogram(self.buckets)
                hist.observe(self.clock() - start)

    def snapshot(self) -> dict[str, Any]:
        return {
            "latency": {m: {"count": h.count, "sum": h.total, "p50_le": h.quantile(0.5),
                            "p99_le": h.quantile(0.99), "buckets": h.cumulative()}
                        for m, h in self.latency.items()},
            "outcomes": {f"{m}:{o}": n for (m, o), n in self.outcomes.items()},
            "peak_in_flight": self.peak_live,
        }


class TransitionLog:
    """Emits one structured log record per ControlRequest transition."""

    def __init__(self, logger: logging.Logger | None = None, level: int = logging.DEBUG) -> None:
        self.logger = logger or logging.getLogger("ctlwire.transitions")
        self.level = level

    def __call__(self, entry: PendingRequest, old: RequestState, event: RequestEvent,
                 new: RequestState) -> None:
        if not self.logger.isEnabledFor(self.level):
            return
        self.logger.log(
            self.level, "request %d %s %s --%s--> %s", entry.id, entry.method, old.name,
            event.value, new.name,
            extra={"request_id": entry.id, "method": entry.method, "ranks": list(entry.ranks),
                   "old": old.name, "event": event.value, "new": new.name,
                   "state": new.name})


_CLIENT_DROPS = ("dropped_malformed", "dropped_oversized", "dropped_framing",
                 "dropped_wrong_type")


def _membership(client: _ClientView) -> dict[str, Any]:
    view: dict[str, Any] = client.membership.snapshot()
    view["counters"] = dict(client.membership.counters)
    view["ranks"] = {r: {k: s[k] for k in ("present", "alive", "admissible", "excluded")}
                     for r in client.membership.ranks if (s := client.rank_status(r))}
    return view


def client_metrics(client: _ClientView) -> dict[str, Any]:
    """``client.metrics()``: the client side of the one metrics shape (see the
    README's metrics table). Plain and JSON-able (msgpack-able too)."""
    reg = client.registry
    stats = reg.stats
    counters = dict(client.counters)
    # frames of a fenced (older) incarnation, and of ranks this client does not have
    counters["fenced_incarnation"] = client.peers.fenced
    counters["foreign_rank"] = client.peers.foreign
    dropped = {"late": stats.late, "duplicate": stats.duplicate, "unknown": stats.unknown,
               "stray": stats.stray, "stale_incarnation": counters.get("stale_incarnation", 0)}
    return {
        "role": "client",
        "live_requests": reg.live_count,
        "tombstones": reg.tombstone_count,
        "tombstone_bound": reg.max_tombstones,
        "registered": stats.registered,
        "cleaned": stats.cleaned,
        "outcomes": {s.name: n for s, n in stats.outcomes.items()},
        "transitions": {f"{s.name}--{e.value}": n for (s, e), n in stats.transitions.items()},
        "replies_dropped": dropped,
        "frames_dropped": {k.removeprefix("dropped_"): counters.get(k, 0)
                           for k in _CLIENT_DROPS},
        "mailbox_depth": {m: b.depth for m, b in client.mailboxes.by_method.items()},
        "peers": client.peers.snapshot(),
        "ranks": client.peers.describe(),
        # ranks out of routing (client.quarantine), with the operation and step why
        "quarantined": client.quarantine.snapshot(),
        # present ranks (revision, registrations, admission), the three predicates of
        # each, and the membership counters (stale revisions, fenced incarnations)
        "membership": _membership(client),
        "counters": counters,
        "transport_counters": dict(client.transport.counters),
        # CURVE handshakes lost because an engine refused our key
        "auth_failures": client.transport.auth_failures,
        # CURVE handshakes this client refused (a key not allow-listed; the ROUTER client)
        "auth_rejections": client.transport.auth_rejections,
    }


def engine_metrics(endpoint: EngineMetricsSource) -> dict[str, Any]:
    """``endpoint.metrics()`` and the ``ctlwire.metrics`` control method: the
    engine side of the one metrics shape (see the README's metrics table). The
    endpoint builds it (:meth:`EngineEndpoint.metrics`) from its own state."""
    return endpoint.metrics()


def snapshot(client: _ClientView, request_metrics: RequestMetrics | None = None,
             operations: _OperationsView | None = None) -> dict[str, Any]:
    """``client.metrics()`` plus, when available, per-method latency histograms
    (``requests``, from a :class:`RequestMetrics` observer), an operation
    runner's state (``operations``) and the engine metrics last read with
    ``client.engine_metrics(rank)`` (``engines``)."""
    data = client_metrics(client)
    metrics = request_metrics or next(
        (o for o in client.registry.observers if isinstance(o, RequestMetrics)), None)
    if metrics is not None:
        data["requests"] = metrics.snapshot()
    if operations is not None:
        data["operations"] = operations.metrics()
    engines = client.last_engine_metrics
    if engines:
        data["engines"] = dict(engines)
    return data


class PrometheusExporter:
    """A ``prometheus_client`` collector over :func:`snapshot` (read at scrape time).

    ``PrometheusExporter(client).register()`` adds it to the default registry;
    serve it with ``prometheus_client.start_http_server(port)``. Needs the
    ``prometheus`` extra. Every label's values come from a bounded set: ranks,
    states, reasons, and methods through ``method_labels`` (default: the
    request metrics' own, else one naming ``methods`` and the built-ins).
    """

    def __init__(self, client: _ClientView, request_metrics: RequestMetrics | None = None,
                 namespace: str = "ctlwire", operations: _OperationsView | None = None,
                 *, methods: Iterable[str] = (),
                 method_labels: MethodLabels | None = None) -> None:
        try:
            import prometheus_client  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the extra
            raise RuntimeError("PrometheusExporter needs: pip install 'ctlwire[prometheus]'"
                               ) from exc
        self.client = client
        self.request_metrics = request_metrics or next(
            (o for o in client.registry.observers if isinstance(o, RequestMetrics)), None)
        if method_labels is None:
            method_labels = (self.request_metrics.method_labels
                             if self.request_metrics is not None else MethodLabels())
        method_labels.declared.update(methods)
        self.method_labels = method_labels
        self.operations = operations
        self.ns = namespace

    def register(self, registry: Any = None) -> PrometheusExporter:
        from prometheus_client import REGISTRY

        (registry or REGISTRY).register(self)
        return self

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        snap = snapshot(self.client, self.request_metrics, self.operations)
        ns = self.ns
        yield GaugeMetricFamily(f"{ns}_live_requests", "Requests in the request map",
                                value=snap["live_requests"])
        yield GaugeMetricFamily(f"{ns}_tombstones", "Tombstones of cleaned requests",
                                value=snap["tombstones"])
        t = CounterMetricFamily(f"{ns}_transitions", "ControlRequest transitions",
                                labels=["transition"])
        for name, n in snap["transitions"].items():
            t.add_metric([name], n)
        yield t
        d = CounterMetricFamily(f"{ns}_replies_dropped", "Replies dropped", labels=["reason"])
        for reason, n in snap["replies_dropped"].items():
            d.add_metric([reason], n)
        yield d
        p = GaugeMetricFamily(f"{ns}_peer_state", "1 for each rank's current link state",
                              labels=["rank", "state"])
        for rank, state in snap["peers"].items():
            p.add_metric([str(rank), state], 1)
        yield p
        q = GaugeMetricFamily(f"{ns}_mailbox_depth", "Callers waiting for admission",
                              labels=["method"])
        depths: dict[str, int] = {}
        label = self.method_labels.label
        for method, depth in snap["mailbox_depth"].items():
            key = label(method)
            depths[key] = depths.get(key, 0) + depth
        for method, depth in sorted(depths.items()):
            q.add_metric([method], depth)
        yield q
        f = CounterMetricFamily(f"{ns}_frames_dropped", "Frames the client dropped",
                                labels=["reason"])
        for reason, n in snap["frames_dropped"].items():
            f.add_metric([reason], n)
        yield f
        engines = snap.get("engines")
        if engines:
            yield from engine_families(ns, engines)
        ops = snap.get("operations")
        if ops is not None:
            # the operation and step that quarantined it are in the snapshot, not labels
            qr = GaugeMetricFamily(f"{ns}_rank_quarantined",
                                   "1 for each rank out of routing after an operation",
                                   labels=["rank"])
            for rank in ops["quarantined"]:
                qr.add_metric([str(rank)], 1)
            yield qr
            oc = CounterMetricFamily(f"{ns}_operations", "Operations by final state",
                                     labels=["state"])
            for state in ("committed", "aborted", "degraded", "superseded"):
                oc.add_metric([state], ops.get(state, 0))
            yield oc
        req = snap.get("requests")
        if req:
            h = HistogramMetricFamily(f"{ns}_request_seconds", "Request latency, sent to outcome",
                                      labels=["method"])
            for method, lat in req["latency"].items():
                buckets = [(("+Inf" if b == float("inf") else repr(b)), c)
                           for b, c in lat["buckets"]]
                h.add_metric([method], buckets, lat["sum"])
            yield h
            o = CounterMetricFamily(f"{ns}_requests", "Requests by method and outcome",
                                    labels=["method", "outcome"])
            for key, n in req["outcomes"].items():
                method, outcome = key.rsplit(":", 1)
                o.add_metric([method, outcome], n)
            yield o


def engine_families(ns: str, engines: dict[int, dict[str, Any]]) -> Iterator[Any]:
    """Prometheus families of engine metrics (one label ``rank`` per engine)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    live = GaugeMetricFamily(f"{ns}_engine_live_requests", "Requests the engine is running",
                             labels=["rank"])
    events = CounterMetricFamily(f"{ns}_engine_events", "Engine counters, by name",
                                 labels=["rank", "counter"])
    dropped = CounterMetricFamily(f"{ns}_engine_frames_dropped", "Frames the engine dropped",
                                  labels=["rank", "reason"])
    contexts = CounterMetricFamily(
        f"{ns}_engine_trace_contexts", "Trace contexts the engine process's traced handlers "
        "read: continued, absent, invalid (served as a new root)", labels=["rank", "verdict"])
    for rank, m in sorted(engines.items()):
        live.add_metric([str(rank)], m["live_requests"])
        for name, n in sorted(m["counters"].items()):
            events.add_metric([str(rank), name], n)
        for reason, n in sorted(m["frames_dropped"].items()):
            dropped.add_metric([str(rank), reason], n)
        for verdict, n in sorted(m.get("trace_contexts", {}).items()):
            contexts.add_metric([str(rank), verdict], n)
    yield live
    yield events
    yield dropped
    yield contexts


class EnginePrometheusExporter:
    """A ``prometheus_client`` collector over an engine's own :func:`engine_metrics`
    (for an engine process that serves its own ``/metrics``). The client side
    exports the engines' metrics it last read with ``client.engine_metrics(rank)``
    through :class:`PrometheusExporter` (same families, same names)."""

    def __init__(self, endpoint: EngineMetricsSource, namespace: str = "ctlwire") -> None:
        self.endpoint = endpoint
        self.ns = namespace

    def register(self, registry: Any = None) -> EnginePrometheusExporter:
        from prometheus_client import REGISTRY

        (registry or REGISTRY).register(self)
        return self

    def collect(self) -> Iterator[Any]:
        yield from engine_families(self.ns, {self.endpoint.rank: self.endpoint.metrics()})
