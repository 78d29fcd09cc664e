"""Ordered pipelining end to end: real engine processes over real ZeroMQ sockets, both
anyio backends. Every engine records the order requests arrive in (``mark``); the
callers record the order they complete in; both must be the admission order, with
several fan-outs in flight at once.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import pytest

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.core.admission_queue import Ticket
from ctlwire.states import TicketEvent, TicketState
from ctlwire.transports.zmq_client import ZmqRouterClientTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]
METHODS = "ctlwire.app.engine_process:diagnostic_methods"
RANKS = 4
DEPTH = 4
CALLERS = 300


@pytest.fixture
def ipc_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("pipe")
    os.chmod(d, 0o700)
    return str(d)


async def test_every_rank_receives_and_every_caller_completes_in_admission_order(
        ipc_dir: str) -> None:
    address = f"ipc://{ipc_dir}/c.sock"
    with EngineFleet(RANKS, lambda r: ["--connect", address, "--mode", "poll",
                                       "--methods", METHODS]):
        async with ControlClient(ZmqRouterClientTransport(address), ranks=RANKS,
                                 pipeline={"mark": DEPTH}) as c:
            await c.wait_ready(timeout=20)
            queue = c.mailbox("mark").queue
            admitted_seqs: list[int] = []
            tokens: dict[int, str] = {}
            most_in_flight = 0

            def observe(t: Ticket, old: TicketState, event: TicketEvent,
                        new: TicketState) -> None:
                nonlocal most_in_flight
                if event is TicketEvent.ADMIT:
                    admitted_seqs.append(t.seq)
                most_in_flight = max(most_in_flight, queue.in_flight)

            queue.observers.append(observe)
            real_arrive = queue.arrive
            arriving = [""]

            def arrive(waiter: Any = None) -> Ticket:
                ticket = real_arrive(waiter)
                tokens[ticket.seq] = arriving[0]
                return ticket

            queue.arrive = arrive  # type: ignore[method-assign]
            completed: list[str] = []

            async def caller(i: int) -> None:
                token = f"t{i}"
                arriving[0] = token  # read by arrive(), before the first await
                res = await c.fan_out("mark", token, timeout=60)
                assert res.ok and set(res.results) == set(range(RANKS))
                completed.append(token)

            async with anyio.create_task_group() as tg:
                for i in range(CALLERS):
                    tg.start_soon(caller, i)
            marks = await c.fan_out("marks", mode="concurrent")
            admitted = [tokens[seq] for seq in admitted_seqs]
            assert len(admitted) == CALLERS == len(set(admitted))
            for rank in range(RANKS):
                assert marks.results[rank] == admitted, rank  # received in admission order
            assert completed == admitted  # completed in admission order
            assert 2 <= most_in_flight <= DEPTH  # several in flight, never more than k
            assert c.registry.live_count == 0 and not queue.busy
