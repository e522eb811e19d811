"""The one feature function, shared by training and serving (numpy only).

Both services turn validated wire columns (``shared.wire_fields.Columns``) into the same
float32 matrix. Any change to the names, their order or their meaning must bump
``FEATURE_VERSION``: model artifacts record it, and a mismatched artifact is refused.
"""

from __future__ import annotations

import numpy as np

from shared.wire_fields import Columns

FEATURE_VERSION = 1

RAW_FEATURES: tuple[str, ...] = (
    "kv_cache_percentage",
    "input_token_length",
    "num_request_waiting",
    "num_request_running",
    "num_tokens_generated",
    "prefix_cache_score",
    "pod_type",
    "prefill_tokens_in_flight",
    "decode_tokens_in_flight",
    "encoder_matched_size",
    "encoder_input_size",
)
# Interactions that trees would otherwise need many splits to approximate.
DERIVED_FEATURES: tuple[str, ...] = (
    "uncached_input_tokens",  # prompt tokens this pod must actually prefill
    "queue_depth",  # waiting + running requests
    "prefill_work_tokens",  # prefill already in flight plus this request's uncached prompt
    "uncached_encoder_input",  # multimodal encoder input not found in the encoder cache
)
FEATURE_NAMES: tuple[str, ...] = RAW_FEATURES + DERIVED_FEATURES
NUM_FEATURES = len(FEATURE_NAMES)


def build_features(columns: Columns) -> np.ndarray:
    """Return the ``(rows, NUM_FEATURES)`` float32, C-contiguous feature matrix for validated columns."""
    n = len(columns["input_token_length"])
    out = np.empty((n, NUM_FEATURES), dtype=np.float32)
    for j, name in enumerate(RAW_FEATURES):
        out[:, j] = columns[name]
    base = len(RAW_FEATURES)
    uncached = columns["input_token_length"] * (1.0 - columns["prefix_cache_score"])
    out[:, base] = uncached
    out[:, base + 1] = columns["num_request_waiting"] + columns["num_request_running"]
    out[:, base + 2] = columns["prefill_tokens_in_flight"] + uncached
    out[:, base + 3] = np.maximum(columns["encoder_input_size"] - columns["encoder_matched_size"], 0.0)
    return out
