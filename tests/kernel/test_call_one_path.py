"""``ControlClient.call``'s one-frame path (``CallIssuer.call_one``): the same
request frame, the same transitions and the same outcomes as the general path
(``call_core``, ``send_all``, ``wait_outcome``) that a call with ``on_progress``
still takes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from ctlwire.kernel.call_issuer import CallIssuer
from ctlwire.kernel.control_client import ControlClient
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import RemoteError
from ctlwire.transports.envelope import Envelope, Request
from ctlwire.transports.zmq_client import ZmqRouterClientTransport
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

pytestmark = pytest.mark.timeout(60)


class Recording(ZmqRouterClientTransport):
    """Records every request frame the client hands over (encoded or as an envelope)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[Envelope] = []

    def send_encoded_nowait(self, rank: int, data: bytes) -> None:
        self.sent.append(self.codec.decode(data))
        super().send_encoded_nowait(rank, data)

    def send_nowait(self, rank: int, envelope: Envelope) -> None:
        self.sent.append(envelope)
        super().send_nowait(rank, envelope)


@pytest.mark.anyio
async def test_call_sends_and_steps_as_the_general_path_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one_frame = 0
    call_one = CallIssuer.call_one

    async def counting(self: CallIssuer, *args: Any, **kwargs: Any) -> Any:
        nonlocal one_frame
        one_frame += 1
        return await call_one(self, *args, **kwargs)

    monkeypatch.setattr(CallIssuer, "call_one", counting)
    steps: dict[int, list[tuple[str, str, str]]] = {}
    transport = Recording(f"ipc://{tmp_path}/c.sock")
    async with ControlClient(
            transport, ranks=2, default_timeout=10.0,
            observer=lambda e, old, ev, new: steps.setdefault(e.id, []).append(
                (old.name, ev.value, new.name))) as client, \
            anyio.create_task_group() as tg:
        for rank in (0, 1):
            ep = EngineEndpoint(ZmqDealerEngineTransport(transport.address, rank))
            ep.register("echo", lambda x=None: x)

            def fail(x: Any = None) -> None:
                raise KeyError("no such weights")

            ep.register("fail", fail)
            await tg.start(ep.serve)
        await client.wait_ready(timeout=10)
        outcomes = []
        for watched in (False, True, False, True):
            kwargs: dict[str, Any] = {"on_progress": lambda r, p: None} if watched else {}
            before = time.time()
            outcomes.append(await client.call("echo", {"n": 1}, rank=1, timeout=5.0,
                                              idempotency_key="k", fence=7, **kwargs))
            with pytest.raises(RemoteError) as info:
                await client.call("fail", rank=1, **kwargs)
            outcomes.append((info.value.type_name, info.value.rank))
            assert transport.sent[-2].deadline == pytest.approx(before + 5.0, abs=0.5)
        assert one_frame == 4  # the calls without on_progress took the one-frame path
        tg.cancel_scope.cancel()
    assert outcomes == [{"n": 1}, ("KeyError", 1)] * 4
    sent = [s for s in transport.sent if type(s) is Request]
    assert len(sent) == 8
    # the same frame either way, bar the id, the seq (one more per frame to the rank)
    # and the deadline
    assert [s.seq for s in sent] == list(range(1, 9))
    assert len({(s.rank, s.method, bytes(s.payload), s.key, s.fence, s.client, s.trace)
                for s in sent[0::2]}) == 1
    assert len({(s.rank, s.method, bytes(s.payload), s.key, s.fence, s.client, s.trace)
                for s in sent[1::2]}) == 1
    assert sent[0].fence == 7 and sent[0].key == "k" and sent[1].fence == 0
    # and the same transitions, request by request
    paths = [steps[s.id] for s in sent]
    assert paths[0] == paths[2] == paths[4] == paths[6]
    assert paths[1] == paths[3] == paths[5] == paths[7]
    assert paths[0][0] == ("REGISTERED", "send", "SENT")
    assert paths[0][-1][2] == "CLEANED"
    assert client.registry.live_count == 0


@pytest.mark.anyio
async def test_a_call_cancelled_while_it_waits_leaves_nothing_and_a_late_reply_is_counted(
        tmp_path: Path) -> None:
    transport = ZmqRouterClientTransport(f"ipc://{tmp_path}/c.sock")
    release = anyio.Event()
    async with ControlClient(transport, ranks=1, default_timeout=10.0) as client, \
            anyio.create_task_group() as tg:
        ep = EngineEndpoint(ZmqDealerEngineTransport(transport.address, 0))

        async def slow() -> str:
            await release.wait()
            return "late"

        ep.register("slow", slow)
        await tg.start(ep.serve)
        await client.wait_ready(timeout=10)
        with anyio.move_on_after(0.2) as scope:
            await client.call("slow")
        assert scope.cancelled_caught
        assert client.registry.live_count == 0
        release.set()
        with anyio.fail_after(5):
            while client.registry.stats.late == 0:
                await anyio.sleep(0.01)
        assert await client.call("ctlwire.metrics") is not None
        tg.cancel_scope.cancel()
    assert client.registry.stats.cleaned == 2
