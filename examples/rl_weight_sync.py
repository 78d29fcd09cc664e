"""An RL weight-sync loop: train, then push the new weights to every engine rank.

    python examples/rl_weight_sync.py [--engines 2] [--iterations 5] [--backend trio]

Each iteration "trains" (a sleep), then runs one coordinated operation on real
engine processes: pause -> update_weights(version) -> resume, compensated on
failure, printing each rank's progress live: the engine's ``update_weights``
says how far its load got with ``report_progress``, the heartbeats carry it,
and the runner's ``on_progress`` gets it as a ProgressEvent with ``fraction``
and ``note``. At the end every rank must report
the last version and be serving again; the engines' own metrics are read
through the built-in ``ctlwire.metrics`` method.
"""

from __future__ import annotations

import argparse
import sys
import time

import anyio

from ctlwire.kernel import (
    ControlClient,
    OperationPlan,
    OperationRunner,
    OperationStep,
    PostCondition,
    ProgressEvent,
    StepCall,
)
from ctlwire.transports import ZmqRouterClientTransport

from engine_methods import Pause, RestoreWeights, UpdateWeights
from fleet import engine_fleet


def weight_sync_plan(version: int, old: int) -> OperationPlan:
    return OperationPlan("weight-sync", (
        OperationStep("pause", "pause", Pause("drain"), timeout=10,
                      compensation=StepCall("resume")),
        OperationStep("update", "update_weights",
                      UpdateWeights(version, f"/ckpt/{version}", load_seconds=0.3), timeout=60,
                      compensation=StepCall("restore_weights", RestoreWeights(old))),
        OperationStep("resume", "resume", timeout=10, compensation=StepCall("pause")),
    ), PostCondition("get_server_info", {"version": version, "paused": False}))


def show(event: ProgressEvent, seen: list[ProgressEvent]) -> None:
    """Every event is kept; a rank's progress report is printed as it arrives."""
    seen.append(event)
    if event.fraction is not None:  # a report, not a state change
        print(f"  rank {event.rank} {event.step}: {event.fraction:4.0%} {event.note}",
              flush=True)


async def run(engines: int, iterations: int) -> int:
    router = ZmqRouterClientTransport()
    async with ControlClient(router, ranks=engines, default_timeout=10.0) as client:
        # heartbeats every 50 ms: the load's progress shows several times a load
        fleet = engine_fleet(engines, router.address, "--heartbeat", "0.05")
        await anyio.to_thread.run_sync(fleet.start)
        try:
            await client.wait_ready(timeout=30)
            runner = OperationRunner(client)
            version = 0
            for it in range(1, iterations + 1):
                await anyio.sleep(0.01)  # a training step
                events: list[ProgressEvent] = []
                start = time.perf_counter()
                result = await runner.run(weight_sync_plan(it, version),
                                          on_progress=lambda e, seen=events: show(e, seen))
                took = (time.perf_counter() - start) * 1e3
                reports = sum(e.fraction is not None for e in events)
                print(f"iteration {it}: {result.state.name} in {took:.1f} ms "
                      f"({len(events) - reports} state changes, {reports} progress reports)")
                if result.state.name != "COMMITTED":
                    print(f"  failed ranks: {result.failed_ranks}", file=sys.stderr)
                    return 1
                version = it
            info = await client.fan_out("get_server_info")
            info.raise_for_errors()
            versions = {r: v["version"] for r, v in info.results.items()}
            paused = {r: v["paused"] for r, v in info.results.items()}
            engine = await client.engine_metrics(0)
            print(f"versions {versions}, paused {paused}; rank 0 replied "
                  f"{engine['counters']['replied']} requests")
            ok = set(versions.values()) == {version} and not any(paused.values())
            await client.aclose()
        finally:
            await anyio.to_thread.run_sync(fleet.stop)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args(argv)
    return anyio.run(run, args.engines, args.iterations, backend=args.backend)


if __name__ == "__main__":
    sys.exit(main())
