"""``python -m ctlwire.app.engine_process``: a problem with its flags is one line
on stderr and exit code 2 (no traceback), and every flag says what it does."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from ctlwire.app import engine_process
from ctlwire.testing import free_tcp_address

PROG = "python -m ctlwire.app.engine_process"


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``main(argv)`` printed; it exited 2 without starting an engine."""
    try:
        code = engine_process.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = int(exc.code or 0)
    out = capsys.readouterr()
    assert code == 2 and out.out == "", out
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{PROG}: error: "), out.err
    return lines[0]


def test_a_missing_key_file_says_it_is_missing(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "engine.key_secret"
    line = _fails(["--rank", "0", "--connect", free_tcp_address(), "--curve-secret",
                   str(secret), "--curve-server-key", str(tmp_path / "client.key")], capsys)
    assert f"--curve-secret {secret}: no such key file" in line
    assert "ctlwire keys generate" in line


def test_a_file_that_is_no_key_says_so(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "engine.key_secret"
    bad.write_text("not a certificate\n")
    line = _fails(["--rank", "0", "--connect", free_tcp_address(), "--curve-secret", str(bad),
                   "--curve-server-key", str(bad)], capsys)
    assert f"--curve-secret {bad}: not a CURVE key file" in line


@pytest.mark.parametrize(("extra", "says"), [
    ([], "tcp without CURVE is refused"),
    (["--curve-secret", "{dir}/x.key_secret"], "--curve-secret {dir}/x.key_secret: no such"),
], ids=["no CURVE", "no server key"])
def test_tcp_without_curve_names_the_flags_that_fix_it(extra: list[str], says: str,
                                                       tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    extra = [e.format(dir=tmp_path) for e in extra]
    line = _fails(["--rank", "0", "--connect", free_tcp_address(), *extra], capsys)
    assert says.format(dir=tmp_path) in line
    if not extra:
        assert "--allow-insecure-tcp" in line and "--curve-secret" in line


@pytest.mark.parametrize(("methods", "says"), [
    ("no_such_module_here:register", "cannot import 'no_such_module_here'"),
    ("json:no_such_function", "'json' has no 'no_such_function'"),
    ("json:__doc__", "'__doc__' is not a function"),
])
def test_a_bad_methods_module_is_one_line(methods: str, says: str, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    tmp_path.chmod(0o700)
    line = _fails(["--rank", "0", "--connect", f"ipc://{tmp_path}/x.sock",
                   "--methods", methods], capsys)
    assert f"--methods {methods}: {says}" in line


@pytest.mark.parametrize(("argv", "says"), [
    (["--rank", "0"], "one of --connect ADDR, --bind ADDR or --pull ADDR --push ADDR"),
    (["--rank", "0", "--connect", "ipc:///tmp/x/y.sock", "--codec", "yaml"], "unknown codec"),
    (["--rank", "0", "--connect", "ipc:///tmp/x/y.sock", "--codec", "pickle"],
     "--codec pickle needs --allow-pickle"),
    (["--rank", "0", "--connect", "ipc://@ctlwire-abstract"], "--allow-abstract-ipc"),
    (["--rank", "0", "--bind", "tcp://127.0.0.1:1", "--curve-secret", "k"], "--curve-allow"),
    (["--connect", "ipc:///tmp/x/y.sock"], "the following arguments are required: --rank"),
], ids=["no address", "codec", "pickle", "abstract ipc", "bind without allow", "no rank"])
def test_other_flag_problems_are_one_line(argv: list[str], says: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert says in _fails(argv, capsys)


def test_every_flag_has_help_text() -> None:
    """Each option's entry in ``--help`` says something after its flags."""
    text = engine_process.parser().format_help()
    options = text[text.index("options:"):]
    entries = re.split(r"\n(?=  -)", options)[1:]  # one entry per option, help included
    assert len(entries) >= 20, entries
    for entry in entries:
        flags, _, rest = entry.strip().partition("  ")
        assert rest.strip() or "\n" in entry.strip(), f"no help text: {flags}"


def test_the_command_itself_prints_no_traceback(tmp_path: Path) -> None:
    """The module run as a user runs it (a real process)."""
    done = subprocess.run([sys.executable, "-m", "ctlwire.app.engine_process", "--rank",
                           "0", "--connect", free_tcp_address()], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and "tcp without CURVE" in done.stderr
