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


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once: ``mkdocs build --strict`` (a broken link, a missing page,
    an API object that cannot be found or a missing included file fails it)."""
    folder = tmp_path_factory.mktemp("docs") / "site"
    env = {**_env(), "NO_MKDOCS_2_WARNING": "1"}
    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                          str(folder)], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    return folder


def test_the_site_builds_with_warnings_as_errors(site: Path) -> None:
    assert (site / "reference" / "kernel" / "index.html").exists()
    assert (site / "benchmarks" / "index.html").exists()


def _reference(site: Path) -> dict[str, str]:
    """id of every object the API reference documents -> the HTML of its section
    (its heading and signature up to its docstring)."""
    sections = {}
    for page in sorted((site / "reference").rglob("index.html")):
        html = page.read_text()
        for m in re.finditer(r'<h\d id="(ctlwire\.[\w.]+)" class="doc doc-heading">', html):
            end = html.find('<div class="doc doc-contents', m.end())
            sections[m.group(1)] = html[m.start():end]
    return sections


def _text(html: str) -> str:
    import html as html_module

    return html_module.unescape(re.sub(r"<[^>]+>", "", html))


def _object(path: str) -> object:
    import importlib

    module, _, name = path.rpartition(".")
    while module:
        try:
            found: object = importlib.import_module(module)
        except ImportError:
            module, _, outer = module.rpartition(".")
            name = f"{outer}.{name}"
            continue
        for part in name.split("."):
            found = getattr(found, part)
        return found
    raise LookupError(path)


PUBLIC = ("ctlwire.kernel", "ctlwire.transports", "ctlwire.states", "ctlwire.testing",
          "ctlwire.testing.faults")


def test_every_public_class_is_in_the_reference_with_its_signature_and_fields(
        site: Path) -> None:
    """Every class a public package exports has a section in the API reference whose
    heading shows its constructor's signature (each parameter by name), and every
    field of a dataclass or msgspec Struct has an entry of its own."""
    import dataclasses
    import enum
    import importlib
    import inspect

    import msgspec

    sections = _reference(site)
    documented = {}
    for path in sections:
        try:
            documented[id(_object(path))] = path
        except (LookupError, AttributeError):
            continue
    problems = []
    for package in PUBLIC:
        module = importlib.import_module(package)
        for name in module.__all__:
            cls = getattr(module, name)
            if not inspect.isclass(cls):
                continue
            path = documented.get(id(cls))
            if path is None:
                problems.append(f"{package}.{name}: not in the API reference")
                continue
            if issubclass(cls, enum.Enum) or getattr(cls, "_is_protocol", False):
                continue  # no constructor to call (a protocol, an enum and its members)
            section = sections[path]
            signature = _text(section[section.find('<div class="doc-signature'):])
            try:
                params = inspect.signature(cls).parameters
            except (TypeError, ValueError):
                params = {}
            if not any("__init__" in vars(c) for c in cls.__mro__
                       if c.__module__.startswith("ctlwire")):
                continue  # an exception with Exception's own constructor
            if not signature.lstrip().startswith(f"{cls.__name__}("):
                problems.append(f"{path}: no constructor signature in its heading")
            missing = [p for p in params if p not in signature and p not in ("args", "kwargs")]
            if missing:
                problems.append(f"{path}: signature lacks {missing}")
            fields: tuple[str, ...] = ()
            if dataclasses.is_dataclass(cls):
                fields = tuple(f.name for f in dataclasses.fields(cls))
            elif issubclass(cls, msgspec.Struct):
                fields = cls.__struct_fields__
            lacking = [f for f in fields if not f.startswith("_") and f"{path}.{f}" not in sections]
            if lacking:
                problems.append(f"{path}: fields without an entry: {lacking}")
    assert problems == [], "\n".join(problems)


def test_the_reference_points_to_nothing_it_does_not_render(site: Path) -> None:
    for page in sorted((site / "reference").rglob("index.html")):
        text = _text(page.read_text())
        assert "module docstring" not in text, f"{page}: says 'see the module docstring'"


# What fits in a code block at 1,280 px: the theme's root font is 20 px there; the
# layout (docs/stylesheets/extra.css) spans the window, less two sidebars of 12.1 rem
# and the content's margins of 1.2 rem each side; code is 0.85 x 0.8 rem (13.6 px)
# monospace, 0.6 em a character, inside a padding of 1.18 em each side.
FIT = int((1280 - 2 * 12.1 * 20 - 2 * 1.2 * 20 - 2 * 1.1765 * 13.6) / (0.6 * 13.6))


def test_code_blocks_fit_the_page_at_1280_px(site: Path) -> None:
    assert FIT >= 80  # the arithmetic above: 87 characters
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text()
    assert ".md-grid" in css and "max-width" in css  # the layout the arithmetic assumes
    wide = []
    for page in sorted(site.rglob("*.html")):
        for block in re.findall(r"<pre[^>]*>(.*?)</pre>", page.read_text(), re.S):
            for line in _text(block).split("\n"):
                if len(line.rstrip()) > FIT:
                    wide.append(f"{page.relative_to(site)}: {len(line.rstrip())}: {line}")
    assert wide == [], f"{len(wide)} code lines wider than {FIT} characters:\n" + "\n".join(
        wide)


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
