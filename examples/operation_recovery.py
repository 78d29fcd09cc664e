"""A controller dies in the middle of a weight update; its successor finishes it.

    python examples/operation_recovery.py [--engines 3] [--backend trio]

The first controller pauses every rank and loads the new weights, then dies
before it resumes them: the ranks are left paused. A new controller (a new
client on the same address, as after an API-server restart) asks the
engines' ledgers what remains (``recover``) and finishes it in one call
(``finish``): the steps already applied answer from the ledgers and do not
run again, the rest runs, the post-condition is checked, and every rank
serves the new weights.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile

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
from ctlwire.states import RankState
from ctlwire.transports import ZmqRouterClientTransport

from engine_methods import Pause, RestoreWeights, UpdateWeights
from fleet import engine_fleet


def weight_sync_plan(version: int, old: int) -> OperationPlan:
    return OperationPlan("weight-sync", (
        OperationStep("pause", "pause", Pause("drain"), timeout=10,
                      compensation=StepCall("resume")),
        OperationStep("update", "update_weights", UpdateWeights(version), timeout=60,
                      compensation=StepCall("restore_weights", RestoreWeights(old))),
        OperationStep("resume", "resume", timeout=10, compensation=StepCall("pause")),
    ), PostCondition("get_server_info", {"version": version, "paused": False}))


class ControllerDied(Exception):
    pass


async def run(engines: int) -> int:
    plan = weight_sync_plan(1, 0)
    folder = tempfile.mkdtemp(prefix="ctlwire-")  # 0700: only this user can bind there
    address = f"ipc://{folder}/control.sock"
    fleet = engine_fleet(engines, address)
    await anyio.to_thread.run_sync(fleet.start)
    try:
        async with ControlClient(ZmqRouterClientTransport(address), ranks=engines,
                                 default_timeout=10.0) as client:
            await client.wait_ready(timeout=30)

            def die_after_update(ev: ProgressEvent) -> None:
                if ev.step == "update" and ev.state is RankState.APPLIED \
                        and ev.rank == engines - 1:
                    raise ControllerDied  # every rank loaded the weights; none resumed

            try:
                await OperationRunner(client).run(plan, on_progress=die_after_update)
            except ControllerDied:
                print("controller died after the update, before the resume")
        # the successor: a new client on the same address
        async with ControlClient(ZmqRouterClientTransport(address), ranks=engines,
                                 default_timeout=10.0) as client:
            await client.wait_ready(timeout=30)
            runner = OperationRunner(client)
            recovery = await runner.recover(plan)
            assert recovery is not None
            print(f"recovered {recovery.op_id}: {recovery.action}, remaining "
                  f"{recovery.remaining}")
            result = await runner.finish(plan, recovery)
            print(result.summary())
            info = await client.fan_out("get_server_info", mode="concurrent")
            states = {r: (v["version"], v["paused"]) for r, v in sorted(info.results.items())}
            print(f"versions and paused flags {states}")
            ok = result.ok and all(s == (1, False) for s in states.values())
    finally:
        await anyio.to_thread.run_sync(fleet.stop)
        shutil.rmtree(folder, ignore_errors=True)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", type=int, default=3)
    p.add_argument("--backend", choices=["asyncio", "trio"], default="asyncio")
    args = p.parse_args()
    return anyio.run(run, args.engines, backend=args.backend)


if __name__ == "__main__":
    sys.exit(main())
