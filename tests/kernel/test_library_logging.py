"""A library does not print unless asked: with logging not configured, a lost
engine reaches no stream; configured, it is logged under ``ctlwire.client``.

Real processes, because the question is what a fresh interpreter writes to
stderr (Python's last-resort handler prints warnings when no handler exists)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent('''
    import logging, sys
    import anyio
    from ctlwire.kernel import EngineDead
    from ctlwire.testing import EngineHarness

    if sys.argv[1:] == ["configured"]:
        logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")

    def setup(endpoint):
        @endpoint.method()
        def ping() -> int:
            return 1

    async def main():
        async with EngineHarness(2, setup, heartbeat_interval=0.05) as h:
            assert await h.client.call("ping", rank=1) == 1
            h.stop_engine(1)                      # the client sees rank 1 lost
            try:
                await h.client.call("ping", rank=1, timeout=5)
            except EngineDead:
                pass
        print("done")

    anyio.run(main)
''')


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "lose_an_engine.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "done\n", proc.stdout + proc.stderr
    return proc


def test_nothing_reaches_stderr_unless_logging_is_configured(tmp_path: Path) -> None:
    assert _run(tmp_path).stderr == ""


def test_a_lost_engine_is_logged_once_logging_is_configured(tmp_path: Path) -> None:
    err = _run(tmp_path, "configured").stderr
    assert "ctlwire.client WARNING" in err and "engine rank 1 lost" in err, err


def test_the_library_logger_has_a_null_handler() -> None:
    import logging

    import ctlwire.kernel  # noqa: F401

    handlers = logging.getLogger("ctlwire").handlers
    assert any(isinstance(h, logging.NullHandler) for h in handlers)
