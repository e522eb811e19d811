"""Wire validation: what passes, and the exact error items for what does not."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pytest

from shared.errors import InvalidInput
from shared.schemas import MAX_BULK_ROWS, loads, parse_row, parse_rows, parse_training_entries, require_list
from shared.wire_fields import ROW_FIELD_NAMES

ROW = {
    "kv_cache_percentage": 0.5,
    "input_token_length": 100,
    "num_request_waiting": 1,
    "num_request_running": 2,
    "num_tokens_generated": 1,
    "prefix_cache_score": 0.25,
}


def errors_of(fn, *args, **kwargs) -> list[dict]:
    with pytest.raises(InvalidInput) as info:
        fn(*args, **kwargs)
    body = orjson.loads(orjson.dumps(info.value.errors))  # must be serialisable as a 422 body
    return body


def test_valid_rows_become_columns_with_defaults():
    cols = parse_rows([ROW, {**ROW, "pod_type": "decode", "prefill_tokens_in_flight": 7, "extra": "ignored"}])
    assert set(cols) == set(ROW_FIELD_NAMES)
    assert cols["input_token_length"].tolist() == [100.0, 100.0]
    assert cols["pod_type"].tolist() == [0.0, 2.0]
    assert cols["prefill_tokens_in_flight"].tolist() == [0.0, 7.0]
    assert cols["encoder_input_size"].tolist() == [0.0, 0.0]


def test_integral_float_is_accepted_as_int_and_null_optional_takes_default():
    cols = parse_rows([{**ROW, "input_token_length": 2.0, "pod_type": None, "decode_tokens_in_flight": None}])
    assert cols["input_token_length"][0] == 2.0
    assert cols["pod_type"][0] == 0.0
    assert cols["decode_tokens_in_flight"][0] == 0.0


@pytest.mark.parametrize(
    ("field", "value", "kind"),
    [
        ("input_token_length", 1.5, "int_from_float"),
        ("kv_cache_percentage", 1.01, "less_than_equal"),
        ("prefix_cache_score", -0.1, "greater_than_equal"),
        ("num_request_waiting", -1, "greater_than_equal"),
        ("num_request_running", "3", "int_type"),
        ("num_request_running", True, "int_type"),
        ("kv_cache_percentage", math.nan, "finite_number"),
        ("kv_cache_percentage", math.inf, "finite_number"),
        ("input_token_length", 10**40, "less_than_equal"),
        ("input_token_length", 10**400, "finite_number"),
        ("pod_type", "gpu", "enum"),
        ("kv_cache_percentage", None, "float_type"),
    ],
)
def test_each_bad_value_is_reported_with_index_and_field(field, value, kind):
    rows = [ROW, ROW, {**ROW, field: value}]
    errors = errors_of(parse_rows, rows)
    assert len(errors) == 1
    assert errors[0]["type"] == kind
    assert errors[0]["loc"] == ["body", "requests", 2, field]
    assert errors[0]["msg"]


def test_missing_required_field_and_non_object_rows():
    missing = {k: v for k, v in ROW.items() if k != "num_tokens_generated"}
    errors = errors_of(parse_rows, [ROW, missing])
    assert errors == [
        {
            "type": "missing",
            "loc": ["body", "requests", 1, "num_tokens_generated"],
            "msg": "Field required",
            "input": None,
        }
    ]
    errors = errors_of(parse_rows, [ROW, [1, 2]])
    assert errors[0]["loc"] == ["body", "requests", 1] and errors[0]["type"] == "dict_type"


def test_non_object_rows_are_reported_with_the_field_errors_of_the_others():
    rows = [
        ROW,
        "nope",
        {**ROW, "kv_cache_percentage": 2.0},
        None,
        {k: v for k, v in ROW.items() if k != "input_token_length"},
    ]
    locs = [e["loc"] for e in errors_of(parse_rows, rows)]
    assert sorted(locs, key=str) == sorted(
        [
            ["body", "requests", 1],
            ["body", "requests", 3],
            ["body", "requests", 2, "kv_cache_percentage"],
            ["body", "requests", 4, "input_token_length"],
        ],
        key=str,
    )


def test_every_error_is_reported_when_asked():
    with pytest.raises(InvalidInput) as info:
        parse_rows([{**ROW, "kv_cache_percentage": 2.0, "num_request_waiting": -1}] * 500, max_errors=None)
    assert info.value.total_errors == len(info.value.errors) == 1000


def test_many_errors_are_counted_but_the_report_is_bounded():
    with pytest.raises(InvalidInput) as info:
        parse_rows([{**ROW, "kv_cache_percentage": 2.0}] * 500)
    assert info.value.total_errors == 500
    assert len(info.value.errors) == 20


def test_single_row_errors_are_located_at_body_field():
    errors = errors_of(parse_row, {**ROW, "input_token_length": -5})
    assert errors[0]["loc"] == ["body", "input_token_length"]
    assert parse_row(ROW)["kv_cache_percentage"].tolist() == [0.5]


def test_body_shape_errors():
    assert errors_of(require_list, {"requests": []}, "requests")[0]["type"] == "too_short"
    assert (
        errors_of(require_list, {"requests": [ROW] * (MAX_BULK_ROWS + 1)}, "requests")[0]["type"]
        == "too_long"
    )
    assert errors_of(require_list, {}, "requests")[0]["type"] == "missing"
    assert errors_of(require_list, {"requests": {}}, "requests")[0]["type"] == "list_type"
    assert errors_of(require_list, [], "requests")[0]["type"] == "dict_type"
    assert errors_of(loads, b'{"requests": [')[0]["type"] == "json_invalid"
    assert errors_of(loads, b"[NaN]")[0]["type"] == "json_invalid"


def test_training_entries_targets_and_timestamps():
    entries = [
        {**ROW, "actual_ttft_ms": 120.5, "actual_tpot_ms": 0, "timestamp": "0001-01-01T00:00:00Z"},
        {**ROW, "actual_ttft_ms": 0, "actual_tpot_ms": 9.5, "timestamp": "2026-11-30T10:00:00+00:00"},
        {**ROW, "actual_ttft_ms": 80, "actual_tpot_ms": 11},
    ]
    cols, ts = parse_training_entries(entries, now_s=1000.0)
    assert cols["actual_ttft_ms"].tolist() == [120.5, 0.0, 80.0]
    assert ts[0] == 1000.0 and ts[2] == 1000.0
    assert ts[1] == pytest.approx(1796032800.0)
    errors = errors_of(parse_training_entries, [{**entries[0], "actual_ttft_ms": -1}], now_s=0.0)
    assert errors[0]["loc"] == ["body", "entries", 0, "actual_ttft_ms"]
    errors = errors_of(parse_training_entries, [{**entries[0], "timestamp": "yesterday"}], now_s=0.0)
    assert errors[0]["loc"] == ["body", "entries", 0, "timestamp"]
    errors = errors_of(
        parse_training_entries, [{k: v for k, v in entries[2].items() if k != "actual_tpot_ms"}], now_s=0.0
    )
    assert errors[0]["loc"] == ["body", "entries", 0, "actual_tpot_ms"]


def test_training_entries_optional_predicted_fields():
    base = {**ROW, "actual_ttft_ms": 100.0, "actual_tpot_ms": 10.0}
    entries = [
        {**base, "predicted_ttft_ms": 95.5, "predicted_tpot_ms": 12},
        base,
        {**base, "predicted_ttft_ms": None},
    ]
    cols, _ = parse_training_entries(entries, now_s=0.0)
    assert cols["predicted_ttft_ms"].tolist() == [95.5, 0.0, 0.0]
    assert cols["predicted_tpot_ms"].tolist() == [12.0, 0.0, 0.0]
    for bad, kind in ((-1.0, "greater_than_equal"), ("fast", "float_type"), (float("inf"), "finite_number")):
        errors = errors_of(parse_training_entries, [{**base, "predicted_tpot_ms": bad}], now_s=0.0)
        assert errors[0]["loc"] == ["body", "entries", 0, "predicted_tpot_ms"]
        assert errors[0]["type"] == kind


def test_columns_are_float64_arrays_of_the_right_length():
    cols = parse_rows([ROW] * 37)
    assert all(
        isinstance(c, np.ndarray) and c.dtype == np.float64 and c.shape == (37,) for c in cols.values()
    )
