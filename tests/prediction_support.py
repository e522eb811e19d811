"""Test helpers for the prediction server: small real models, random rows, a store over HTTP.

``StoreHttpServer`` serves a ``ModelStore`` directory with the training server's read-only
store API (``GET /models/current`` -> manifest JSON or 404, ``GET /models/versions/{v}/{file}``
-> bytes) from a real ``http.server`` thread on a loopback port.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import numpy as np
import xgboost as xgb

from shared.artifacts import MANIFEST_FILE, Manifest, ModelSpec, sha256_hex, to_margin_target, utc_now_iso
from shared.features import build_features
from shared.model_store import CURRENT_FILE, ModelStore
from shared.prior import prior_latency_ms, synthetic_columns

ROW: dict[str, Any] = {
    "kv_cache_percentage": 0.3,
    "input_token_length": 800,
    "num_request_waiting": 2,
    "num_request_running": 5,
    "num_tokens_generated": 1,
    "prefix_cache_score": 0.25,
}


def train_models(seed: int, rows: int = 1500, rounds: int = 25) -> dict[str, bytes]:
    """Real XGBoost quantile models on the shared features; different seeds predict differently."""
    rng = np.random.default_rng(seed)
    columns = synthetic_columns(rows, rng)
    features = build_features(columns)
    ttft, tpot = prior_latency_ms(columns, 0.5)
    scale = 1.0 + 0.25 * seed
    models = {}
    for name, target in (("ttft", ttft * scale), ("tpot", tpot * scale)):
        noisy = target * rng.lognormal(0.0, 0.2, rows)
        booster = xgb.train(
            {
                "objective": "reg:quantileerror",
                "quantile_alpha": 0.9,
                "max_depth": 5,
                "eta": 0.3,
                "nthread": 1,
                "seed": seed,
            },
            xgb.DMatrix(features, label=to_margin_target(noisy, "log1p")),
            num_boost_round=rounds,
        )
        models[name] = bytes(booster.save_raw("ubj"))
    return models


def publish_trained(store: ModelStore, seed: int, **overrides: Any) -> Manifest:
    options: dict[str, Any] = {
        "objective": "quantile",
        "quantile": 0.9,
        "training_samples": {"ttft": 1500, "tpot": 1500},
        "xgboost_version": xgb.__version__,
    }
    options.update(overrides)
    return store.publish("trained", train_models(seed), **options)


def tamper(store: ModelStore, version: str, file: str = "ttft.ubj") -> None:
    """Flip one byte of a published model file, keeping its size: only the checksum can tell."""
    path = store.versions_dir / version / file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def point_current(store: ModelStore, version: str) -> None:
    """Switch ``CURRENT`` atomically, as ``ModelStore.publish`` does (e.g. a rollback)."""
    tmp = store.root / f".CURRENT.{uuid.uuid4().hex}"
    tmp.write_text(version)
    os.replace(tmp, store.root / CURRENT_FILE)


def publish_corrupt(store: ModelStore, seed: int) -> Manifest:
    """Atomically publish a version whose ttft file does not match its manifest's checksum.

    The version directory appears by rename, already corrupt, so no reader can ever see it intact.
    """
    models = train_models(seed)
    sequence = 1 + max((int(v.split("-", 1)[0]) for v in store.versions()), default=0)
    version = f"{sequence:06d}-trained"
    manifest = Manifest(
        version=version,
        sequence=sequence,
        kind="trained",
        created_at=utc_now_iso(),
        objective="quantile",
        quantile=0.9,
        models={
            name: ModelSpec(file=f"{name}.ubj", sha256=sha256_hex(data), size_bytes=len(data))
            for name, data in models.items()
        },
    )
    staging = store.root / f".staging-{uuid.uuid4().hex}"
    staging.mkdir(parents=True)
    for name, data in models.items():
        (staging / f"{name}.ubj").write_bytes(data)
    (staging / MANIFEST_FILE).write_bytes(manifest.to_json())
    corrupt = bytearray(models["ttft"])
    corrupt[len(corrupt) // 2] ^= 0xFF
    (staging / "ttft.ubj").write_bytes(bytes(corrupt))
    store.versions_dir.mkdir(parents=True, exist_ok=True)
    os.rename(staging, store.versions_dir / version)
    point_current(store, version)
    return manifest


def random_rows(n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """Valid wire rows with every optional field, as a scheduler sends them."""
    pod_types = ["", "prefill", "decode"]
    return [
        {
            "kv_cache_percentage": float(rng.uniform(0, 1)),
            "input_token_length": int(rng.integers(1, 32_000)),
            "num_request_waiting": int(rng.integers(0, 100)),
            "num_request_running": int(rng.integers(0, 256)),
            "num_tokens_generated": 1,
            "prefix_cache_score": float(rng.uniform(0, 1)),
            "pod_type": pod_types[int(rng.integers(0, 3))],
            "prefill_tokens_in_flight": int(rng.integers(0, 50_000)),
            "decode_tokens_in_flight": int(rng.integers(0, 400_000)),
            "encoder_matched_size": int(rng.integers(0, 100)),
            "encoder_input_size": int(rng.integers(0, 400)),
        }
        for _ in range(n)
    ]


class _StoreHandler(BaseHTTPRequestHandler):
    store: ModelStore
    requested: list[str] | None

    def do_GET(self) -> None:
        if self.requested is not None:
            self.requested.append(self.path)
        parts = [unquote(p) for p in self.path.split("?")[0].strip("/").split("/")]
        body: bytes | None = None
        if parts == ["models", "current"]:
            version = self.store.current_version()
            if version is not None:
                body = (self.store.versions_dir / version / MANIFEST_FILE).read_bytes()
        elif len(parts) == 4 and parts[:2] == ["models", "versions"]:
            path = self.store.versions_dir / parts[2] / parts[3]
            if ".." not in parts and path.is_file():
                body = path.read_bytes()
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None


@contextmanager
def serve_store_over_http(root: Path, requested: list[str] | None = None) -> Iterator[str]:
    """Serve the store at ``root`` on a loopback port; yields its base URL. Each GET's path is
    appended to ``requested`` if given."""
    handler = type("Handler", (_StoreHandler,), {"store": ModelStore(root), "requested": requested})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="store-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
