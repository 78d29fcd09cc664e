"""A client process of the ``scale`` and ``multi_client`` bench groups.

``python -m ctlwire.benchmarks.bench_client scale --connect ADDR --ranks N --fanouts M``
binds a ``ControlClient(ZmqRouterClientTransport(ADDR))`` that ``N`` engine
ranks dial, waits until every rank is heard from, then times ``M`` sequential
fan-outs to all of them. Its RSS is read (after a full collection) before the
client exists, once it is connected to the ``N`` ranks (every rank heard
from), and after the warm-up fan-outs: the differences are what the client
costs for ``N`` ranks. The CPU time the
client process spent over the timed fan-outs separates its own cost from the
engines' (which share the machine's cores with it). A process of its own
for each ``N`` keeps that delta clean (allocator arenas reused from a larger
earlier client would hide it).

``python -m ctlwire.benchmarks.bench_client calls --addresses A0 A1 ... --calls C
--callers K`` is one API-server process of the ``multi_client`` group: a
``ControlClient(ZmqDealerClientTransport([A0, ...]))`` to engines that bind
ROUTERs. It prints ``READY`` once every rank is heard from, waits for ``GO``
on stdin (so that several such processes start together), makes ``C`` echo
calls by ``K`` concurrent tasks spread over the ranks, and counts the answers.

Each mode prints one ``RESULT {json}`` line on stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import anyio

from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.errors import CtlwireError
from ctlwire.transports.zmq_client import ZmqDealerClientTransport, ZmqRouterClientTransport

from .scenarios import PAYLOAD
from .stats import rss_bytes

__all__ = ["main"]


def _result(data: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(data), flush=True)


async def _scale(address: str, ranks: int, fanouts: int, ready_timeout: float) -> None:
    gc.collect()
    rss_before = rss_bytes()
    async with ControlClient(ZmqRouterClientTransport(address), ranks=ranks,
                             default_timeout=30.0) as ctl:
        t0 = time.perf_counter()
        await ctl.wait_ready(timeout=ready_timeout)
        ready_s = time.perf_counter() - t0
        gc.collect()
        rss_connected = rss_bytes()
        expected = dict.fromkeys(range(ranks), PAYLOAD)
        for _ in range(max(3, fanouts // 5)):  # warm-up
            res = await ctl.fan_out("echo", PAYLOAD)
            if res.results != expected:
                raise AssertionError(f"fan-out to {ranks} ranks: errors {res.errors}")
        gc.collect()
        rss_warm = rss_bytes()
        times: list[float] = []
        cpu0 = time.process_time()
        for _ in range(fanouts):
            t0 = time.perf_counter()
            res = await ctl.fan_out("echo", PAYLOAD)
            times.append(time.perf_counter() - t0)
            if len(res.results) != ranks:
                raise AssertionError(f"fan-out to {ranks} ranks: errors {res.errors}")
        cpu_s = time.process_time() - cpu0
        live = ctl.registry.live_count
    _result({"ranks": ranks, "fanout_s": times, "cpu_s": cpu_s, "rss_before": rss_before,
             "rss_connected": rss_connected, "rss_warm": rss_warm, "ready_s": ready_s,
             "live_after": live})


async def _calls(addresses: Sequence[str], calls: int, callers: int,
                 ready_timeout: float) -> None:
    ranks = len(addresses)
    async with ControlClient(ZmqDealerClientTransport(list(addresses)), ranks=ranks,
                             default_timeout=30.0) as ctl:
        await ctl.wait_ready(timeout=ready_timeout)
        for r in range(ranks):  # warm-up, and every route known
            await ctl.call("echo", PAYLOAD, rank=r)
        print("READY", flush=True)
        line = await anyio.to_thread.run_sync(sys.stdin.readline)
        if line.strip() != "GO":
            return
        counts = {"ok": 0, "wrong": 0, "errors": 0}
        per = calls // callers

        async def worker(w: int) -> None:
            for i in range(per):
                try:
                    value = await ctl.call("echo", PAYLOAD, rank=(w + i) % ranks)
                except CtlwireError:
                    counts["errors"] += 1
                else:
                    counts["ok" if value == PAYLOAD else "wrong"] += 1

        start = time.time()
        async with anyio.create_task_group() as tg:
            for w in range(callers):
                tg.start_soon(worker, w)
        end = time.time()
        _result({"calls": per * callers, **counts, "start": start, "end": end,
                 "live_after": ctl.registry.live_count})


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ctlwire.benchmarks.bench_client")
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("scale")
    s.add_argument("--connect", required=True)
    s.add_argument("--ranks", type=int, required=True)
    s.add_argument("--fanouts", type=int, default=50)
    s.add_argument("--ready-timeout", type=float, default=60.0)
    c = sub.add_parser("calls")
    c.add_argument("--addresses", nargs="+", required=True)
    c.add_argument("--calls", type=int, default=2_000)
    c.add_argument("--callers", type=int, default=16)
    c.add_argument("--ready-timeout", type=float, default=60.0)
    args = p.parse_args(argv)
    if args.mode == "scale":
        anyio.run(_scale, args.connect, args.ranks, args.fanouts, args.ready_timeout)
    else:
        anyio.run(_calls, args.addresses, args.calls, args.callers, args.ready_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
