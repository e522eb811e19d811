"""The shared feature function and the model store: format, verification, atomic switch, pruning."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import orjson
import pytest

from shared.artifacts import Manifest, served_latency_ms, to_margin_target
from shared.errors import ArtifactError
from shared.features import FEATURE_NAMES, NUM_FEATURES, build_features
from shared.model_store import CURRENT_FILE, ModelStore
from shared.prior import build_prior_models, prior_latency_ms, publish_prior
from shared.schemas import parse_rows

ROW = {
    "kv_cache_percentage": 0.5,
    "input_token_length": 1000,
    "num_request_waiting": 3,
    "num_request_running": 2,
    "num_tokens_generated": 1,
    "prefix_cache_score": 0.25,
    "prefill_tokens_in_flight": 500,
    "encoder_input_size": 10,
    "encoder_matched_size": 4,
}


def test_features_are_float32_in_declared_order_with_derived_columns():
    x = build_features(parse_rows([ROW, ROW]))
    assert x.shape == (2, NUM_FEATURES) and x.dtype == np.float32 and x.flags.c_contiguous
    row = dict(zip(FEATURE_NAMES, x[0].tolist(), strict=True))
    assert row["input_token_length"] == 1000
    assert row["uncached_input_tokens"] == 750
    assert row["queue_depth"] == 5
    assert row["prefill_work_tokens"] == 1250
    assert row["uncached_encoder_input"] == 6


def test_latency_transform_round_trips_and_clips_negative():
    spec = dataclasses.replace(_spec(), calibration_offset=0.0)
    y = np.array([0.0, 5.0, 1234.5])
    rows = np.zeros((len(y), NUM_FEATURES), dtype=np.float32)
    assert np.allclose(served_latency_ms(to_margin_target(y, "log1p"), rows, spec), y)
    assert served_latency_ms(np.array([-5.0]), rows[:1], spec)[0] == 0.0


def _spec():
    from shared.artifacts import ModelSpec

    return ModelSpec(file="ttft.ubj", sha256="", size_bytes=0)


@pytest.fixture(scope="module")
def prior_models():
    return build_prior_models(0.9)


def _publish(store: ModelStore, models, kind="trained"):
    return store.publish(kind, models[0], objective="quantile", quantile=0.9, target_transforms=models[1])


def test_publish_then_load_verifies_checksums(tmp_path, prior_models):
    store = ModelStore(tmp_path)
    assert store.current_version() is None
    manifest = _publish(store, prior_models)
    assert manifest.version == "000001-trained" and store.current_version() == manifest.version
    loaded = store.load()
    assert loaded.manifest == manifest
    assert loaded.files["ttft"] == prior_models[0]["ttft"]
    assert Manifest.from_json(manifest.to_json()) == manifest


def test_tampered_or_truncated_file_is_refused(tmp_path, prior_models):
    store = ModelStore(tmp_path)
    version = _publish(store, prior_models).version
    path = store.versions_dir / version / "tpot.ubj"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match="checksum"):
        store.load()
    path.write_bytes(bytes([data[0] ^ 1]) + data[1:])
    with pytest.raises(ArtifactError, match="checksum"):
        store.load()


def test_feature_schema_mismatch_is_refused(tmp_path, prior_models):
    store = ModelStore(tmp_path)
    version = _publish(store, prior_models).version
    manifest_path = store.versions_dir / version / "manifest.json"
    data = orjson.loads(manifest_path.read_bytes())
    data["feature_version"] = 999
    manifest_path.write_bytes(orjson.dumps(data))
    with pytest.raises(ArtifactError, match="feature schema"):
        store.load()


def test_prune_keeps_newest_versions_and_current(tmp_path, prior_models):
    store = ModelStore(tmp_path, keep_versions=2)
    versions = [_publish(store, prior_models).version for _ in range(4)]
    assert store.versions() == versions[-2:]
    assert store.current_version() == versions[-1]
    (tmp_path / ".staging-crashed").mkdir()
    store.prune()
    assert not (tmp_path / ".staging-crashed").exists()


def test_reader_never_sees_a_partial_version(tmp_path, prior_models):
    store = ModelStore(tmp_path, keep_versions=3)
    _publish(store, prior_models)
    failures: list[str] = []
    seen: set[str] = set()
    stop = threading.Event()

    def read_loop() -> None:
        reader = ModelStore(tmp_path)
        while not stop.is_set():
            try:
                seen.add(reader.load().manifest.version)
            except ArtifactError as exc:
                # Only acceptable race: the version named by CURRENT was pruned after we read it.
                if "not found" not in str(exc):
                    failures.append(str(exc))

    thread = threading.Thread(target=read_loop)
    thread.start()
    try:
        for _ in range(15):
            _publish(store, prior_models)
    finally:
        stop.set()
        thread.join()
    assert failures == []
    assert len(seen) > 1
    assert (tmp_path / CURRENT_FILE).read_text() == store.versions()[-1]


def test_prior_is_positive_ordered_and_marked(tmp_path):
    store = ModelStore(tmp_path)
    version = publish_prior(store)
    assert "prior" in version and store.load().manifest.kind == "prior"
    idle = parse_rows(
        [{**ROW, "num_request_waiting": 0, "num_request_running": 0, "kv_cache_percentage": 0.1}]
    )
    busy = parse_rows(
        [{**ROW, "num_request_waiting": 30, "num_request_running": 100, "kv_cache_percentage": 0.9}]
    )
    (ttft_idle, tpot_idle), (ttft_busy, tpot_busy) = prior_latency_ms(idle), prior_latency_ms(busy)
    assert 0 < ttft_idle[0] < ttft_busy[0] and 0 < tpot_idle[0] < tpot_busy[0]
