"""One function types a transport's refusal of a frame as the client error its rank
fails with, or says the send waits: for the first send and for a send that waited."""

from __future__ import annotations

import pytest

from ctlwire.kernel.client.waiting_sends import send_error
from ctlwire.kernel.errors import (
    AuthenticationFailed,
    ClientClosed,
    NotDelivered,
    UnsupportedProtocolVersion,
)
from ctlwire.transports.errors import AuthenticationFailed as TransportAuthFailed
from ctlwire.transports.errors import (
    ProtocolVersionRefused,
    TransportClosed,
    TransportError,
    Unroutable,
    WouldBlock,
)


@pytest.mark.parametrize("lost", [False, True])
def test_refusals_that_say_who_refused_fail_the_rank_typed(lost: bool) -> None:
    auth = send_error(3, TransportAuthFailed(3, "key refused"), lost)
    assert type(auth) is AuthenticationFailed and auth.rank == 3
    version = send_error(3, ProtocolVersionRefused(3, 2, "speaks 2.0"), lost)
    assert type(version) is UnsupportedProtocolVersion and version.rank == 3
    closed = send_error(3, TransportClosed("closed"), lost)
    assert type(closed) is ClientClosed
    other = send_error(3, TransportError("boom"), lost)
    assert type(other) is NotDelivered and "boom" in str(other)


def test_a_full_pipe_and_a_rank_not_yet_heard_from_wait() -> None:
    assert send_error(1, WouldBlock("hwm"), lost=False) is None
    assert send_error(1, WouldBlock("hwm"), lost=True) is None
    assert send_error(1, Unroutable(1, "not connected"), lost=False) is None


def test_an_unroutable_lost_rank_is_not_delivered() -> None:
    error = send_error(1, Unroutable(1, ""), lost=True)
    assert type(error) is NotDelivered and error.rank == 1 and "unroutable" in str(error)
