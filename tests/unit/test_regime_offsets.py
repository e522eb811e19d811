"""Per-regime offsets in the artifact format, calibration versions in the store, and a replica's
watcher swapping only the offsets of an already-compiled version."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import numpy as np
import orjson

from prediction_server.config import PredictionSettings
from prediction_server.metrics import PredictionMetrics
from prediction_server.store_watcher import StoreWatcher
from shared.artifacts import Manifest, ModelSpec, served_latency_ms
from shared.features import FEATURE_NAMES, build_features
from shared.metrics import new_registry
from shared.model_store import ModelStore
from shared.prior import synthetic_columns
from shared.regimes import DEFAULT_SCHEME, RegimeOffsets
from tests.prediction_support import publish_trained
from training_server.window import stratum_ids


def _offsets(regime: int, value: float) -> RegimeOffsets:
    values = np.zeros(DEFAULT_SCHEME.size)
    values[regime] = value
    return RegimeOffsets.of(DEFAULT_SCHEME, values)


def _features(waiting: list[float], kv: list[float]) -> np.ndarray:
    features = np.zeros((len(waiting), len(FEATURE_NAMES)), dtype=np.float32)
    features[:, FEATURE_NAMES.index("num_request_waiting")] = waiting
    features[:, FEATURE_NAMES.index("kv_cache_percentage")] = kv
    return features


def test_regimes_coarsen_the_window_strata_bins() -> None:
    columns = synthetic_columns(5000, np.random.default_rng(0))
    columns["num_request_waiting"] = np.random.default_rng(1).integers(0, 40, 5000).astype(np.float64)
    regimes = DEFAULT_SCHEME.ids(build_features(columns))
    strata = stratum_ids(columns)
    # Every window stratum lies inside one regime: the regimes are unions of strata.
    for stratum in np.unique(strata).tolist():
        assert len(np.unique(regimes[strata == stratum])) == 1
    assert DEFAULT_SCHEME.label(int(DEFAULT_SCHEME.ids(_features([5], [0.95]))[0])) == "waiting=4-7 kv=0.9-1"


def test_served_latency_applies_the_offset_of_each_rows_regime_only() -> None:
    features = _features([0, 5, 5, 20], [0.1, 0.1, 0.95, 0.1])
    target = int(DEFAULT_SCHEME.ids(features[1:2])[0])
    spec = ModelSpec("ttft.ubj", "x", 1, calibration_offset=0.1, regime_offsets=_offsets(target, np.log(2.0)))
    margin = np.log1p(np.full(4, 99.0))
    plain = served_latency_ms(margin, features, ModelSpec("ttft.ubj", "x", 1, calibration_offset=0.1))
    served = served_latency_ms(margin, features, spec)
    assert np.allclose(served[[0, 2, 3]], plain[[0, 2, 3]])
    assert np.isclose(np.log1p(served[1]) - np.log1p(plain[1]), np.log(2.0))


def test_manifests_with_and_without_regime_offsets_round_trip(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    trained = publish_trained(store, seed=1)
    raw = orjson.loads(trained.to_json())
    for spec in raw["models"].values():
        spec.pop("regime_offsets")  # a manifest written before this field existed
    old = Manifest.from_json(orjson.dumps(raw))
    assert old == trained and old.models["ttft"].regime_offsets is None
    calibrated = store.publish_calibrated(trained.version, {"ttft": _offsets(3, 0.2)}, {"note": 1})
    assert calibrated is not None
    assert Manifest.from_json(calibrated.to_json()) == calibrated
    assert asdict(calibrated)["models"]["ttft"]["regime_offsets"]["offsets"][3] == 0.2


def test_calibration_versions_share_model_bytes_and_never_evict_trained_versions(tmp_path: Path) -> None:
    store = ModelStore(tmp_path, keep_versions=2)
    trained = [publish_trained(store, seed=s) for s in (1, 2, 3)]
    assert len(store.versions()) == 2
    base = trained[-1]
    current = base.version
    for i in range(10):
        published = store.publish_calibrated(current, {"ttft": _offsets(i % 12, 0.01 * i)}, {})
        assert published is not None and published.kind == "calibrated"
        current = published.version
        for name, spec in published.models.items():
            assert spec.sha256 == base.models[name].sha256
            src = store.versions_dir / base.version / spec.file
            assert (store.versions_dir / current / spec.file).read_bytes() == src.read_bytes()
            assert os.stat(store.versions_dir / current / spec.file).st_ino == os.stat(src).st_ino
    assert store.load().manifest.version == current  # verifies checksums too
    versions = store.versions()
    assert [v for v in versions if v.endswith("-trained")] == [t.version for t in trained[-2:]]
    assert len([v for v in versions if v.endswith("-calibrated")]) == 2 and current in versions
    # Based on a version that is no longer current (a retrain won meanwhile): nothing published.
    assert store.publish_calibrated(base.version, {"ttft": _offsets(0, 1.0)}, {}) is None
    assert store.current_version() == current


def test_versions_past_sequence_999999_stay_in_order_and_pruning_keeps_the_newest(tmp_path: Path) -> None:
    # Several calibration versions a second reach sequence 1,000,000 in days; the seventh digit
    # must not sort a new version before the old ones (pruning would then delete the newest).
    store = ModelStore(tmp_path, keep_versions=1)
    old = ["999998-calibrated", "999999-calibrated"]
    for name in old:
        (store.versions_dir / name).mkdir(parents=True)
    trained = publish_trained(store, seed=1)
    assert trained.sequence == 1_000_000
    current = trained.version
    for i in range(3):
        published = store.publish_calibrated(current, {"ttft": _offsets(i, 0.01 * (i + 1))}, {})
        assert published is not None
        current = published.version
    versions = store.versions()
    assert versions == [trained.version, "1000002-calibrated", "1000003-calibrated"]
    assert current == versions[-1] and store.load().manifest.version == current
    assert store.newest_verified() is not None and store.newest_verified().manifest.version == trained.version


async def test_watcher_swaps_offsets_without_recompiling_the_trees(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    trained = publish_trained(store, seed=1)
    watcher = StoreWatcher(PredictionSettings(store=str(store.root)), PredictionMetrics(new_registry()))
    await watcher.start()
    try:
        first = watcher.current
        assert first is not None and first.version == trained.version
        features = _features([0, 5, 5, 20], [0.1, 0.1, 0.95, 0.1])
        regime = int(DEFAULT_SCHEME.ids(features[1:2])[0])
        before = first.predict(features)
        calibrated = store.publish_calibrated(trained.version, {"ttft": _offsets(regime, np.log(1.5))}, {})
        assert calibrated is not None and await watcher.check() is True
        second = watcher.current
        assert second.version == calibrated.version and second.kind == "calibrated"
        assert second.forests is first.forests  # same compiled trees, not a recompile
        ttft, tpot = second.predict(features)
        assert np.allclose(tpot, before[1]) and np.allclose(ttft[[0, 2, 3]], before[0][[0, 2, 3]])
        assert np.isclose(np.log1p(ttft[1]) - np.log1p(before[0][1]), np.log(1.5), atol=1e-6)
        retrained = publish_trained(store, seed=2)  # new trees: compiled afresh
        assert await watcher.check() is True and watcher.current.forests is not first.forests
        assert watcher.current.version == retrained.version
    finally:
        await watcher.stop()
