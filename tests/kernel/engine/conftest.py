"""Fixtures of the engine tests: raw wire-format peers, closed after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from raw_peer import RawPeer


@pytest.fixture
def raw_peer() -> Iterator[list[RawPeer]]:
    peers: list[RawPeer] = []
    yield peers
    for p in peers:
        p.close()
