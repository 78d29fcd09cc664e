"""`ctlwire demo --membership etcd` end to end: a real etcd, real engine
processes registering in it, a rank joining and one leaving while the cycles run."""

from __future__ import annotations

import re
import shutil

import pytest

from ctlwire.kernel.app.cli import main

pytestmark = pytest.mark.timeout(120)


@pytest.mark.skipif(shutil.which("etcd") is None,
                    reason="the etcd binary is not installed (Debian: apt-get install etcd-server)")
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_membership_demo_commits_every_cycle_while_a_rank_joins_and_one_leaves(
        backend: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--membership", "etcd", "--engines", "3", "--cycles", "4",
                 "--backend", backend])
    text = capsys.readouterr().out
    assert code == 0, text
    assert re.search(r"rank 3 joined .*admissible \[0, 1, 2\] \(left out 3: not admitted\)",
                     text), text
    assert "rank 3 brought to weight version 1 and admitted" in text, text
    assert re.search(r"rank 0 left .*present \[1, 2, 3\]", text), text
    assert len(re.findall(r"-> weight version \d committed on", text)) == 4, text
    assert "joined [3], left [0]; 4/4 cycles committed" in text, text
    assert "{1: 4, 2: 4, 3: 4}" in text and text.rstrip().endswith("OK"), text
