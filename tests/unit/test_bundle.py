"""``shared.bundle``: a seed bundle round-trips a real model version exactly, and unpacking is bounded."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import orjson
import pytest

from shared.bundle import METADATA_FILE, BundleError, read_bundle, write_bundle
from shared.model_store import ModelStore
from tests.prediction_support import publish_trained


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> ModelStore:
    store = ModelStore(tmp_path_factory.mktemp("bundle") / "models")
    publish_trained(store, seed=2)
    return store


def test_a_bundle_round_trips_the_version_byte_for_byte(store: ModelStore) -> None:
    model_set = store.load()
    data = write_bundle(model_set, {"window": {"total_samples": 7}}, now_s=1_800_000_000.0)
    bundle = read_bundle(data)
    assert bundle.model_set.files == model_set.files
    assert bundle.manifest == model_set.manifest
    assert bundle.metadata["quantile_alpha"] == 0.9 and bundle.metadata["model_type"] == "xgboost"
    assert bundle.metadata["exported_at"] == "2027-01-15T08:00:00+00:00"
    assert bundle.metadata["sample_counts"] == {"window": {"total_samples": 7}}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        assert {m.mtime for m in tar.getmembers()} == {1_800_000_000}
        assert sorted(m.name for m in tar.getmembers()) == [
            "manifest.json",
            METADATA_FILE,
            "tpot.ubj",
            "ttft.ubj",
        ]


def test_unpacking_is_bounded(store: ModelStore) -> None:
    data = write_bundle(store.load(), {})
    size = len(gzip.decompress(data))
    read_bundle(data, max_bytes=size)
    with pytest.raises(BundleError, match="size limit"):
        read_bundle(data, max_bytes=size // 4)
    bomb = gzip.compress(b"\0" * (4 * size))  # small compressed, large unpacked
    with pytest.raises(BundleError, match="size limit"):
        read_bundle(bomb, max_bytes=size)


def test_metadata_must_say_xgboost(store: ModelStore, tmp_path: Path) -> None:
    data = write_bundle(store.load(), {})
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    files[METADATA_FILE] = orjson.dumps({**orjson.loads(files[METADATA_FILE]), "model_type": "lightgbm"})
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    with pytest.raises(BundleError, match="model_type"):
        read_bundle(gzip.compress(raw.getvalue()))
