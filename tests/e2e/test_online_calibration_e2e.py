"""Online calibration through real servers: a real training server learns that TTFT doubled in one
load regime, publishes a calibration version (same model files, new regime offsets) and a real
prediction server picks it up within about a second, without recompiling the trees, shifting
only that regime's predictions. And a drift event retrains at once."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest

from shared.artifacts import Manifest
from shared.features import build_features
from shared.regimes import DEFAULT_SCHEME
from tests.procs import start_service, wait_until
from training_server import synthetic

pytestmark = pytest.mark.e2e

SHIFTED = "waiting=4-7 kv=0-0.9"
BASE_FLAGS = [
    "--min-new-samples", "10000000", "--retrain-interval-s", "3600", "--n-estimators", "30",
    "--min-train-samples", "200", "--trainer-nice", "0",
]  # fmt: skip


def _shifted_samples(n: int, seed: int, factor: float) -> dict[str, np.ndarray]:
    """Samples of the shifted regime only (4-15 waiting, KV below 0.5), TTFT times ``factor``."""
    rng = np.random.default_rng(seed)
    columns = synthetic.pod_states(n, rng, waiting=6)
    columns["kv_cache_percentage"] = rng.uniform(0.05, 0.45, n)
    columns["actual_ttft_ms"], columns["actual_tpot_ms"] = synthetic.latencies(columns, rng)
    columns["actual_ttft_ms"] *= factor
    return columns


def _in_shifted_regime(columns: dict[str, np.ndarray]) -> np.ndarray:
    labels = [DEFAULT_SCHEME.label(r) for r in DEFAULT_SCHEME.ids(build_features(columns)).tolist()]
    return np.array(labels) == SHIFTED


def _post(client: httpx.Client, url: str, columns: dict[str, np.ndarray]) -> None:
    body = orjson.dumps({"entries": synthetic.to_entries(columns)})
    assert client.post(url + "/add_training_data_bulk", content=body).status_code == 202


def _train(client: httpx.Client, url: str) -> Manifest:
    for seed in range(5):
        _post(client, url, synthetic.samples(1000, np.random.default_rng(seed)))
    wait_until(lambda: client.get(url + "/status").json()["live"]["pending_samples"] == 0, "scoring", 30)
    outcome = client.post(url + "/retrain", params={"wait": "true"}, timeout=120).json()
    assert outcome["outcome"] == "published", outcome
    return Manifest.from_json(client.get(url + "/models/current").content)


def _probe_rows() -> tuple[list[dict[str, Any]], np.ndarray]:
    columns = synthetic.pod_states(400, np.random.default_rng(99))
    columns["num_request_waiting"] = np.tile(np.array([0.0, 2.0, 6.0, 20.0]), 100)
    rows = [
        {k: v for k, v in e.items() if not k.startswith("actual_")} for e in synthetic.to_entries(columns)
    ]
    return rows, _in_shifted_regime(columns)


def _predict(
    client: httpx.Client, url: str, rows: list[dict[str, Any]]
) -> tuple[np.ndarray, np.ndarray, str]:
    body = client.post(url + "/predict/bulk/strict", content=orjson.dumps({"requests": rows})).json()
    ttft = np.array([p["ttft_ms"] for p in body["predictions"]])
    tpot = np.array([p["tpot_ms"] for p in body["predictions"]])
    return ttft, tpot, body["model_version"]


def test_a_calibration_version_reaches_a_replica_within_a_second_with_identical_trees(tmp_path: Path) -> None:
    data, logs = tmp_path / "data", tmp_path / "logs"
    no_drift = ["--drift-coverage-drop", "0.99", "--drift-loss-rise", "1000000000"]  # keep the trees
    with (
        start_service(
            "training_server", ["--data-dir", str(data), *BASE_FLAGS, *no_drift], log_dir=logs
        ) as ts,
        httpx.Client(timeout=30) as client,
    ):
        trained = _train(client, ts.url)
        store = ["--store", str(data / "models"), "--poll-interval-s", "0.1"]
        with start_service("prediction_server", store, log_dir=logs, ready_path="/readyz") as ps:
            wait_until(
                lambda: client.get(ps.url + "/status").json()["model_version"] == trained.version, "T", 10
            )
            rows, shifted = _probe_rows()
            ttft_before, tpot_before, _ = _predict(client, ps.url, rows)

            # TTFT doubles in one regime; its samples arrive with unchanged ones of the others, a
            # scored batch at a time
            # (the calibrator counts a batch as a few samples: samples that arrive together share
            # their conditions).
            def scored() -> bool:
                return bool(client.get(ts.url + "/status").json()["live"]["pending_samples"] == 0)

            for seed in range(30):
                shifted_part = _shifted_samples(100, 100 + seed, factor=2.0)
                others = synthetic.samples(300, np.random.default_rng(200 + seed))
                others = {k: v[~_in_shifted_regime(others)] for k, v in others.items()}
                _post(client, ts.url, {k: np.concatenate([shifted_part[k], others[k]]) for k in others})
                wait_until(scored, "scoring", 30)

            def calibrated() -> Manifest | None:
                m = Manifest.from_json(client.get(ts.url + "/models/current").content)
                offsets = m.models["ttft"].regime_offsets
                if m.kind != "calibrated" or offsets is None:
                    return None
                return m if offsets.offsets[DEFAULT_SCHEME.labels().index(SHIFTED)] > 0.3 else None

            version = wait_until(calibrated, "a calibration version with the shifted regime corrected", 10)

            # calibration versions are rate-limited: wait until the last offsets scored are out
            def settled() -> bool:
                return bool(client.get(ts.url + "/status").json()["live"]["calibration_settled"])

            wait_until(settled, "the last offsets scored published", 10)
            version = Manifest.from_json(client.get(ts.url + "/models/current").content)
            assert version.kind == "calibrated"
            for name in ("ttft", "tpot"):
                assert version.models[name].sha256 == trained.models[name].sha256
                assert version.models[name].file == trained.models[name].file

            status = wait_until(
                lambda: (
                    (s := client.get(ps.url + "/status").json())["model_version"] == version.version and s
                ),
                "the replica to serve the calibration version",
                5,
            )
            switch_s = (
                datetime.fromisoformat(status["last_model_load"]) - datetime.fromisoformat(version.created_at)
            ).total_seconds()
            print(f"calibration version {version.version} served {switch_s * 1000:.0f} ms after publication")
            assert switch_s < 1.0
            loaded = [
                orjson.loads(line)
                for line in ps.logs().splitlines()
                if '"model_loaded"' in line and version.version in line
            ]
            assert loaded and loaded[-1]["reused_trees"] is True, loaded

            ttft_after, tpot_after, served = _predict(client, ps.url, rows)
            assert served == version.version
            # TPOT did not shift: its own online correction stays small (calibration noise).
            tpot_moved = np.abs(np.log1p(tpot_after) - np.log1p(tpot_before))
            assert np.max(tpot_moved) < 0.15, np.max(tpot_moved)
            # The other regimes' samples came with it, unchanged: they move by calibration noise only.
            ttft_moved = np.abs(np.log1p(ttft_after[~shifted]) - np.log1p(ttft_before[~shifted]))
            assert np.max(ttft_moved) < 0.15, np.max(ttft_moved)
            # TTFT doubled there; how much of that the offset must add depends on how high the trees
            # (and their work-ahead baseline) already predicted in that regime: well above 1, at most ~2.
            ratio = (1 + ttft_after[shifted]) / (1 + ttft_before[shifted])
            assert shifted.sum() >= 20 and np.allclose(ratio, ratio[0]) and 1.3 < ratio[0] < 2.6, ratio[:5]

        metrics = client.get(ts.url + "/metrics").text
        assert f'training_regime_offset{{model="ttft",regime="{SHIFTED}"}}' in metrics
        assert "training_calibration_publishes_total" in metrics


def test_a_drift_event_retrains_at_once(tmp_path: Path) -> None:
    data, logs = tmp_path / "data", tmp_path / "logs"
    with (
        start_service("training_server", ["--data-dir", str(data), *BASE_FLAGS], log_dir=logs) as ts,
        httpx.Client(timeout=30) as client,
    ):
        _train(client, ts.url)
        runs = client.get(ts.url + "/status").json()["training"]["runs"]
        # TTFT quadruples in one regime: far beyond what calibration absorbs in the first samples.
        for seed in range(4):
            _post(client, ts.url, _shifted_samples(500, 200 + seed, factor=4.0))

        def retrained() -> dict[str, Any] | None:
            status: dict[str, Any] = client.get(ts.url + "/status").json()
            return status if status["training"]["runs"] > runs and not status["training"]["running"] else None

        try:
            status = wait_until(retrained, "a retrain nobody asked for", 60)
        except AssertionError:
            print(orjson.dumps(client.get(ts.url + "/status").json(), option=orjson.OPT_INDENT_2).decode())
            print(ts.logs()[-3000:])
            raise
        assert status["live"]["drift_events"] >= 1
        assert status["live"]["last_drift"]["regime"] == SHIFTED
        assert status["live"]["last_drift"]["model"] == "ttft"
        assert 0 <= status["live"]["last_drift"]["seconds_ago"] < 60
        drift_lines = [orjson.loads(line) for line in ts.logs().splitlines() if '"drift_detected"' in line]
        assert drift_lines and drift_lines[0]["regime"] == SHIFTED
        metrics = client.get(ts.url + "/metrics").text
        assert f'training_drift_events_total{{model="ttft",regime="{SHIFTED}"}} ' in metrics
        assert "training_seconds_since_regime_change" in metrics


def test_the_prior_is_calibrated_online_before_the_first_retrain(tmp_path: Path) -> None:
    """Pods 4x slower than the prior guesses: before there are samples enough to train, the prior's
    calibration follows them (a calibration version that stays of kind ``prior``), and a replica
    serves it; the first retrain then replaces it as it replaces any prior."""
    data, logs = tmp_path / "data", tmp_path / "logs"
    flags = [
        "--data-dir",
        str(data),
        *BASE_FLAGS,
        "--min-train-samples",
        "100000",
        "--min-train-samples-tpot",
        "100000",
    ]
    with (
        start_service("training_server", flags, log_dir=logs) as ts,
        httpx.Client(timeout=30) as client,
    ):
        prior = Manifest.from_json(client.get(ts.url + "/models/current").content)
        assert prior.kind == "prior"
        store = ["--store", str(data / "models"), "--poll-interval-s", "0.1"]
        with start_service("prediction_server", store, log_dir=logs, ready_path="/readyz") as ps:
            rows = synthetic.samples(400, np.random.default_rng(7))
            probe = [
                {k: v for k, v in e.items() if not k.startswith("actual_")}
                for e in synthetic.to_entries(rows)
            ]
            ttft_before, _, served = _predict(client, ps.url, probe)
            assert served == prior.version
            slow = 4.0 * np.asarray(rows["actual_ttft_ms"])
            coverage_before = float(np.mean(slow <= ttft_before))

            def scored() -> bool:
                return bool(client.get(ts.url + "/status").json()["live"]["pending_samples"] == 0)

            for seed in range(40):
                batch = synthetic.samples(50, np.random.default_rng(300 + seed))
                batch["actual_ttft_ms"] = batch["actual_ttft_ms"] * 4.0
                _post(client, ts.url, batch)
                wait_until(scored, "scoring", 30)

            def widened() -> Manifest | None:
                m = Manifest.from_json(client.get(ts.url + "/models/current").content)
                offsets = m.models["ttft"].regime_offsets
                return m if offsets is not None and float(np.median(offsets.offsets)) > 0.5 else None

            version = wait_until(widened, "a calibrated prior", 10)
            assert version.kind == "prior" and version.version != prior.version
            assert version.models["ttft"].sha256 == prior.models["ttft"].sha256
            wait_until(
                lambda: client.get(ps.url + "/status").json()["model_version"] == version.version,
                "the replica to serve the calibrated prior",
                5,
            )
            ttft_after, _, _ = _predict(client, ps.url, probe)
            coverage_after = float(np.mean(slow <= ttft_after))
            print(f"prior TTFT coverage of 4x slower pods: {coverage_before:.3f} -> {coverage_after:.3f}")
            assert coverage_after > coverage_before + 0.3, (coverage_before, coverage_after)
            assert client.get(ts.url + "/readyz").json()["is_prior"] is True
