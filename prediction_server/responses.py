"""The JSON bodies of the prediction endpoints, encoded from prebuilt bytes.

A prediction is ``{"ttft_ms", "tpot_ms", "predicted_at", **Predictor.prediction_constants}``
(wire-contract.md section 2). The constant part is encoded once per version
(``Predictor.encoded_constants``); a call encodes its latencies with one ``orjson.dumps`` per
model and joins bytes, instead of building a dict per row. The bytes are exactly what
``orjson.dumps`` gives for the same dicts (``tests/unit/test_prediction_responses.py``), so the
wire format does not change: the same key order, float formatting and ``null`` for a NaN.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import numpy as np
import orjson

_TTFT = b'{"ttft_ms":'
_TPOT = b',"tpot_ms":'
_AT = b',"predicted_at":'


def encode_constants(constants: dict[str, Any]) -> bytes:
    """``,<the constant fields>}``: the end of every prediction of a version."""
    return b"," + orjson.dumps(constants)[1:]


def prediction_items(
    encoded_constants: bytes, ttft: np.ndarray, tpot: np.ndarray, missing: list[int] | None = None
) -> bytes:
    """The comma-separated predictions of one call (the inside of ``"predictions": [...]``), all
    with the same ``predicted_at``; ``null`` in place of those at the indices ``missing``."""
    # A float's JSON never holds a comma, so one dumps per model, split, gives every number.
    ttft_numbers = orjson.dumps(ttft.tolist())[1:-1].split(b",")
    tpot_numbers = orjson.dumps(tpot.tolist())[1:-1].split(b",")
    tail = _AT + orjson.dumps(datetime.now(UTC).isoformat()) + encoded_constants
    if not missing:
        between = tail + b"," + _TTFT
        return _TTFT + between.join(map(_TPOT.join, zip(ttft_numbers, tpot_numbers, strict=True))) + tail
    gaps = set(missing)
    return b",".join(
        b"null" if i in gaps else _TTFT + t + _TPOT + p + tail
        for i, (t, p) in enumerate(zip(ttft_numbers, tpot_numbers, strict=True))
    )


def bulk_body(
    items: bytes,
    total: int,
    model_version: str,
    started: float,
    errors: list[dict[str, Any]] | None = None,
) -> bytes:
    """A ``/predict/bulk[/strict]`` body around encoded ``items``; ``errors`` (``/predict/bulk``
    only) adds the per-item errors and counts them as failed."""
    failed = len(errors) if errors else 0
    return b"".join(
        (
            b'{"predictions":[',
            items,
            b'],"total_requests":%d,"successful_predictions":%d,"failed_predictions":%d'
            % (total, total - failed, failed),
            b',"processing_time_ms":',
            orjson.dumps((time.perf_counter() - started) * 1000.0),
            b',"model_version":',
            orjson.dumps(model_version),
            b"}" if errors is None else b',"errors":' + orjson.dumps(errors) + b"}",
        )
    )
