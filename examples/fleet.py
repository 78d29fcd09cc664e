"""Start engine processes running ``engine_methods`` (shared by the examples)."""

from __future__ import annotations

import os

from ctlwire.kernel import EngineFleet

HERE = os.path.dirname(os.path.abspath(__file__))


def engine_fleet(ranks: int, address: str, *options: str) -> EngineFleet:
    """``ranks`` engine processes that dial the client's ROUTER at ``address``
    (``options``: more ``engine_process`` arguments, e.g. ``"--heartbeat", "0.05"``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH")) if p)
    return EngineFleet(ranks, lambda rank: ["--connect", address, *options,
                                            "--methods", "engine_methods:register"], env=env)
