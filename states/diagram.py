"""State diagrams drawn by transitions' ``GraphMachine`` from the machine specs.

The committed files in ``diagrams/`` come from :func:`render`; a test checks they
match. :func:`render_live` draws one request's machine with its current state
highlighted, for debugging. Rendering returns text (or SVG bytes); writing files
is the caller's business.
"""

from __future__ import annotations

import shutil
from enum import Enum
from typing import Any, Literal

from ctlwire.states.transition_table import MachineSpec

__all__ = ["DiagramUnavailable", "Format", "file_name", "render", "render_live"]

Format = Literal["mermaid", "dot", "svg"]


class DiagramUnavailable(RuntimeError):
    """The requested format needs something that is not installed."""


class _Model:
    """A fresh, stateless model for GraphMachine to decorate."""


_Engine = Literal["mermaid", "graphviz"]


def _graph_source(spec: MachineSpec[Any, Any], engine: _Engine, active: Enum | None) -> str:
    from transitions.extensions import GraphMachine

    model = _Model()
    machine = GraphMachine(model=model, graph_engine=engine, show_conditions=False,
                           title=spec.name,
                           **spec.machine_kwargs())
    if active is not None:
        machine.set_state(active, model)
    graph_obj = model.get_graph(force_new=True)  # type: ignore[attr-defined]
    if active is None:
        # GraphMachine styles the model's current (initial) state as active; the
        # static diagram shows no current state.
        machine.model_graphs[id(model)].reset_styling()
        graph_obj = model.get_graph()  # type: ignore[attr-defined]
    if engine == "mermaid":
        source = str(graph_obj.draw(None))
        # transitions writes the title as a bare front-matter line; mermaid wants a key.
        head = f"---\n{spec.name}\n---\n"
        if source.startswith(head):
            source = f"---\ntitle: {spec.name}\n---\n" + source[len(head):]
        source = "\n".join(line.rstrip() for line in source.splitlines())
    else:
        source = str(graph_obj.source)
    return source if source.endswith("\n") else source + "\n"


def _engine_for(fmt: Format) -> _Engine:
    if fmt == "mermaid":
        return "mermaid"
    try:
        import graphviz  # noqa: F401
    except ImportError as exc:
        raise DiagramUnavailable(
            f"format {fmt!r} needs the graphviz Python package: pip install 'ctlwire[diagrams]'"
        ) from exc
    return "graphviz"


def _to_svg(dot_source: str) -> bytes:
    if shutil.which("dot") is None:
        raise DiagramUnavailable(
            "format 'svg' needs Graphviz's 'dot' program on PATH "
            "(Debian: apt-get install graphviz); 'mermaid' needs nothing"
        )
    import graphviz

    return bytes(graphviz.Source(dot_source).pipe(format="svg"))


def render(spec: MachineSpec[Any, Any], fmt: Format = "mermaid") -> str | bytes:
    """The diagram of ``spec`` in ``fmt``; SVG is bytes, the others text.

    Raises :class:`DiagramUnavailable` when ``dot``/``svg`` lack their tools.
    """
    source = _graph_source(spec, _engine_for(fmt), None)
    return _to_svg(source) if fmt == "svg" else source


def render_live(spec: MachineSpec[Any, Any], state: Enum, fmt: Format = "mermaid") -> str | bytes:
    """The diagram of ``spec`` with ``state`` highlighted as the current state."""
    if not isinstance(state, spec.states):
        raise TypeError(f"{state!r} is not a state of {spec.name}")
    source = _graph_source(spec, _engine_for(fmt), state)
    return _to_svg(source) if fmt == "svg" else source


def file_name(spec: MachineSpec[Any, Any], fmt: Format) -> str:
    """The file name a diagram of ``spec`` is written under."""
    ext = {"mermaid": "mmd", "dot": "dot", "svg": "svg"}[fmt]
    snake = "".join("_" + c.lower() if c.isupper() else c for c in spec.name).lstrip("_")
    return f"{snake}.{ext}"
