"""Synthetic training samples with known latency quantiles (for tests, benchmarks and demos).

Pod states are drawn at random; TTFT and TPOT are a deterministic base latency times
log-normal noise whose spread depends on the KV-cache load, so the true q-quantile of
each sample is known exactly: ``base * exp(sigma * z_q)``. The base differs from the
analytic prior's, so a trained model has something to learn.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import Any

import numpy as np

from shared.wire_fields import POD_TYPE_NAMES, ROW_FIELDS, Columns

INT_FIELDS = tuple(spec.name for spec in ROW_FIELDS if spec.kind == "int")


def pod_states(n: int, rng: np.random.Generator, *, waiting: int | None = None) -> Columns:
    """Random pod states; ``waiting`` pins ``num_request_waiting`` (to build one regime)."""
    queue = rng.geometric(0.45, n) - 1 if waiting is None else np.full(n, waiting)
    return {
        "kv_cache_percentage": rng.uniform(0.0, 0.95, n),
        "input_token_length": np.floor(np.exp(rng.uniform(np.log(16), np.log(8000), n))),
        "num_request_waiting": queue.astype(np.float64),
        "num_request_running": rng.integers(0, 64, n).astype(np.float64),
        "num_tokens_generated": np.ones(n),
        "prefix_cache_score": np.where(rng.uniform(size=n) < 0.4, 0.0, rng.uniform(0, 1, n)),
        "pod_type": np.zeros(n),
        "prefill_tokens_in_flight": np.floor(rng.uniform(0, 8000, n)),
        "decode_tokens_in_flight": np.floor(rng.uniform(0, 50_000, n)),
        "encoder_matched_size": np.zeros(n),
        "encoder_input_size": np.zeros(n),
    }


def _base_and_sigma(columns: Columns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    kv = columns["kv_cache_percentage"]
    uncached = columns["input_token_length"] * (1.0 - columns["prefix_cache_score"])
    waiting = columns["num_request_waiting"]
    running = columns["num_request_running"]
    ttft = 25.0 + 0.12 * uncached + waiting * (80.0 + 150.0 * kv) + 1.5 * running
    ttft += 0.01 * columns["prefill_tokens_in_flight"]
    tpot = 6.0 + 0.35 * running + 20.0 * kv**2 + 0.0002 * columns["decode_tokens_in_flight"]
    sigma = 0.2 + 0.3 * kv
    return ttft, tpot, sigma


def latencies(columns: Columns, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Sampled TTFT and TPOT in milliseconds."""
    ttft, tpot, sigma = _base_and_sigma(columns)
    n = len(sigma)
    return ttft * np.exp(sigma * rng.standard_normal(n)), tpot * np.exp(sigma * rng.standard_normal(n))


def true_quantiles(columns: Columns, quantile: float) -> tuple[np.ndarray, np.ndarray]:
    """The exact ``quantile`` of TTFT and TPOT for each pod state."""
    ttft, tpot, sigma = _base_and_sigma(columns)
    factor = np.exp(sigma * NormalDist().inv_cdf(quantile))
    return ttft * factor, tpot * factor


def samples(n: int, rng: np.random.Generator, *, waiting: int | None = None) -> Columns:
    """Pod states plus sampled ``actual_ttft_ms`` / ``actual_tpot_ms`` columns."""
    columns = pod_states(n, rng, waiting=waiting)
    columns["actual_ttft_ms"], columns["actual_tpot_ms"] = latencies(columns, rng)
    return columns


def to_entries(columns: Columns, timestamps: list[str] | None = None) -> list[dict[str, Any]]:
    """Wire-format training entries (ints as JSON integers, pod type as its name)."""
    names = list(columns)
    lists = [
        [POD_TYPE_NAMES[int(v)] for v in columns[name]]
        if name == "pod_type"
        else columns[name].astype(np.int64).tolist()
        if name in INT_FIELDS
        else columns[name].tolist()
        for name in names
    ]
    entries = [dict(zip(names, values, strict=True)) for values in zip(*lists, strict=True)]
    if timestamps is not None:
        for entry, stamp in zip(entries, timestamps, strict=True):
            entry["timestamp"] = stamp
    return entries
