"""The ctlwire command line: keys and argument handling."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from ctlwire.app.arguments import UsageError
from ctlwire.app.cli import main
from ctlwire.transports.curve import load_keypair, load_public_key


def test_keys_generate_writes_loadable_owner_only_secrets(tmp_path: Path) -> None:
    assert main(["keys", "generate", str(tmp_path), "api", "engine-0"]) == 0
    for name in ("api", "engine-0"):
        pair = load_keypair(tmp_path / f"{name}.key_secret")
        assert load_public_key(tmp_path / f"{name}.key") == pair.public
        assert len(pair.public) == 40 and len(pair.secret) == 40
        assert stat.S_IMODE((tmp_path / f"{name}.key_secret").stat().st_mode) == 0o600


def test_unknown_command_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """main(argv) as the shell sees it: exit code, stdout, stderr."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("argv", [[], ["demo"], ["diagrams"], ["keys"], ["keys", "generate"],
                                  ["bench"]], ids=lambda a: " ".join(a) or "ctlwire")
def test_help_is_plain_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run([*argv, "--help"], capsys)
    assert code == 0 and out.startswith("usage: ctlwire")
    for markup in ("``", ":class:", ":mod:", ":meth:", ":func:", "~ctlwire"):
        assert markup not in out, f"raw reStructuredText {markup!r} in:\n{out}"


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    import ctlwire.kernel

    code, out, _ = _run(["--version"], capsys)
    assert code == 0
    assert out.strip() == f"ctlwire {version('ctlwire')}" == f"ctlwire {ctlwire.kernel.__version__}"


