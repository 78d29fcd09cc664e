"""The docs site builds with warnings as errors, and its python blocks run.

A fenced python block in ``docs/`` runs as a script, unless its title (shown
above the block on the site) says otherwise:

* ``title="test_....py"`` -- a test file: run by pytest in an empty folder, with
  the installed ctlwire plugin and no conftest;
* ``title="Fragment: <what it needs>"`` -- needs setup the page describes
  (a running fleet, a web server): compiled, not run, and the title says why.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
FENCE = re.compile(r'^```python(?P<attrs>[^\n]*)\n(?P<code>.*?)^```[ \t]*$', re.M | re.S)
TITLE = re.compile(r'title="([^"]*)"')


def blocks() -> list[tuple[str, str, str]]:
    """(where, kind, code) for every python block: kind is script, pytest or fragment."""
    out = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        for m in FENCE.finditer(text):
            title_match = TITLE.search(m.group("attrs"))
            title = title_match.group(1) if title_match else ""
            line = text.count("\n", 0, m.start()) + 1
            where = f"{page.relative_to(ROOT)}:{line}"
            if title.startswith("Fragment:"):
                kind = "fragment"
            elif re.fullmatch(r"test_\w+\.py", title):
                kind = "pytest"
            else:
                kind = "script"
            out.append((where, kind, m.group("code")))
    return out


BLOCKS = blocks()


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def test_the_pages_have_blocks_of_every_kind() -> None:
    kinds = [kind for _, kind, _ in BLOCKS]
    assert kinds.count("script") >= 5 and "pytest" in kinds and "fragment" in kinds, kinds
    for page in DOCS.rglob("*.md"):  # every python block is one the test can see
        assert "```py\n" not in page.read_text(), f"{page}: write ```python"


@pytest.mark.parametrize(("where", "kind", "code"), BLOCKS, ids=[b[0] for b in BLOCKS])
def test_docs_block(where: str, kind: str, code: str, tmp_path: Path) -> None:
    if kind == "fragment":
        compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)  # it still parses
        return
    if kind == "pytest":
        (tmp_path / "test_docs_block.py").write_text(code)
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "test_docs_block.py"], cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"{where}:\n{out.stdout}{out.stderr}"
        assert " passed" in out.stdout and "skipped" not in out.stdout, out.stdout
        return
    script = tmp_path / "docs_block.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"{where}:\n{out.stdout}{out.stderr}"


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    """``mkdocs build --strict``: a broken link, a missing page, an API object
    that cannot be found or a missing included file fails it."""
    env = {**_env(), "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                          str(tmp_path / "site")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (tmp_path / "site" / "reference" / "kernel" / "index.html").exists()
    assert (tmp_path / "site" / "benchmarks" / "index.html").exists()


def test_every_state_diagram_is_on_the_diagrams_page() -> None:
    page = (DOCS / "diagrams.md").read_text()
    files = sorted(p.name for p in (ROOT / "diagrams").glob("*.mmd"))
    assert files
    for name in files:
        assert f'--8<-- "diagrams/{name}"' in page, name


def test_every_library_logger_is_documented() -> None:
    """Logger names are found, not guessed: each one the code uses is in the
    observability page's table."""
    used = set()
    for folder in ("kernel", "transports", "states"):
        for path in (ROOT / folder).rglob("*.py"):
            used |= set(re.findall(r'getLogger\("(ctlwire[\w.]*)"\)', path.read_text()))
    used.discard("ctlwire")  # the parent: it holds the NullHandler
    assert {"ctlwire.client", "ctlwire.curve"} <= used
    page = (DOCS / "observability.md").read_text()
    for name in sorted(used):
        assert f"`{name}`" in page, f"logger {name} is not documented in docs/observability.md"
