"""One module asks which async backend runs: :mod:`ctlwire.transports.task_waits`.

Everything that depends on the backend (a task's waiter, an fd watch, the
cancellation check, the loop's clock) is held by the :class:`Backend` that
``current_backend()`` chooses once; no other library module asks sniffio, reads the
running asyncio loop or trio's clock itself. Read from the syntax tree.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("kernel", "transports", "states")
THE_MODULE = Path("transports/task_waits.py")
ASKS = frozenset({"sniffio", "current_async_library", "get_running_loop", "get_event_loop",
                  "current_clock"})


def asks(source: str) -> list[str]:
    """Where ``source`` asks which backend runs: an import of sniffio, or a name or
    attribute of ``ASKS``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in ASKS]
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in ASKS:
                found.append(node.module or "")
            found += [a.name for a in node.names if a.name in ASKS]
        elif isinstance(node, ast.Attribute) and node.attr in ASKS:
            found.append(ast.unparse(node))
    return found


def test_only_the_backend_module_asks_which_backend_runs() -> None:
    found = {str(path.relative_to(ROOT)): hits
             for folder in LIBRARY for path in sorted((ROOT / folder).rglob("*.py"))
             if path.relative_to(ROOT) != THE_MODULE and (hits := asks(path.read_text()))}
    assert found == {}
    assert asks((ROOT / THE_MODULE).read_text())  # it does ask, so the check can see it


def test_the_check_sees_each_way_of_asking() -> None:
    assert asks("import sniffio") == ["sniffio"]
    assert asks("from sniffio import current_async_library") == [
        "sniffio", "current_async_library"]
    assert asks("t = asyncio.get_running_loop().time") == ["asyncio.get_running_loop"]
    assert asks("c = trio.lowlevel.current_clock()") == ["trio.lowlevel.current_clock"]
    assert asks("import anyio\nnow = anyio.current_time()") == []
