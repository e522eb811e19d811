"""``prediction_server.responses`` encodes exactly the bytes ``orjson.dumps`` gives for the
prediction dicts the wire contract describes: the same keys in the same order, the same float
formatting, ``null`` for a non-finite latency, one ``predicted_at`` per call."""

from __future__ import annotations

import math
import time

import numpy as np
import orjson
import pytest

from prediction_server.responses import bulk_body, encode_constants, prediction_items

CONSTANTS = {
    "model_type": "xgboost",
    "objective_type": "quantile",
    "quantile": 0.9,
    "last_model_load": "2026-12-02T03:00:00.123456+00:00",
    "model_version": '000007-trained "quoted" \u00e9',
    "model_kind": "trained",
}
ODD = [0.0, 1.0, 0.1, 1e-7, 1e16, 1.7976931348623157e308, 5e-324, 123456.789, 2.0**53, math.nan, math.inf]


def expected_dicts(ttft: np.ndarray, tpot: np.ndarray, predicted_at: str) -> list[dict[str, object]]:
    return [
        {"ttft_ms": t, "tpot_ms": p, "predicted_at": predicted_at, **CONSTANTS}
        for t, p in zip(ttft.tolist(), tpot.tolist(), strict=True)
    ]


@pytest.mark.parametrize("rows", [1, 2, 10, 257])
def test_bulk_bytes_equal_orjson_of_the_dicts(rows: int) -> None:
    rng = np.random.default_rng(rows)
    ttft = np.concatenate([rng.lognormal(5, 2, rows), ODD])[:rows] if rows > 2 else rng.lognormal(5, 2, rows)
    tpot = rng.choice(np.array(ODD), rows)
    started = time.perf_counter()
    body = bulk_body(prediction_items(encode_constants(CONSTANTS), ttft, tpot), rows, "v1", started)
    parsed = orjson.loads(body)
    predicted_at = parsed["predictions"][0]["predicted_at"]
    expected = {
        "predictions": expected_dicts(ttft, tpot, predicted_at),
        "total_requests": rows,
        "successful_predictions": rows,
        "failed_predictions": 0,
        "processing_time_ms": parsed["processing_time_ms"],
        "model_version": "v1",
    }
    assert body == orjson.dumps(expected)


def test_single_prediction_and_gaps_with_errors() -> None:
    ttft, tpot = np.array([12.5, math.nan, 3.0]), np.array([1.0, 2.0, math.inf])
    encoded = encode_constants(CONSTANTS)
    one = prediction_items(encoded, ttft[:1], tpot[:1])
    at = orjson.loads(one)["predicted_at"]
    assert one == orjson.dumps(expected_dicts(ttft[:1], tpot[:1], at)[0])
    errors = [{"index": 1, "error": "e", "request": {"a": 1}}, {"index": 2, "error": "e", "request": {}}]
    body = bulk_body(prediction_items(encoded, ttft, tpot, [1, 2]), 3, "v1", time.perf_counter(), errors)
    parsed = orjson.loads(body)
    at = parsed["predictions"][0]["predicted_at"]
    assert body == orjson.dumps(
        {
            "predictions": [expected_dicts(ttft, tpot, at)[0], None, None],
            "total_requests": 3,
            "successful_predictions": 1,
            "failed_predictions": 2,
            "processing_time_ms": parsed["processing_time_ms"],
            "model_version": "v1",
            "errors": errors,
        }
    )
