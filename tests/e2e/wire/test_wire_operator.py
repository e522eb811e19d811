"""wire-contract.md section 5, the operator API, against real processes: model download, seed
bundles (export, import, ``--seed-bundle``), ``/data/status`` and ``/flush``."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import xgboost as xgb

from tests.e2e.wire.conftest import AUTH, Fleet, entries, rows, serving
from tests.e2e.wire.test_wire_prediction import zoned
from tests.procs import wait_until

pytestmark = pytest.mark.e2e

GZIP = {"Content-Type": "application/gzip"}


def export(url: str) -> bytes:
    response = httpx.get(url + "/model/export", timeout=30.0)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/gzip"
    return response.content


def members(bundle: bytes) -> dict[str, tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        out = {}
        for m in tar.getmembers():
            f = tar.extractfile(m)
            out[m.name] = (m, f.read() if f else b"")
        return out


def repack(files: list[tuple[str, bytes]], *, kind: bytes = tarfile.REGTYPE) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.type = len(data), int(time.time()), kind
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue())


@pytest.mark.parametrize("name", ["ttft", "tpot"])
def test_download_serves_the_native_model_with_its_sha256_as_etag(fleet: Fleet, name: str) -> None:
    response = httpx.get(fleet.training.url + f"/model/{name}/download")
    assert response.status_code == 200
    digest = hashlib.sha256(response.content).hexdigest()
    assert response.headers["etag"].strip('"') == digest
    manifest = httpx.get(fleet.training.url + "/models/current").json()
    assert manifest["models"][name]["sha256"] == digest
    booster = xgb.Booster()
    booster.load_model(bytearray(response.content))  # XGBoost's own format, loadable as is
    assert booster.num_boosted_rounds() == 30
    unchanged = httpx.get(
        fleet.training.url + f"/model/{name}/download", headers={"If-None-Match": response.headers["etag"]}
    )
    assert unchanged.status_code == 304
    assert httpx.get(fleet.training.url + "/model/ttft_gated/download").status_code == 404
    assert httpx.get(fleet.training.url + "/model/other/download").status_code == 404


def test_export_is_a_gzipped_seed_bundle_with_manifest_models_and_metadata(fleet: Fleet) -> None:
    before = time.time()
    files = members(export(fleet.training.url))
    manifest = httpx.get(fleet.training.url + "/models/current").json()
    assert set(files) == {"manifest.json", "metadata.json", "ttft.ubj", "tpot.ubj"}
    for info, _ in files.values():
        assert info.isreg() and abs(info.mtime - before) < 300  # a real mtime, not the epoch
    assert orjson.loads(files["manifest.json"][1]) == manifest
    for name in ("ttft", "tpot"):
        assert hashlib.sha256(files[f"{name}.ubj"][1]).hexdigest() == manifest["models"][name]["sha256"]
    metadata = orjson.loads(files["metadata.json"][1])
    assert metadata["model_type"] == "xgboost" and metadata["quantile_alpha"] == manifest["quantile"]
    assert zoned(metadata["exported_at"]) and metadata["source_version"] == fleet.version
    assert metadata["training_samples"] == manifest["training_samples"]
    assert metadata["sample_counts"]["window"]["total_samples"] > 0
    assert not any(name.endswith((".pkl", ".pickle", ".joblib")) for name in files)


def test_a_bundle_imported_into_a_fresh_server_predicts_bit_identically(fleet: Fleet, tmp_path: Path) -> None:
    bundle = export(fleet.training.url)
    fresh = fleet.start_training(tmp_path / "fresh")
    replica = None
    try:
        assert httpx.get(fresh.url + "/status").json()["is_prior"] is True
        assert httpx.post(fresh.url + "/model/import", content=bundle, headers=GZIP).status_code == 401
        response = httpx.post(
            fresh.url + "/model/import", content=bundle, headers={**GZIP, **AUTH}, timeout=30.0
        )
        assert response.status_code == 200, response.text
        imported = response.json()["version"]
        assert response.json()["source_version"] == fleet.version
        status = httpx.get(fresh.url + "/status").json()
        assert status["current_version"] == imported and status["is_prior"] is False
        replica = fleet.start_prediction(tmp_path / "fresh" / "models")
        wait_until(
            lambda: serving(replica, imported), what="fresh replica on the imported version", timeout_s=60
        )
        batch = {"requests": rows(300, seed=11)}
        ours = httpx.post(replica.url + "/predict/bulk/strict", json=batch).json()["predictions"]
        theirs = httpx.post(fleet.prediction.url + "/predict/bulk/strict", json=batch).json()["predictions"]
        assert [(p["ttft_ms"], p["tpot_ms"]) for p in ours] == [(p["ttft_ms"], p["tpot_ms"]) for p in theirs]
        # And the imported version exports the same models again.
        again = members(export(fresh.url))
        original = members(bundle)
        assert (
            again["ttft.ubj"][1] == original["ttft.ubj"][1]
            and again["tpot.ubj"][1] == original["tpot.ubj"][1]
        )
    finally:
        if replica is not None:
            replica.stop()
        fresh.stop()


def test_seed_bundle_flag_starts_a_fresh_server_from_the_bundle_and_is_ignored_once_trained(
    fleet: Fleet, tmp_path: Path
) -> None:
    path = tmp_path / "seed.tar.gz"
    path.write_bytes(export(fleet.training.url))
    source = httpx.get(fleet.training.url + "/models/current").json()
    data = tmp_path / "seeded"
    seeded = fleet.start_training(data, "--seed-bundle", str(path))
    try:
        current = httpx.get(seeded.url + "/models/current").json()
        assert current["kind"] == "trained"
        assert {n: m["sha256"] for n, m in current["models"].items()} == {
            n: m["sha256"] for n, m in source["models"].items()
        }
        assert [v for v in httpx.get(seeded.url + "/models").json()["versions"] if v.endswith("-prior")] == []
        versions = httpx.get(seeded.url + "/models").json()["versions"]
    finally:
        seeded.stop()
    # The store now has a trained version: a restart with the same flag keeps it, says so, publishes nothing.
    again = fleet.start_training(data, "--seed-bundle", str(path))
    try:
        assert httpx.get(again.url + "/models").json()["versions"] == versions
        assert httpx.get(again.url + "/models/current").json()["version"] == current["version"]
        assert "seed_bundle_ignored" in again.logs()
    finally:
        again.stop()


def test_a_bad_seed_bundle_stops_the_start(fleet: Fleet, tmp_path: Path) -> None:
    path = tmp_path / "bad.tar.gz"
    path.write_bytes(b"not a bundle")
    with pytest.raises(RuntimeError, match="not gzip"):
        fleet.start_training(tmp_path / "bad", "--seed-bundle", str(path))


def test_import_refuses_unsafe_or_mismatched_bundles(fleet: Fleet, tmp_path: Path) -> None:
    good = members(export(fleet.training.url))
    manifest = orjson.loads(good["manifest.json"][1])
    plain = [(name, data) for name, (_, data) in good.items()]

    def with_manifest(**changes: Any) -> list[tuple[str, bytes]]:
        changed = orjson.dumps({**manifest, **changes})
        return [(n, changed if n == "manifest.json" else d) for n, d in plain]

    tampered = [(n, d[:-1] + bytes([d[-1] ^ 1]) if n == "ttft.ubj" else d) for n, d in plain]
    cases = {
        "garbage": b"\x1f\x8b not really gzip",
        "checksum": repack(tampered),
        "traversal": repack([*plain, ("../escape.txt", b"x")]),
        "absolute": repack([*plain, ("/etc/evil", b"x")]),
        "unexpected member": repack([*plain, ("model.pkl", b"\x80\x04K.")]),
        "symlink": repack([*plain[:-1], (plain[-1][0], b"")], kind=tarfile.SYMTYPE),
        "no manifest": repack([(n, d) for n, d in plain if n != "manifest.json"]),
        "feature version": repack(with_manifest(feature_version=manifest["feature_version"] + 1)),
        "quantile": repack(with_manifest(quantile=0.5)),
    }
    fresh = fleet.start_training(tmp_path / "refuser")
    try:
        version = httpx.get(fresh.url + "/models/current").json()["version"]
        for case, body in cases.items():
            response = httpx.post(fresh.url + "/model/import", content=body, headers={**GZIP, **AUTH})
            assert response.status_code == 422, (case, response.text)
            assert "Invalid seed bundle" in response.json()["detail"][0]["msg"], case
        assert httpx.get(fresh.url + "/models/current").json()["version"] == version  # nothing published
        assert (
            httpx.post(
                fresh.url + "/model/import", content=repack(plain), headers={**GZIP, **AUTH}
            ).status_code
            == 200
        )
    finally:
        fresh.stop()


def test_data_status_counts_the_window_and_the_held_out_share(fleet: Fleet) -> None:
    body = httpx.get(fleet.training.url + "/data/status").json()
    for part in ("training_data", "test_data"):
        assert set(body[part]) >= {"ttft_samples", "tpot_samples", "total_samples"}
        assert all(isinstance(v, int) for v in body[part].values())
    assert body["training_data"]["ttft_samples"] >= 1500 and body["test_data"]["ttft_samples"] > 0
    assert body["ensemble"] == {"ensemble_mode": False, "ensemble_active": False}


def test_flush_with_the_llmd_shapes(fleet: Fleet, tmp_path: Path) -> None:
    training = fleet.start_training(tmp_path / "flush")
    try:
        url = training.url
        assert httpx.post(url + "/add_training_data_bulk", json={"entries": entries(120)}).status_code == 202
        wait_until(
            lambda: httpx.get(url + "/data/status").json()["training_data"]["total_samples"] == 120,
            timeout_s=60,
        )
        assert httpx.post(url + "/flush").status_code == 401
        assert (
            httpx.post(url + "/flush", json={"flush_training_data": "yes"}).status_code == 401
        )  # token first
        bad = httpx.post(url + "/flush", json={"flush_training_data": "yes"}, headers=AUTH)
        assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["body", "flush_training_data"]
        assert httpx.post(url + "/flush", json={"flush_metrics": 1}, headers=AUTH).status_code == 422
        kept = httpx.post(
            url + "/flush", json={"flush_training_data": False, "reason": "test"}, headers=AUTH
        ).json()
        assert (
            kept["success"] is True
            and kept["reason"] == "test"
            and kept["ttft_training_samples_flushed"] == 0
        )
        assert httpx.get(url + "/data/status").json()["training_data"]["total_samples"] == 120
        response = httpx.post(url + "/flush", headers=AUTH)  # an empty body flushes everything
        assert response.status_code == 200
        body = response.json()
        assert body["success"] is True and zoned(body["flushed_at"]) and body["reason"] is None
        assert body["ttft_training_samples_flushed"] == 120 and body["tpot_training_samples_flushed"] == 120
        assert body["ttft_test_samples_flushed"] == 0 and body["tpot_test_samples_flushed"] == 0
        assert body["metrics_cleared"] is True and isinstance(body["message"], str)
        assert httpx.get(url + "/data/status").json()["training_data"]["total_samples"] == 0
    finally:
        training.stop()
