"""Every label's values come from a bounded set: method names the engines refuse
are counted as ``(other)``, whatever their number; an operation id is never a label."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("prometheus_client")

import msgspec
from prometheus_client import CollectorRegistry

from ctlwire.kernel import (
    EngineEndpoint,
    OperationRunner,
    PrometheusExporter,
    RequestMetrics,
    UnknownMethod,
)
from ctlwire.kernel.core.request_registry import PendingRequest
from ctlwire.kernel.observability.metrics import MethodLabels
from ctlwire.transports.envelope import ErrorInfo, Reply

pytestmark = [pytest.mark.anyio, pytest.mark.ctlwire_virtual_clock]


def setup(ep: EngineEndpoint) -> None:
    @ep.method()
    def load() -> int:
        return 1


def series(registry: CollectorRegistry) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {(s.name, tuple(sorted(s.labels.items())))
            for family in registry.collect() for s in family.samples}


async def test_a_thousand_unknown_method_names_add_no_series(ctlwire_harness: Any) -> None:
    async with ctlwire_harness(ranks=2, setup=setup) as h:
        c = h.client
        metrics = RequestMetrics()
        c.registry.observers.append(metrics)
        registry = CollectorRegistry()
        PrometheusExporter(c, metrics, operations=OperationRunner(c)).register(registry)

        async def unknown(name: str) -> None:
            with pytest.raises(UnknownMethod):
                await c.call(name, rank=0, timeout=10)
            res = await c.fan_out(name, timeout=10)  # queueing: a mailbox per method
            assert set(res.errors) == {0, 1} and not res.ok

        async def scrape() -> set[tuple[str, tuple[tuple[str, str], ...]]]:
            for rank in c.ranks:
                await c.engine_metrics(rank, timeout=10)
            return series(registry)

        await c.fan_out("load", timeout=10)
        await unknown("warm-up")  # the "(other)" series exist from here on
        before = await scrape()
        for i in range(1000):
            await unknown(f"no_such_method_{i}")
        after = await scrape()
    assert len(after) == len(before) and after == before
    names = {dict(labels).get("method") for _, labels in after} - {None}
    assert names == {"load", "(other)", "ctlwire.metrics"}
    assert metrics.outcomes[("(other)", "FAILED")] == 2 * 1001
    assert metrics.outcomes[("load", "DONE")] == 1


def _entry(method: str, error: str | None) -> PendingRequest:
    entry = PendingRequest(1, method, (0,), None, None, 1.0, None)  # type: ignore[arg-type]
    info = ErrorInfo(error, "", 404) if error else None
    entry.replies[0] = Reply(1, 0, 1, error is None, msgspec.Raw(b""), info)
    return entry


def test_method_labels_are_bounded_by_their_limit() -> None:
    labels = MethodLabels(["pause"], limit=2)
    assert labels.learn(_entry("pause", None)) == "pause"  # declared
    assert labels.learn(_entry("typo", "UnknownMethod")) == "(other)"  # refused
    assert labels.learn(_entry("a", "RuntimeError")) == "a"  # served (with an error)
    assert labels.learn(_entry("b", None)) == "b"
    assert labels.learn(_entry("c", None)) == "(other)"  # past the limit
    assert labels.label("a") == "a" and labels.label("c") == "(other)"
    assert labels.label("ctlwire.metrics") == "ctlwire.metrics"  # built in