@pytest.mark.parametrize(("argv", "says"), [
    (["demo", "--engines", "0"], "--engines: must be at least 1, got 0"),
    (["demo", "--engines", "-3"], "--engines: must be at least 1"),
    (["demo", "--cycles", "0"], "--cycles: must be at least 1, got 0"),
    (["demo", "--cycles", "-1"], "--cycles: must be at least 1"),
    (["demo", "--cycles", "two"], "--cycles: expected a whole number"),
    (["demo", "--slow-update", "-1"], "--slow-update: must be a finite number >= 0"),
    (["demo", "--slow-update", "nan"], "--slow-update: must be a finite number >= 0"),
    (["bench", "--runs", "0"], "--runs: must be at least 1"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_argument_errors_are_one_line_and_exit_2(argv: list[str], says: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(argv, capsys)
    assert code == 2
    assert says in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("ctlwire") and "Traceback" not in err and out == ""


def test_keys_generate_creates_the_folder_it_names(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "keys"
    code, out, _ = _run(["keys", "generate", str(target), "api"], capsys)
    assert code == 0 and (target / "api.key_secret").exists()
    assert str(target / "api.key") in out


@pytest.mark.parametrize("argv", [
    ["keys", "generate", "{missing}/keys", "alice"],
    ["diagrams", "--out", "{missing}/diagrams"],
    ["demo", "--json", "{missing}/demo.json"],
    ["bench", "--json", "{missing}/bench.json"],
], ids=lambda a: " ".join(a))
def test_no_folder_is_created_that_was_not_asked_for(
        argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder named on the command line is created, but not the missing folders above
    it (as mkdir without -p): a typo in a path creates nothing."""
    missing = tmp_path / "nonexistent" / "dir"
    code, out, err = _run([a.replace("{missing}", str(missing)) for a in argv], capsys)
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"{missing} does not exist" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("address", "says"), [
    ("tcp://127.0.0.1:9", "--allow-insecure-tcp"),
    ("ipc://{tmp}/nonexistent/dir/engine.sock", "{tmp}/nonexistent/dir does not exist"),
    ("ipc://{tmp}/engine.sock", "no engine socket at {tmp}/engine.sock"),
    ("udp://127.0.0.1:9", "--connect udp://127.0.0.1:9: expected an ipc:// or tcp:// address"),
], ids=["tcp-without-flag", "ipc-missing-folder", "ipc-no-socket", "unknown-scheme"])
def test_demo_connect_errors_name_the_flag_or_the_path(
        address: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    start = time.monotonic()
    code, out, err = _run(["demo", "--connect", address.replace("{tmp}", str(tmp_path))],
                          capsys)
    assert code == 2, (out, err)
    assert time.monotonic() - start < 10  # refused at once, not after the 30 s wait
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("ctlwire demo: error: ") and says.replace("{tmp}", str(tmp_path)) in err
    assert list(tmp_path.iterdir()) == []


def test_demo_connect_to_a_socket_no_engine_answers_names_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A socket is there but no engine answers on it: one line naming the address,
    after the wait for the engines (shortened here)."""
    import zmq

    from ctlwire.app import demo

    address = f"ipc://{tmp_path}/engine.sock"
    with zmq.Context() as ctx, ctx.socket(zmq.ROUTER) as silent:
        silent.bind(address)  # binds, never answers
        cfg = demo.DemoConfig(connect=[address], cycles=1, ready_timeout=0.5)
        with pytest.raises(UsageError) as info:
            demo.main(cfg)
        silent.close(linger=0)
    assert address in str(info.value) and "\n" not in str(info.value)
    assert "--connect" in str(info.value)


@pytest.mark.parametrize("argv", [
    ["keys", "generate", "{file}/keys"],
    ["keys", "generate", "{file}"],
    ["diagrams", "--out", "{file}/diagrams"],
    ["diagrams", "--out", "{file}"],
    ["demo", "--json", "{file}/demo.json"],
    ["bench", "--json", "{file}/bench.json"],
], ids=lambda a: " ".join(a))
def test_a_folder_that_cannot_be_created_is_refused_in_one_line(
        argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A path under a plain file can never be a folder: refused before any work starts."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, out, err = _run([a.replace("{file}", str(blocker)) for a in argv], capsys)
    assert code == 2, (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert str(blocker) in err
    assert blocker.read_text() == "not a folder"


def test_keys_generate_refuses_to_overwrite_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(["keys", "generate", str(tmp_path), "api"], capsys)[0] == 0
    code, _, err = _run(["keys", "generate", str(tmp_path), "api"], capsys)
    assert code == 2 and "--force" in err and len(err.strip().splitlines()) == 1


def test_diagrams_without_graphviz_leave_no_folder(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "graphviz", None)  # import graphviz -> ImportError
    out = tmp_path / "diagrams"
    code, _, err = _run(["diagrams", "--format", "dot", "--out", str(out)], capsys)
    assert code == 2 and "graphviz" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_diagrams_create_a_missing_folder(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "diagrams"
    code, printed, _ = _run(["diagrams", "--out", str(out)], capsys)
    assert code == 0 and (out / "README.md").exists()
    assert str(out / "control_request.mmd") in printed


def test_the_installed_command_reports_a_bad_count_without_a_traceback() -> None:
    """The console script itself, as a user runs it (a real process)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "ctlwire.app.cli", "demo",
                           "--engines", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("ctlwire demo: error: argument --engines: must be at least "
                                   "1, got 0 (see 'ctlwire demo --help')")
    assert proc.stdout == ""


def test_demo_torch_without_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    import ctlwire.app

    monkeypatch.setitem(sys.modules, "torch", None)  # as if not installed
    for name in [m for m in sys.modules if m.startswith("ctlwire.app.torch_")]:
        monkeypatch.delitem(sys.modules, name)  # imported again, from the package too
        monkeypatch.delattr(ctlwire.app, name.rsplit(".", 1)[1], raising=False)
    assert main(["demo", "--torch"]) == 2
    assert "pip install 'ctlwire[torch]'" in capsys.readouterr().err


def test_demo_membership_etcd_refuses_what_does_not_apply(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--membership", "etcd", "--kill-one"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--kill-one does not apply" in err


def test_demo_membership_etcd_without_the_etcd_binary_names_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert main(["demo", "--membership", "etcd"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs the etcd binary" in err


def test_bench_help_lists_every_group_the_bench_runs(capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    from ctlwire.app.cli import BENCH_GROUPS
    from ctlwire.benchmarks.runner import GROUPS

    assert BENCH_GROUPS == GROUPS
    code, out, _ = _run(["bench", "--help"], capsys)
    listed = " ".join(out.split())  # the help wraps lines
    assert code == 0 and all(f" {group}" in listed for group in GROUPS)
    for group in ("poll_status", "engine_calls", "cpu", "import_time"):
        assert f" {group}" in listed


def test_diagrams_help_says_where_it_writes_outside_a_checkout(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["diagrams", "--help"], capsys)
    assert code == 0 and "./diagrams" in " ".join(out.split())


@pytest.mark.parametrize("argv", [["demo", "--bogus"], ["keys", "generate", "d", "--bogus"],
                                  ["bench", "--quick", "--bogus"]])
def test_an_unknown_flag_points_to_its_commands_help(argv: list[str],
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    code, out, err = _run(argv, capsys)
    command = " ".join(argv[:2] if argv[0] == "keys" else argv[:1])
    assert code == 2 and out == ""
    assert err.strip() == (f"ctlwire {command}: error: unrecognized arguments: --bogus "
                           f"(see 'ctlwire {command} --help')")


def test_the_command_line_reads_the_version_only_when_asked() -> None:
    import subprocess
    import sys

    code = ("import sys; from ctlwire.app.cli import build_parser; build_parser(); "
            "print('importlib.metadata' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_importing_the_kernel_reads_no_package_metadata() -> None:
    import subprocess
    import sys

    code = ("import sys, ctlwire.kernel; before = 'importlib.metadata' in sys.modules; "
            "version = ctlwire.kernel.__version__; print(before, version)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    from importlib.metadata import version

    assert done.stdout.split() == ["False", version("ctlwire")], done.stderr
