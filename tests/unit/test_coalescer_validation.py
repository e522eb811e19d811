"""``shared.schemas.rows_valid`` (the coalescer's cheap verdict) agrees with ``parse_rows`` exactly.

The coalescer forwards rows it judged valid with ``rows_valid``; a row that ``parse_rows`` (what
the replicas run) would refuse must never pass, or one bad caller could fail a whole batch.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from shared.errors import InvalidInput
from shared.schemas import parse_rows, rows_valid
from shared.wire_fields import ROW_FIELDS

GOOD: dict[str, Any] = {
    "kv_cache_percentage": 0.5,
    "input_token_length": 100,
    "num_request_waiting": 1,
    "num_request_running": 2,
    "num_tokens_generated": 1,
    "prefix_cache_score": 0.3,
}
ODD_VALUES: list[Any] = [
    None, True, False, "1", "", "prefill", "decode", "gpu", [], {}, [1], 0, 1, -1, 0.0, -0.0, 0.5, 1.0,
    1.5, 2.0, -0.5, 2**31 - 1, 2**31, 2**63, 10**30, 1e300, math.inf, -math.inf, math.nan,
]  # fmt: skip


def accepted(rows: list[Any]) -> bool:
    try:
        parse_rows(rows)
    except InvalidInput:
        return False
    return True


@pytest.mark.parametrize("field", [spec.name for spec in ROW_FIELDS] + ["unknown_field"])
@pytest.mark.parametrize("value", ODD_VALUES, ids=repr)
def test_every_odd_value_of_every_field_gets_the_same_verdict(field: str, value: Any) -> None:
    rows = [dict(GOOD), {**GOOD, field: value}]
    assert rows_valid(rows) == accepted(rows)
    missing = {k: v for k, v in GOOD.items() if k != field}
    assert rows_valid([missing]) == accepted([missing])


def test_random_rows_get_the_same_verdict() -> None:
    rng = random.Random(20261130)
    names = [spec.name for spec in ROW_FIELDS]
    for _ in range(3000):
        rows: list[Any] = []
        for _ in range(rng.randint(1, 4)):
            row: Any = dict(GOOD)
            for _ in range(rng.randint(0, 2)):
                if rng.random() < 0.2:
                    row.pop(rng.choice(names), None)
                else:
                    row[rng.choice(names)] = rng.choice(ODD_VALUES)
            if rng.random() < 0.02:
                row = rng.choice([[], "row", 1, None])
            rows.append(row)
        assert rows_valid(rows) == accepted(rows), rows
