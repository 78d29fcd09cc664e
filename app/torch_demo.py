"""``ctlwire demo --torch``: a trainer pushes real weights to torch engine processes.

::

    pip install 'ctlwire[torch]'
    ctlwire demo --torch [--engines 3] [--cycles 5] [--backend trio] [--model-width 256]

Each engine rank is a process serving a small decoder-only transformer on CPU
(:mod:`~ctlwire.app.torch_engine`) from a synchronous loop: one batched
greedy forward per step, ``endpoint.poll()`` between steps, sequences in
flight. Each cycle the trainer takes a few optimizer steps on random tokens,
then runs one ctlwire operation on every rank
(:meth:`~ctlwire.app.torch_weight_sync.Trainer.sync`): pause (aborting
the sequences in flight) -> join the gloo group (first time) -> receive the
weights by broadcast and swap them in at once -> check every rank serves the
trainer's version and checksum -> resume. Then every rank's greedy output for
fixed prompts must equal the trainer's own model's.

Each cycle prints per-rank progress (the steps applied on each rank) and
splits the operation's time by what the engines measured inside each step's
handler (per step, the slowest rank): the data movement (joining the group,
receiving the broadcast), the engines' own work (checksum and swap of the new
weights; pause, check, resume), and the rest -- the operation's time outside
every handler: ctlwire's share (requests and replies, the ledger, the runner,
waiting for a generation step in progress to end).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

import anyio
import anyio.to_thread
import msgspec

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.app.torch_engine import DecoderConfig, Generate, Submit
from ctlwire.app.torch_weight_sync import Trainer, WeightSync
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.operations.runner import OperationRunner
from ctlwire.states import RankState
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

__all__ = ["SyncTiming", "main", "run", "split"]

PROMPTS = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]]
METHODS = "ctlwire.app.torch_engine:register"


@dataclass(frozen=True)
class SyncTiming:
    """One committed sync's time split (seconds)."""

    total: float
    data: float       # joining the group and receiving the broadcast
    engine: float     # the engines' other work: checksum, swap, pause, check, resume
    equal: bool       # every rank decodes like the trainer afterwards

    @property
    def control(self) -> float:
        """ctlwire's share: the operation's time outside the engines' handlers."""
        return self.total - self.data - self.engine


def split(seconds: float, handlers: list[dict[str, float]], updates: list[dict[str, float]],
          methods: list[str]) -> tuple[float, float]:
    """(data movement, engine work) of one operation from each rank's handler times
    (``handler_s``) and update times (``last_update``): per step, the slowest rank."""
    work = sum(max(h.get(m, 0.0) for h in handlers) for m in methods)
    checksum_swap = max(u.get("verify_s", 0.0) + u.get("swap_s", 0.0) for u in updates)
    data = (max(h.get("update_weights_from_distributed", 0.0) for h in handlers)
            - checksum_swap + max(h.get("init_weights_update_group", 0.0) for h in handlers))
    return data, min(seconds, work) - data


def _per_rank(sync: WeightSync) -> str:
    applied: dict[int, list[str]] = {}
    for ev in sync.events:
        if ev.state is RankState.APPLIED:
            applied.setdefault(ev.rank, []).append(ev.step)
    return ", ".join(f"rank {r}: {'>'.join(s)}" for r, s in sorted(applied.items()))


async def run(engines: int, cycles: int, config: DecoderConfig, *, load: bool = True,
              say: Callable[[str], None] = print) -> list[SyncTiming] | None:
    """Start ``engines`` ranks, run ``cycles`` syncs; None when one did not commit or a
    rank decoded differently from the trainer."""
    folder = tempfile.mkdtemp(prefix="ctlwire-torch-")
    address = f"ipc://{folder}/control.sock"
    env = dict(os.environ, CTLWIRE_TORCH_CONFIG=msgspec.json.encode(config).decode())
    fleet = EngineFleet(engines, lambda r: ["--connect", address, "--methods", METHODS,
                                             "--mode", "loop"],
                        env=env, ready_timeout=180)
    trainer = Trainer(config)
    params = sum(p.numel() for p in trainer.model.parameters())
    say(f"model: {params / 1e6:.1f}M parameters, {engines} engine ranks")
    timings: list[SyncTiming] = []
    async with ControlClient(ZmqRouterClientTransport(address), ranks=engines,
                             default_timeout=60.0) as client:
        await anyio.to_thread.run_sync(fleet.start)
        try:
            await client.wait_ready(timeout=60)
            runner = OperationRunner(client)
            for cycle in range(1, cycles + 1):
                if load:  # sequences in flight, which the pause aborts
                    await client.fan_out("submit", Submit([[1, 2, 3]] * 4, 10_000),
                                         mode="concurrent")
                loss = trainer.train(steps=2)
                sync = await trainer.sync(runner, update_timeout=120)
                if not sync.result.ok:
                    say(f"cycle {cycle}: {sync.result.summary()} {sync.sender_error}")
                    return None
                info = await client.fan_out("get_server_info", mode="concurrent")
                ranks = list(info.results.values())
                methods = [s.method for s in sync.plan.steps]
                data, engine = split(sync.seconds, [v["handler_s"] for v in ranks],
                                     [v["last_update"] for v in ranks], methods)
                expected = trainer.greedy(PROMPTS, 8)
                out = await client.fan_out("generate", Generate(PROMPTS, 8), mode="concurrent")
                equal = (len(out.results) == engines
                         and all(v == expected for v in out.results.values()))
                t = SyncTiming(sync.seconds, data, engine, equal)
                timings.append(t)
                say(f"cycle {cycle}: loss {loss:.3f}, version {sync.version} committed in "
                    f"{t.total * 1e3:.0f} ms (data {t.data * 1e3:.0f} ms, engines "
                    f"{t.engine * 1e3:.0f} ms, ctlwire {t.control * 1e3:.1f} ms); "
                    f"every rank decodes like the trainer: {equal}")
                say(f"  {_per_rank(sync)}")
                if not equal:
                    return None
            info = await client.fan_out("get_server_info", mode="concurrent")
            for r, v in sorted(info.results.items()):
                say(f"rank {r}: version {v['version']} ({v['checksum'][:12]}), "
                    f"{v['tokens_per_s']:.0f} tokens/s, {v['aborted']} sequences aborted")
        finally:
            await client.aclose()
            await anyio.to_thread.run_sync(fleet.stop)
    return timings


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-width", type=int, default=256, help="model width (256: ~1.7M "
                   "parameters with 2 layers; 768 with 8 layers: ~57M)")
    p.add_argument("--model-layers", type=int, default=2)


def demo(engines: int, cycles: int, width: int, layers: int, backend: str) -> int:
    config = DecoderConfig(width=width, layers=layers)
    timings = anyio.run(run, engines, cycles, config, backend=backend)
    print("OK" if timings is not None else "FAILED")
    return 0 if timings is not None else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    add_arguments(parser)
    args = parser.parse_args(argv)
    return demo(args.engines, args.cycles, args.model_width, args.model_layers, args.backend)


if __name__ == "__main__":
    sys.exit(main())
