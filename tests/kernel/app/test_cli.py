"""The ctlwire command line: keys and argument handling."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from ctlwire.kernel.app.cli import main
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


def test_demo_torch_without_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # as if not installed
    for name in [m for m in sys.modules if m.startswith("ctlwire.kernel.app.torch_")]:
        monkeypatch.delitem(sys.modules, name)
    assert main(["demo", "--torch"]) == 2
    assert "pip install 'ctlwire[torch]'" in capsys.readouterr().err
