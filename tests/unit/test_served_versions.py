"""Which version served a request, and its prediction again (``training_server.served_versions``),
on real prior models in a real store."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from shared.features import build_features
from shared.model_store import ModelStore
from shared.prior import publish_prior
from shared.regimes import DEFAULT_SCHEME, RegimeOffsets
from training_server import synthetic
from training_server.served_versions import HISTORY, ServedVersions

LIFT = 1.0  # log units: a calibration version that serves e**1 = 2.7x the trees' TTFT


def _store_with_two_versions(tmp_path: Path) -> tuple[ModelStore, str, str]:
    store = ModelStore(tmp_path / "models")
    plain = publish_prior(store)
    lifted = store.publish_calibrated(
        plain, {"ttft": RegimeOffsets.of(DEFAULT_SCHEME, np.full(DEFAULT_SCHEME.size, LIFT))}, {}
    )
    assert lifted is not None
    return store, plain, lifted.version


def test_each_row_is_predicted_by_the_version_current_when_it_was_routed(tmp_path: Path) -> None:
    store, plain, lifted = _store_with_two_versions(tmp_path)
    versions = ServedVersions(store)
    versions.set_current(store.read_manifest(plain), since_s=100.0)
    versions.set_current(store.read_manifest(lifted), since_s=200.0)
    feats = build_features(synthetic.samples(3, np.random.default_rng(0)))
    # routed before the oldest remembered version (it answers), during the first, after the second
    routed_s = np.array([50.0, 150.0, 250.0])

    served = versions.served("ttft", feats, routed_s, versions.snapshot(), {})

    assert np.isfinite(served).all()
    plain_again = versions.served("ttft", feats, np.full(3, 150.0), versions.snapshot(), {})
    np.testing.assert_allclose(served[:2], plain_again[:2])
    assert served[2] >= np.e * plain_again[2]  # expm1(m + 1) against expm1(m)
    current = versions.current()
    assert current is not None and current.version == lifted


def test_the_same_version_set_twice_is_remembered_once_and_only_the_newest_are_kept(tmp_path: Path) -> None:
    store, plain, lifted = _store_with_two_versions(tmp_path)
    versions = ServedVersions(store)
    versions.set_current(store.read_manifest(plain), since_s=1.0)
    versions.set_current(store.read_manifest(plain), since_s=2.0)
    assert [(v.manifest.version, v.since_s) for v in versions.snapshot()] == [(plain, 1.0)]

    for k in range(HISTORY + 3):
        versions.set_current(store.read_manifest(plain if k % 2 else lifted), since_s=10.0 + k)
    kept = versions.snapshot()
    assert len(kept) == HISTORY
    assert [v.since_s for v in kept] == [10.0 + k for k in range(3, HISTORY + 3)]


def test_a_pruned_version_is_scored_from_a_remembered_version_with_the_same_file(tmp_path: Path) -> None:
    store, plain, lifted = _store_with_two_versions(tmp_path)
    manifests = [(store.read_manifest(plain), 100.0), (store.read_manifest(lifted), 200.0)]
    feats = build_features(synthetic.samples(2, np.random.default_rng(1)))
    routed_s = np.array([150.0, 250.0])

    def remembering() -> ServedVersions:
        versions = ServedVersions(store)
        for manifest, since_s in manifests:
            versions.set_current(manifest, since_s)
        return versions

    before = remembering()
    expected = before.served("ttft", feats, routed_s, before.snapshot(), {})
    assert np.isfinite(expected).all()

    # The trained version is pruned before its rows' samples arrive; the calibration version based
    # on it holds the same model file (a hard link), so its rows are still predicted as they were.
    shutil.rmtree(store.versions_dir / plain)
    after = remembering()
    np.testing.assert_allclose(after.served("ttft", feats, routed_s, after.snapshot(), {}), expected)

    # No copy of the file is left anywhere: those rows go unscored.
    shutil.rmtree(store.versions_dir / lifted)
    gone = remembering()
    assert np.isnan(gone.served("ttft", feats, routed_s, gone.snapshot(), {})).all()
