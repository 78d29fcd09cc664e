"""A CURVE secret key never shows in repr, str, pprint or a log line: only the
public part of a key pair, or of a config holding one, is ever printed."""

from __future__ import annotations

import logging
import pprint

import pytest

from ctlwire.transports import (
    CurveClientConfig,
    CurveServerConfig,
    KeyPair,
    generate_keypair,
)


def _printed(obj: object, caplog: pytest.LogCaptureFixture) -> list[str]:
    caplog.clear()
    log = logging.getLogger("ctlwire.test.secrets")
    with caplog.at_level(logging.INFO, logger="ctlwire.test.secrets"):
        log.info("%s", obj)
        log.info("%r", obj)
    return [repr(obj), str(obj), f"{obj}", f"{obj!r}", pprint.pformat(obj),
            pprint.pformat([obj], width=20), *caplog.messages]


def test_a_key_pair_shows_its_public_key_only(caplog: pytest.LogCaptureFixture) -> None:
    pair = generate_keypair()
    for text in _printed(pair, caplog):
        assert pair.secret.decode() not in text, text
        assert pair.public.decode() in text, text
        assert "<hidden>" in text
    assert pair == KeyPair(pair.public, pair.secret)  # still a value: equality unchanged


def test_configs_holding_a_secret_show_only_public_keys(
        caplog: pytest.LogCaptureFixture) -> None:
    server, client = generate_keypair(), generate_keypair()
    configs = [CurveServerConfig.allowing(server, [client.public], ranks={0: client.public}),
               CurveClientConfig(client, server.public)]
    for config in configs:
        for text in _printed(config, caplog):
            for secret in (server.secret, client.secret):
                assert secret.decode() not in text, text
            assert type(config).__name__ in text
