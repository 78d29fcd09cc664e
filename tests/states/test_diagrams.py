"""The committed diagrams are exactly what the code generates."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ctlwire.app.cli import main
from ctlwire.app.diagram_files import write_diagrams
from ctlwire.states import CONTROL_REQUEST, MACHINES, RequestState
from ctlwire.states.diagram import DiagramUnavailable, file_name, render, render_live

ROOT = Path(__file__).resolve().parents[2]


def test_committed_diagrams_match_generated(tmp_path: Path) -> None:
    written = write_diagrams(tmp_path, "mermaid")
    assert len(written) == len(MACHINES) + 1
    for path in written:
        committed = ROOT / "diagrams" / path.name
        assert committed.exists(), f"diagrams/{path.name} missing: run 'ctlwire diagrams'"
        assert committed.read_bytes() == path.read_bytes(), (
            f"diagrams/{path.name} is stale: run 'ctlwire diagrams'")


def test_cli_writes_byte_identical_files_twice(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["diagrams", "--out", str(a)]) == 0
    assert main(["diagrams", "--out", str(b)]) == 0
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes()


def test_static_diagram_has_no_active_state_and_every_edge() -> None:
    text = str(render(CONTROL_REQUEST, "mermaid"))
    assert "s_active\n" not in text.replace("classDef s_active", "")
    for event, sources, dest in CONTROL_REQUEST.transitions:
        for src in sources:
            assert f"{src.name} --> {dest.name}: {event.value}" in text
    assert "title: ControlRequest" in text


def test_live_diagram_highlights_current_state() -> None:
    text = str(render_live(CONTROL_REQUEST, RequestState.AWAITING))
    assert "Class AWAITING s_active" in text
    active = [ln.strip() for ln in text.splitlines() if ln.strip().endswith(" s_active")]
    assert active == ["Class AWAITING s_active"]
    with pytest.raises(TypeError):
        render_live(CONTROL_REQUEST, object())  # type: ignore[arg-type]


def test_dot_and_svg_formats() -> None:
    try:
        import graphviz  # noqa: F401
    except ImportError:
        with pytest.raises(DiagramUnavailable):
            render(CONTROL_REQUEST, "dot")
        return
    dot = str(render(CONTROL_REQUEST, "dot"))
    assert dot.startswith("digraph ControlRequest")
    assert "REGISTERED -> SENT [label=send]" in dot
    if shutil.which("dot") is None:
        with pytest.raises(DiagramUnavailable, match="dot"):
            render(CONTROL_REQUEST, "svg")
    else:
        svg = render(CONTROL_REQUEST, "svg")
        assert isinstance(svg, bytes) and b"<svg" in svg


def test_file_names() -> None:
    assert file_name(CONTROL_REQUEST, "mermaid") == "control_request.mmd"
    assert file_name(CONTROL_REQUEST, "svg") == "control_request.svg"
