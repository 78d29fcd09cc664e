"""The torch engine's own checks, in process: what it refuses, and that refusing
changes nothing (no process, no group, no sockets)."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from ctlwire.app.torch_engine import (  # noqa: E402
    DecoderConfig,
    DrainTimedOut,
    Generate,
    NoUpdateGroup,
    Pause,
    Submit,
    TensorMeta,
    TorchEngine,
    UpdateFromDisk,
    UpdateFromDistributed,
    WeightsRef,
    WeightsRefused,
    save_weights,
)

CONFIG = DecoderConfig(vocab=32, width=32, layers=1, heads=2, context=16, seed=5)


def engine() -> TorchEngine:
    return TorchEngine(0, CONFIG, max_sequences=8)


def test_a_file_with_the_wrong_shapes_is_refused_before_any_weight_changes(
        tmp_path: Path) -> None:
    e = engine()
    before = (e.version, e.checksum)
    other = TorchEngine(0, DecoderConfig(vocab=32, width=64, layers=1, heads=2, context=16))
    path = str(tmp_path / "other.pt")
    digest = save_weights(other.model, path, 7)
    with pytest.raises(WeightsRefused, match="do not match the model"):
        e.update_weights_from_disk(UpdateFromDisk(7, path, digest))
    assert (e.version, e.checksum) == before
    assert e.counters["refused"] == 1


def test_disk_update_swaps_and_rolls_back(tmp_path: Path) -> None:
    e = engine()
    old = WeightsRef(e.version, e.checksum)
    trained = TorchEngine(0, DecoderConfig(**{**_fields(CONFIG), "seed": 6}))
    path = str(tmp_path / "w.pt")
    digest = save_weights(trained.model, path, 1)
    prompts = [[1, 2, 3]]
    served = e.generate(Generate(prompts, 4))
    assert served != trained.generate(Generate(prompts, 4))
    e.update_weights_from_disk(UpdateFromDisk(1, path, digest))
    assert (e.version, e.checksum) == (1, digest)
    assert e.generate(Generate(prompts, 4)) == trained.generate(Generate(prompts, 4))
    e.rollback_weights(old)
    assert (e.version, e.checksum) == (old.version, old.checksum)
    assert e.generate(Generate(prompts, 4)) == served  # the old weights really serve again
    with pytest.raises(WeightsRefused, match="not kept"):
        e.rollback_weights(WeightsRef(1, digest))  # one previous version only


def test_a_broadcast_update_needs_a_group_and_the_models_layout() -> None:
    e = engine()
    metas = [TensorMeta(k, list(v.shape), str(v.dtype))
             for k, v in e.model.state_dict().items()]
    with pytest.raises(NoUpdateGroup):
        e.update_weights_from_distributed(UpdateFromDistributed(1, "x", metas, 1.0))
    e.group = object()  # the layout is checked before anything is received
    bad = [*metas[:-1], TensorMeta(metas[-1].name, [1, 1], metas[-1].dtype)]
    with pytest.raises(WeightsRefused, match=metas[-1].name):
        e.update_weights_from_distributed(UpdateFromDistributed(1, "x", bad, 1.0))
    with pytest.raises(ValueError, match="timeout"):
        e.update_weights_from_distributed(UpdateFromDistributed(1, "x", metas, 0.0))
    assert e.version == 0


def test_bad_prompts_and_oversized_requests_are_refused() -> None:
    e = engine()
    with pytest.raises(ValueError, match="vocabulary"):
        e.submit(Submit([[1, 99]]))
    with pytest.raises(ValueError, match="vocabulary"):
        e.generate(Generate([[]], 2))
    with pytest.raises(ValueError, match="new tokens"):
        e.generate(Generate([[1]], 10_000))
    with pytest.raises(Exception, match="more than 8 sequences"):
        e.submit(Submit([[1]] * 9))
    assert e.running == {}


def test_pause_modes() -> None:
    e = engine()
    ids = e.submit(Submit([[1, 2]] * 3, max_new_tokens=4))
    e.step()
    assert e.pause(Pause("keep"))["running"] == 3
    assert not e.step()  # paused: nothing advances
    e.resume()
    assert e.pause(Pause("drain"))["running"] == 0
    assert {s["status"] for s in e.sequences(ids)} == {"finished"}
    assert all(len(s["tokens"]) == 4 for s in e.sequences(ids))
    e.resume()
    long = e.submit(Submit([[3]], max_new_tokens=10_000))
    with pytest.raises(DrainTimedOut):
        e.pause(Pause("drain", drain_timeout=0.05))
    assert not e.paused and e.sequences(long)[0]["status"] == "running"
    e.pause(Pause("abort"))
    assert e.sequences(long)[0]["status"] == "aborted" and e.paused
    with pytest.raises(ValueError, match="pause mode"):
        e.pause(Pause("retract"))


def _fields(config: DecoderConfig) -> dict[str, int]:
    return {f: getattr(config, f) for f in config.__struct_fields__}
