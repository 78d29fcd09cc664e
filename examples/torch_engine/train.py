"""RL weight sync with a real model: a trainer pushes its weights to torch engine ranks.

    pip install 'ctlwire[torch]'
    python examples/torch_engine/train.py [--engines 3] [--iterations 5] [--backend trio]
                                          [--width 256 --layers 2]

Each engine rank is a process serving a small decoder-only transformer on CPU
(``ctlwire.kernel.app.torch_engine``) from a synchronous loop: one batched
greedy forward per step, ``endpoint.poll()`` between steps. Each iteration the
trainer takes a few optimizer steps on random tokens, then runs one ctlwire
operation on every rank: pause -> join the gloo group (first time) -> receive
the weights by broadcast and swap them in at once -> check every rank serves
the trainer's version and checksum -> resume. Then every rank's greedy output
for fixed prompts must equal the trainer's own model's. Each line splits the
operation's time into the data movement (the trainer's broadcasts) and the rest
(control: pause, checks, resume, round trips; it includes the engines' swap).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import anyio
import msgspec

from ctlwire.kernel import ControlClient, EngineFleet, OperationRunner
from ctlwire.kernel.app.torch_engine import DecoderConfig, Generate, Submit
from ctlwire.kernel.app.torch_weight_sync import Trainer
from ctlwire.transports import ZmqRouterClientTransport

PROMPTS = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]


async def run(engines: int, iterations: int, config: DecoderConfig) -> int:
    folder = tempfile.mkdtemp(prefix="ctlwire-torch-")
    address = f"ipc://{folder}/control.sock"
    env = dict(os.environ, CTLWIRE_TORCH_CONFIG=msgspec.json.encode(config).decode())
    methods = "ctlwire.kernel.app.torch_engine:register"
    fleet = EngineFleet(engines, lambda r: ["--connect", address, "--methods", methods],
                        env=env, ready_timeout=120)
    trainer = Trainer(config)
    params = sum(p.numel() for p in trainer.model.parameters())
    print(f"model: {params / 1e6:.1f}M parameters, {engines} engine ranks")
    ok = True
    async with ControlClient(ZmqRouterClientTransport(address), ranks=engines,
                             default_timeout=30.0) as client:
        await anyio.to_thread.run_sync(fleet.start)
        try:
            await client.wait_ready(timeout=60)
            runner = OperationRunner(client)
            # load while syncing: every rank decodes sequences the pause aborts
            await client.fan_out("submit", Submit([[1, 2, 3]] * 4, 10_000), mode="concurrent")
            for it in range(1, iterations + 1):
                loss = trainer.train(steps=2)
                sync = await trainer.sync(runner, update_timeout=60)
                rest = sync.seconds - sync.transfer_seconds - sync.group_seconds
                print(f"iteration {it}: loss {loss:.3f}, {sync.result.state.name} in "
                      f"{sync.seconds * 1e3:.0f} ms (broadcast {sync.transfer_seconds * 1e3:.0f}"
                      f" ms, group {sync.group_seconds * 1e3:.0f} ms, "
                      f"control {rest * 1e3:.0f} ms)")
                if not sync.result.ok:
                    print(f"  {sync.result.summary()} {sync.sender_error}", file=sys.stderr)
                    ok = False
                    break
                expected = trainer.greedy(PROMPTS, 8)
                res = await client.fan_out("generate", Generate(PROMPTS, 8), mode="concurrent")
                same = all(v == expected for v in res.results.values())
                print(f"  every rank decodes like the trainer: {same}")
                ok = ok and same and len(res.results) == engines
                await client.fan_out("submit", Submit([[1, 2, 3]] * 4, 10_000),
                                     mode="concurrent")
            info = await client.fan_out("get_server_info", mode="concurrent")
            for r, v in sorted(info.results.items()):
                print(f"rank {r}: version {v['version']}, {v['checksum'][:12]}, "
                      f"{v['tokens_per_s']:.0f} tokens/s, aborted {v['aborted']}")
        finally:
            await anyio.to_thread.run_sync(fleet.stop)
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    config = DecoderConfig(width=args.width, layers=args.layers)
    return anyio.run(run, args.engines, args.iterations, config, backend=args.backend)


if __name__ == "__main__":
    sys.exit(main())
