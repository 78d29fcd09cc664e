"""An engine's exception of a class the client allows is raised as that class, and
still as RemoteError; any other stays a RemoteError with its class name."""

from __future__ import annotations

from typing import Any

import pytest

from ctlwire.kernel import Busy, ControlClient, Fenced, RemoteError
from ctlwire.kernel.engine.endpoint import EngineEndpoint
from ctlwire.kernel.errors import (
    BUILTIN_EXCEPTIONS,
    allowed_exceptions,
    remote_error,
    remote_error_class,
)
from ctlwire.testing import EngineHarness
from ctlwire.transports.envelope import ErrorInfo


class QuotaExceeded(Exception):
    """An engine's own exception class."""


def test_a_builtin_class_is_raised_as_itself_and_as_remote_error() -> None:
    err = remote_error(ErrorInfo("ValueError", "bad shape", 3), rank=1, method="load")
    assert isinstance(err, ValueError) and isinstance(err, RemoteError)
    assert (err.type_name, err.message, err.code, err.rank, err.method) == (
        "ValueError", "bad shape", 3, 1, "load")
    assert str(err) == "ValueError: bad shape (code 3 from rank 1)"
    assert type(err).__name__ == "RemoteValueError"
    again = remote_error(ErrorInfo("ValueError", "other", 0))
    assert type(again) is type(err)  # one class per builtin, made once
    with pytest.raises(ValueError, match="bad shape"):
        raise err


@pytest.mark.parametrize("name", ["KeyError", "FileNotFoundError", "TimeoutError",
                                  "ZeroDivisionError", "AssertionError", "NotImplementedError"])
def test_builtins_with_their_own_str_or_layout_keep_the_remote_message(name: str) -> None:
    err = remote_error(ErrorInfo(name, "gone", 0))
    assert isinstance(err, BUILTIN_EXCEPTIONS[name]) and isinstance(err, RemoteError)
    assert str(err) == f"{name}: gone (code 0)"  # KeyError's str would quote it


def test_a_class_whose_constructor_differs_stays_a_plain_remote_error() -> None:
    err = remote_error(ErrorInfo("UnicodeDecodeError", "bad byte", 0))
    assert type(err) is RemoteError and err.type_name == "UnicodeDecodeError"
    assert remote_error_class(UnicodeDecodeError) is None


def test_names_outside_the_allowed_classes_stay_remote_errors() -> None:
    for name in ("QuotaExceeded", "StopIteration", "KeyboardInterrupt", "SystemExit", "os"):
        err = remote_error(ErrorInfo(name, "no", 0))
        assert type(err) is RemoteError and err.type_name == name
    # ctlwire's own refusals keep their classes
    assert type(remote_error(ErrorInfo("Fenced", "old", 409))) is Fenced
    assert type(remote_error(ErrorInfo("Busy", "full", 429))) is Busy


def test_the_allowed_classes_are_the_clients_choice() -> None:
    mine = allowed_exceptions([QuotaExceeded])
    err = remote_error(ErrorInfo("QuotaExceeded", "over", 0), exceptions=mine)
    assert isinstance(err, QuotaExceeded) and isinstance(err, RemoteError)
    assert type(remote_error(ErrorInfo("ValueError", "x", 0), exceptions=mine)) is RemoteError
    none = allowed_exceptions(())
    assert type(remote_error(ErrorInfo("ValueError", "x", 0), exceptions=none)) is RemoteError
    assert allowed_exceptions() is BUILTIN_EXCEPTIONS
    with pytest.raises(TypeError):
        allowed_exceptions([int])  # type: ignore[list-item]


# -- through a client and an engine ----------------------------------------------------


def _raising(ep: EngineEndpoint) -> None:
    def fail(payload: Any = None) -> Any:
        kind, text = payload
        raise {"runtime": RuntimeError, "lookup": KeyError, "quota": QuotaExceeded}[kind](text)

    ep.register("fail", fail)


@pytest.mark.anyio
async def test_a_call_raises_the_engines_builtin_class_catchable_both_ways() -> None:
    async with EngineHarness(ranks=2, setup=_raising) as h:
        with pytest.raises(RuntimeError, match="engine broke") as caught:
            await h.client.call("fail", ["runtime", "engine broke"], rank=1)
        assert isinstance(caught.value, RemoteError) and caught.value.rank == 1
        with pytest.raises(RemoteError) as other:
            await h.client.call("fail", ["quota", "over"], rank=0)
        assert type(other.value) is RemoteError and other.value.type_name == "QuotaExceeded"
        res = await h.client.fan_out("fail", ["lookup", "k"])
        assert all(isinstance(e, KeyError) and isinstance(e, RemoteError)
                   for e in res.errors.values()) and sorted(res.errors) == [0, 1]


@pytest.mark.anyio
async def test_a_client_allows_its_own_classes_and_no_builtins_when_told() -> None:
    async with EngineHarness(ranks=1, setup=_raising,
                             client_kwargs={"remote_exceptions": [QuotaExceeded]}) as h:
        client: ControlClient = h.client
        with pytest.raises(QuotaExceeded, match="over"):
            await client.call("fail", ["quota", "over"])
        with pytest.raises(RemoteError) as caught:
            await client.call("fail", ["runtime", "x"])
        assert not isinstance(caught.value, RuntimeError)
