"""BusyLoop on real processes: a synchronous loop whose socket an I/O thread owns.

Read-only methods are answered while the loop's thread is held by a
state-changing method or by a step (checked by the engine's published state,
never by time); state-changing methods run on the loop's thread, keep their
idempotency keys and fences; a closed loop fails the calls waiting for it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from ctlwire.app.engine_fleet import EngineFleet
from ctlwire.kernel.client.control_client import ControlClient
from ctlwire.kernel.engine.busy_loop import BusyLoop
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import RemoteError
from ctlwire.transports.zmq_client import ZmqRouterClientTransport
from ctlwire.transports.zmq_engine import ZmqDealerEngineTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

ENGINES = Path(__file__).parent / "busy_loop_engines"


@pytest.fixture
def engine(tmp_path: Path, anyio_backend: str) -> Iterator[tuple[str, Path]]:
    """One ``--mode loop`` engine process (its I/O thread on the test's backend)."""
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/control.sock"
    release = tmp_path / "release"
    release.mkdir()
    env = {**os.environ, "BUSY_RELEASE": str(release), "PYTHONPATH": os.pathsep.join(
        p for p in (str(ENGINES), os.environ.get("PYTHONPATH")) if p)}
    with EngineFleet(1, lambda r: ["--connect", address, "--mode", "loop", "--backend",
                                   anyio_backend, "--methods", "busy_engine:register"],
                     env=env):
        yield address, release


def client_for(address: str) -> ControlClient:
    return ControlClient(ZmqRouterClientTransport(address), ranks=1, default_timeout=20.0)


async def wait_for_phase(client: ControlClient, phase: str) -> dict[str, Any]:
    """``get_status`` until it reports ``phase``: each call must be answered (5 s)."""
    with anyio.fail_after(60):
        while True:
            status: dict[str, Any] = await client.call("get_status", rank=0, timeout=5)
            if status["phase"] == phase:
                return status
            await anyio.sleep(0.01)


async def test_read_only_answered_while_a_state_changing_method_holds_the_loop(
        engine: tuple[str, Path]) -> None:
    address, release = engine
    async with client_for(address) as client:
        await client.wait_ready(timeout=30)
        done: list[int] = []

        async def update() -> None:
            done.append(await client.call("long_update", "u1", rank=0, timeout=60))

        async with anyio.create_task_group() as tg:
            tg.start_soon(update)
            status = await wait_for_phase(client, "update:u1")
            assert status["thread"] != "MainThread"  # answered by the I/O thread
            assert not done  # the update still holds the loop's thread
            (release / "u1").touch()
        assert done == [1]
        assert (await client.call("get_status", rank=0))["phase"] == "idle"


async def test_read_only_answered_while_a_step_holds_the_loop(
        engine: tuple[str, Path]) -> None:
    address, release = engine
    async with client_for(address) as client:
        await client.wait_ready(timeout=30)
        await client.call("block_step", "s1", rank=0)
        await wait_for_phase(client, "step:s1")
        (release / "s1").touch()
        await wait_for_phase(client, "idle")
        # a state-changing method ran after the step, on the loop's thread
        assert await client.call("where", rank=0) == "MainThread"


async def test_progress_reported_on_the_loops_thread_reaches_the_caller(
        engine: tuple[str, Path]) -> None:
    address, release = engine
    heard = anyio.Event()

    def on_progress(rank: int, progress: Any) -> None:
        if progress.note == "half of p1":
            heard.set()

    async with client_for(address) as client:
        await client.wait_ready(timeout=30)
        done: list[bool] = []

        async def update() -> None:
            done.append(await client.call("progress_update", "p1", rank=0, timeout=60,
                                          on_progress=on_progress))

        async with anyio.create_task_group() as tg:
            tg.start_soon(update)
            with anyio.fail_after(60):
                await heard.wait()  # heard while the handler still holds the loop
            assert not done
            (release / "p1").touch()
        assert done == [True]


async def test_keys_and_fences_hold_for_methods_run_by_the_loop(
        engine: tuple[str, Path]) -> None:
    address, release = engine
    for name in ("k1", "k2"):
        (release / name).touch()
    async with client_for(address) as client:
        await client.wait_ready(timeout=30)
        first = await client.call("long_update", "k1", rank=0, idempotency_key="same")
        again = await client.call("long_update", "k2", rank=0, idempotency_key="same")
        assert first == again == 1  # the second call was answered from the first run
        await client.call("long_update", "k1", rank=0, fence=2_000_000)
        with pytest.raises(RemoteError) as refused:
            await client.call("long_update", "k1", rank=0, fence=1_000_000)
        assert refused.value.code == 409
        assert (await client.call("get_status", rank=0))["updates"] == 2


def test_close_fails_the_calls_waiting_for_the_loop(tmp_path: Path) -> None:
    """In one process: the loop never polls; closing it answers the waiting call."""
    os.chmod(tmp_path, 0o700)
    address = f"ipc://{tmp_path}/control.sock"
    endpoint = EngineEndpoint(ZmqDealerEngineTransport(address, 0))
    loop = BusyLoop(endpoint)

    @endpoint.method()
    def change() -> int:
        return 1

    outcome: list[BaseException | int] = []

    async def caller() -> None:
        async with client_for(address) as client:
            await client.wait_ready(timeout=30)
            try:
                outcome.append(await client.call("change", rank=0, timeout=30))
            except Exception as exc:
                outcome.append(exc)

    thread = threading.Thread(target=anyio.run, args=(caller,))
    with loop:
        thread.start()
        while not loop.waiting:  # the call reached the loop, which never polls
            thread.join(0.01)
            assert thread.is_alive()
    thread.join(30)
    (error,) = outcome  # the call ended: answered LoopStopped, or its engine gone
    assert isinstance(error, Exception)
    assert loop.waiting == 0
