"""The docs a wheel user reads name only what a wheel user has, or link to the
repository: a file of the repository that the wheel does not hold (the examples, the
tests, the Node.js implementation) is named as a link to it, or on a page that links
its folder in the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
REPO = "https://github.com/ctlwire/ctlwire/"
FOLDERS = ("examples", "tests", "interop")
FENCE = re.compile(r"^```.*?^```[ \t]*$", re.M | re.S)
NAMED = re.compile(rf"(?<!\[)`((?:{'|'.join(FOLDERS)})/[^`\s]*)`(?!\]\()")
PAGES = sorted(p for p in DOCS.rglob("*.md") if p.name != "changelog.md")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_repository_files_are_links_to_the_repository(page: Path) -> None:
    text = page.read_text()
    prose = FENCE.sub("", text)
    for path in NAMED.findall(prose):
        folder = path.split("/", 1)[0]
        assert f"{REPO}tree/main/{folder}" in text, (
            f"{page.relative_to(ROOT)} names {path} without a link to the repository")
    for link in re.findall(rf"\]\(({re.escape(REPO)}[^)]+)\)", text):
        kind_and_path = link[len(REPO):].split("/", 2)  # blob|tree, main, PATH
        assert (ROOT / kind_and_path[2]).exists(), link


def test_a_checkout_install_is_said_to_be_one() -> None:
    """``pip install -e`` needs a checkout: a paragraph or block that shows it says so,
    or the paragraph before it does."""
    for page in PAGES:
        paragraphs = re.split(r"\n\s*\n", page.read_text())
        for before, paragraph in zip(["", *paragraphs[:-1]], paragraphs, strict=True):
            if re.search(r"pip install (-q )?-e ", paragraph):
                assert "checkout" in (before + paragraph).lower(), (
                    f"{page.relative_to(ROOT)}: {paragraph[:200]}")
