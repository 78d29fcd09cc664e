"""The README's python blocks run, so they cannot rot; its two commands are the
ones CI runs.

A block runs as a script unless the line before it says otherwise:
``<!-- readme-test: pytest -->`` runs it as a test file under pytest (with the
installed ctlwire plugin, no conftest), ``<!-- readme-test: skip (reason) -->``
skips it, and the reason is required; a skipped block must also say so in the
text a reader sees (the comment itself is invisible on GitHub)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"(?:^(<!-- readme-test: [^\n]*-->)\n)?^```python\n(.*?)^```", re.M | re.S)
INSTALL_AND_DEMO = ("python3 -m venv .venv && .venv/bin/pip install -q -e . && "
                    ".venv/bin/ctlwire demo")
TEST_COMMAND = ".venv/bin/pip install -q -e '.[dev-test]' && .venv/bin/python -m pytest -q"


def blocks() -> list[tuple[int, str, str]]:
    text = README.read_text()
    out = []
    for m in BLOCK.finditer(text):
        line = text.count("\n", 0, m.start(2))
        directive = m.group(1) or "<!-- readme-test: script -->"
        kind = directive.removeprefix("<!-- readme-test: ").removesuffix(" -->")
        out.append((line, kind, m.group(2)))
    return out


BLOCKS = blocks()


def test_every_block_runs_or_says_why_not() -> None:
    kinds = [kind.split()[0] for _, kind, _ in BLOCKS]
    assert set(kinds) <= {"script", "pytest", "skip"}, kinds
    text = README.read_text()
    for line, kind, _ in BLOCKS:
        if kind.startswith("skip"):
            assert re.fullmatch(r"skip \(.{10,}\)", kind), f"README line {line}: say why"
            shown = text.splitlines()[max(0, line - 4):line - 1]
            assert any("not run" in s or "fragment" in s.lower() for s in shown
                       if not s.startswith("<!--")), f"README line {line}: say it visibly"
    assert kinds.count("script") >= 1


def test_the_two_commands_are_the_readmes_and_ci_runs_the_second() -> None:
    text = README.read_text()
    first = text.index("```sh\n")
    assert text[first:].startswith(f"```sh\n{INSTALL_AND_DEMO}\n{TEST_COMMAND}\n```")
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.rstrip().endswith(TEST_COMMAND)


def test_the_first_command_pulls_no_torch_and_the_test_extra_does() -> None:
    """The default demo installs the core dependencies only; CI's dev-test extra brings
    the torch extra (the pinned CPU wheel first), so the real-engine tests run there."""
    project = (ROOT / "pyproject.toml").read_text()

    def listed(name: str) -> str:
        found = re.search(rf"^{name} = \[(.*?)\]$", project, re.M | re.S)
        assert found, name
        return re.sub(r"#[^\n]*", "", found.group(1)).strip()  # comments are not listed

    assert "-e ." in INSTALL_AND_DEMO and "[" not in INSTALL_AND_DEMO
    assert "torch" not in listed("dependencies")
    assert '"ctlwire[torch]"' in listed("dev-test")
    # no extra named like the light one (testing) pulls in the heavy tools
    assert not re.search(r"^test = ", project, re.M)
    assert listed("torch").startswith('"torch==2.13.0"')


def test_the_readme_is_a_five_minute_read() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    # no benchmark logs in the README: they belong on docs/benchmarks.md, history in git
    assert not re.search(r"\b(first|second|third|\w+th) pass\b", text, re.I)
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text)
    assert "the brief" not in text  # a reader has no brief: say what it is
    # no lab notebooks
    for folder in ("benchmarks", "kernel", "states", "transports", "integrations"):
        assert not list((ROOT / folder).rglob("*.md")), folder


def test_the_readmes_links_work_on_a_package_index_page() -> None:
    """A package index shows the README without the repository: every link is
    absolute, to a page the docs site builds or a file of the repository."""
    text = README.read_text()
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert links and all(link.startswith("https://") for link in links), links
    site, repo = "https://ctlwire.github.io/ctlwire/", "https://github.com/ctlwire/ctlwire/"
    for link in links:
        if link.startswith(site):
            page = link[len(site):].split("#")[0].rstrip("/") or "index"
            assert ((ROOT / "docs" / f"{page}.md").exists()
                    or (ROOT / "docs" / page / "index.md").exists()), link
        elif link.startswith(repo):
            path = link[len(repo):].split("/", 2)[2]  # blob/main/PATH or tree/main/PATH
            assert (ROOT / path).exists(), link


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


@pytest.mark.parametrize(("line", "kind", "code"), BLOCKS, ids=[f"line{b[0]}" for b in BLOCKS])
def test_readme_block(line: int, kind: str, code: str, tmp_path: Path) -> None:
    if kind.startswith("skip"):
        pytest.skip(f"README line {line}: {kind}")
    if kind == "pytest":
        (tmp_path / "test_readme_block.py").write_text(code)
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              "test_readme_block.py"], cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"README line {line}:\n{out.stdout}{out.stderr}"
        assert " passed" in out.stdout and "skipped" not in out.stdout, out.stdout
        return
    script = tmp_path / "readme_block.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"README line {line}:\n{out.stdout}{out.stderr}"
