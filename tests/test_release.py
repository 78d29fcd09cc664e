"""Release hygiene: one version, project URLs, a light testing extra, a changelog
in the Keep a Changelog format that lists the current version, and a written
deprecation policy."""

from __future__ import annotations

import re
from importlib.metadata import metadata, version
from pathlib import Path

import pytest

import ctlwire.kernel

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_version_is_written_once_and_read_back() -> None:
    written = PYPROJECT["project"]["version"]
    assert ctlwire.kernel.__version__ == version("ctlwire") == written
    for folder in ("kernel", "states", "transports"):  # no second copy in the code
        for path in (ROOT / folder).rglob("*.py"):
            assert f'"{written}"' not in path.read_text(), path


def test_the_package_metadata_names_its_urls() -> None:
    urls = dict(u.split(", ", 1) for u in metadata("ctlwire").get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls)
    assert all(u.startswith("https://") for u in urls.values())


def test_the_testing_extra_is_light() -> None:
    """What a project needs for ctlwire's pytest plugin: pytest, nothing heavy
    (trio is optional, the plugin runs on what is installed)."""
    testing = PYPROJECT["project"]["optional-dependencies"]["testing"]
    names = {re.split(r"[<>=\[ ;]", req, maxsplit=1)[0].lower() for req in testing}
    assert names == {"pytest"}, testing


def test_the_changelog_keeps_a_changelog() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert "keepachangelog.com" in text and "## [Unreleased]" in text
    assert f"## [{PYPROJECT['project']['version']}]" in text
    headings = set(re.findall(r"^### (\w+)$", text, re.M))
    assert headings <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    for release in re.findall(r"^## \[([^\]]+)\]", text, re.M):  # each has its link
        assert re.search(rf"^\[{re.escape(release)}\]: https://", text, re.M), release


def test_the_deprecation_policy_is_written_and_names_what_is_deprecated() -> None:
    policy = (ROOT / "docs" / "versioning.md").read_text()
    assert "## Deprecation policy" in policy and "DeprecationWarning" in policy
    assert "## Currently deprecated" in policy


def test_the_torch_extra_brings_numpy() -> None:
    """torch imports numpy for tensor conversions and warns ("Failed to initialize
    NumPy") in every engine process when it is missing."""
    extra = PYPROJECT["project"]["optional-dependencies"]["torch"]
    names = {re.split(r"[<>=\[ ;]", req, maxsplit=1)[0].lower() for req in extra}
    assert {"torch", "numpy"} <= names, extra


def test_only_module_paths_are_deprecated() -> None:
    """The metric keys of the shape before the first published release are gone: the
    policy's deprecated names are the moved module paths only (each row an old and a new
    ``ctlwire.`` path), and the metrics carry no alias."""
    policy = (ROOT / "docs" / "versioning.md").read_text()
    deprecated = policy.split("## Currently deprecated", 1)[1]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|$", deprecated, re.M)
    assert len(rows) > 20
    assert deprecated.count("\n|") == len(rows) + 2  # the header and its rule
    assert all(old.startswith("ctlwire.") and new.startswith("ctlwire.") for old, new in rows)
