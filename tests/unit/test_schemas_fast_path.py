"""The fast validated path of ``shared.schemas.parse_rows`` accepts exactly what the field-by-field
path (``shared.row_errors.explain_rows``) accepts, with the same columns, and serves every well-formed row.

Every prediction call goes through the fast path; the field-by-field path is the one that explains
a 422. A value the fast path let through that the other refuses would be served unvalidated; a
well-formed row it declines would pay the slow path on the hot path.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from shared.errors import InvalidInput
from shared.row_errors import explain_rows
from shared.schemas import _parse_valid_fast
from shared.wire_fields import PREDICTED_FIELDS, ROW_FIELDS, TARGET_FIELDS
from tests.unit.test_coalescer_validation import GOOD, ODD_VALUES

FULL: dict[str, Any] = {
    **GOOD,
    "pod_type": "decode",
    "prefill_tokens_in_flight": 10,
    "decode_tokens_in_flight": 20,
    "encoder_matched_size": 0,
    "encoder_input_size": 4,
}
TRAINING_FIELDS = (*ROW_FIELDS, *TARGET_FIELDS, *PREDICTED_FIELDS)


def slow(rows: list[Any], fields: Any = ROW_FIELDS) -> dict[str, np.ndarray] | None:
    try:
        return explain_rows(rows, ("body", "requests"), fields, None)
    except InvalidInput:
        return None


def assert_agrees(rows: list[Any], fields: Any = ROW_FIELDS) -> None:
    fast = _parse_valid_fast(rows, fields)
    expected = slow(rows, fields)
    if fast is None:
        # Declining is allowed only for a row the slow path refuses or one holding an explicit null.
        assert expected is None or any(v is None for row in rows for v in row.values()), rows
        return
    assert expected is not None, f"fast path accepted rows the field-by-field path refuses: {rows}"
    assert list(fast) == list(expected)
    for name, column in fast.items():
        assert column.dtype == np.float64 and column.flags.c_contiguous
        assert np.array_equal(column, expected[name]), name


@pytest.mark.parametrize("field", [spec.name for spec in ROW_FIELDS] + ["unknown_field"])
@pytest.mark.parametrize("value", ODD_VALUES, ids=repr)
def test_every_odd_value_of_every_field(field: str, value: Any) -> None:
    assert_agrees([dict(FULL), {**FULL, field: value}])
    assert_agrees([{**GOOD, field: value}])
    assert_agrees([{k: v for k, v in FULL.items() if k != field}])


def test_random_rows_and_training_entries() -> None:
    rng = random.Random(20261202)
    names = [spec.name for spec in TRAINING_FIELDS]
    for _ in range(3000):
        rows: list[Any] = []
        for _ in range(rng.randint(1, 5)):
            row = dict(FULL, actual_ttft_ms=rng.choice([0, 12.5, 3_600_000.0]), actual_tpot_ms=1.25)
            for _ in range(rng.randint(0, 2)):
                if rng.random() < 0.2:
                    row.pop(rng.choice(names), None)
                else:
                    row[rng.choice(names)] = rng.choice(ODD_VALUES)
            rows.append(row)
        assert_agrees(rows, TRAINING_FIELDS)
        assert_agrees(rows)


def test_well_formed_rows_take_the_fast_path() -> None:
    rng = random.Random(7)
    rows = [
        {
            **FULL,
            "kv_cache_percentage": rng.random(),
            "prefix_cache_score": rng.choice([0, 1, 0.25]),
            "input_token_length": rng.randint(0, 2**31 - 1),
            "num_request_waiting": float(rng.randint(0, 50)),  # 2.0 is an integer
            "pod_type": rng.choice(["", "prefill", "decode"]),
        }
        for _ in range(300)
    ]
    rows[0].pop("encoder_input_size")  # an optional field absent: its default
    fast = _parse_valid_fast(rows, ROW_FIELDS)
    assert fast is not None
    assert fast["encoder_input_size"][0] == 0.0 and fast["pod_type"].tolist() == [
        {"": 0, "prefill": 1, "decode": 2}[row["pod_type"]] for row in rows
    ]
    assert_agrees(rows)
