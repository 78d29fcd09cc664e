"""The product says what it does, not how it was made.

Code, tests, docstrings and docs cite no issue numbers and no rounds of work,
and carry no timing figures outside the benchmarks (``benchmarks/`` and
``docs/benchmarks.md``, where figures are measured and dated): a figure in a
comment goes stale with the next change. History lives in git and in the
changelog (which says what changed, not which issue asked for it). An issue of
another project named with it ("libzmq #4364") is a reason, and stays.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = {"node_modules", "site", "build", "dist", "__pycache__"}
FIGURES_BELONG_IN = ("benchmarks/", "docs/benchmarks.md")

PATTERNS: dict[str, re.Pattern[str]] = {
    "issue number": re.compile(r"\bissues?[ _-]?#?\d+", re.I),
    "round of work": re.compile(
        r"\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh"
        r"|twelfth|\d+(?:st|nd|rd|th)) pass\b", re.I),
    "test named after an issue": re.compile(r"\bdef test_\w*issue", re.I),
    "timing figure": re.compile(r"\d(?:\.\d+)?\s?[µμ]s\b"),
}

# (file, kind) of hits in files being reworked elsewhere. Each must still be
# found (a stale entry fails below, so remove it with the hit); none may be added.
KNOWN: frozenset[tuple[str, str]] = frozenset()


def _files() -> list[Path]:
    found = []
    for top, dirs, names in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIP_DIRS)
        found.extend(Path(top) / n for n in sorted(names) if n.endswith((".py", ".md")))
    here = Path(__file__).resolve()
    return [p for p in found if p != here]  # not the patterns themselves


def hits(rel: str, text: str) -> set[tuple[str, str]]:
    """The (kind, line) of each process word in the file ``rel`` with ``text``."""
    out = set()
    for kind, pattern in PATTERNS.items():
        if kind == "timing figure" and rel.startswith(FIGURES_BELONG_IN):
            continue
        for line in text.splitlines():
            if pattern.search(line):
                out.add((kind, line.strip()))
    return out


def test_no_process_words_in_code_tests_or_docs() -> None:
    files = _files()
    assert any(p.name == "README.md" for p in files) and len(files) > 100
    found: dict[tuple[str, str], list[str]] = {}
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        for kind, line in hits(rel, path.read_text(encoding="utf-8")):
            found.setdefault((rel, kind), []).append(line)
    new = {k: v for k, v in found.items() if k not in KNOWN}
    assert not new, new
    assert KNOWN - set(found) == set(), sorted(KNOWN - set(found))


def test_no_history_files() -> None:
    names = [p.name for p in ROOT.iterdir()] + [p.name for p in (ROOT / "docs").rglob("*")]
    assert not [n for n in names if re.search(r"NOTES|HISTORY|PROFILE_", n, re.I)], names


def test_each_kind_of_process_word_is_found() -> None:
    # the samples are split across literals so this file itself holds no process word
    text = ("# Fourth" " pass: the 3rd" " pass was slower\n"
            "def test_the_names_the_issue_asks_for(): ...\n"
            '"""Added for issue' ' 12; see issue' ' #31 and issue' '-14."""\n'
            "# costs ~7 µs here\n"
            "# libzmq #4364: a reason, not a process word; a pass through the loop\n")
    found = hits("kernel/x.py", text)
    assert {kind for kind, _ in found} == set(PATTERNS)
    assert all("libzmq" not in line for _, line in found)
    assert ("timing figure", "# costs ~7 µs here") not in hits("benchmarks/x.py", text)
