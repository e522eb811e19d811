"""``shared.row_decoder`` accepts a subset of what ``shared.schemas`` accepts, with the same values:
checked on valid, unusual, invalid and randomly mutated bodies."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from shared.errors import InvalidInput
from shared.row_decoder import RowMatrix, decode_bulk, decode_row, from_columns
from shared.schemas import MAX_BULK_ROWS, loads, parse_row, parse_rows, require_list
from tests.prediction_support import random_rows

REQUIRED = {
    "kv_cache_percentage": 0.5,
    "input_token_length": 100,
    "num_request_waiting": 2,
    "num_request_running": 3,
    "num_tokens_generated": 0,
    "prefix_cache_score": 0.25,
}


def _general(raw: bytes) -> RowMatrix | None:
    try:
        return from_columns(parse_rows(require_list(loads(raw), "requests")))
    except InvalidInput:
        return None


def _general_row(raw: bytes) -> RowMatrix | None:
    try:
        return from_columns(parse_row(loads(raw)))
    except InvalidInput:
        return None


def _same(a: RowMatrix, b: RowMatrix) -> bool:
    return all(
        x.shape == y.shape and np.array_equal(x.view(np.uint64), y.view(np.uint64))
        for x, y in ((a.numeric, b.numeric), (a.codes, b.codes))
    )


def _check(raw: bytes) -> RowMatrix | None:
    """The subset rule for one body; returns what the decoder gave."""
    fast, general = decode_bulk(raw), _general(raw)
    if fast is not None:
        assert general is not None, raw
        assert _same(fast, general), raw
    return fast


def _body(*rows: dict[str, Any]) -> bytes:
    return b'{"requests":[' + b",".join(map(_row, rows)) + b"]}"


def _row(row: dict[str, Any]) -> bytes:
    """orjson's encoding, and Python's for ints orjson refuses (beyond 64 bits)."""
    return (
        b"{"
        + b",".join(
            orjson.dumps(k) + b":" + str(v).encode() if type(v) is int else orjson.dumps({k: v})[1:-1]
            for k, v in row.items()
        )
        + b"}"
    )


def test_scheduler_bodies_take_the_decoder_with_the_general_paths_values() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 10, 100, 1000):
        assert _check(_body(*random_rows(n, rng))) is not None
    minimal = _body(REQUIRED)  # optional fields absent: their defaults
    assert _check(minimal) is not None
    extra = _body({**REQUIRED, "unknown": {"nested": [1, None, "x"]}, "pod_type": "decode"})
    assert _check(extra) is not None
    go_client = (
        b'{"requests":[{"kv_cache_percentage":0,"input_token_length":1,"num_request_waiting":0,'
        b'"num_request_running":0,"num_tokens_generated":0,"prefix_cache_score":1,"pod_type":""}]}'
    )
    assert _check(go_client) is not None  # ints for the float fields, as Go's encoder writes them
    assert _check(b' {"other": 1, "requests": [' + orjson.dumps(REQUIRED) + b"]}\n") is not None


UNUSUAL_OR_BAD: list[tuple[str, Any]] = [
    ("integral float for an int field", {"input_token_length": 5.0}),
    ("fractional float for an int field", {"input_token_length": 5.5}),
    ("explicit null optional", {"prefill_tokens_in_flight": None}),
    ("null pod type", {"pod_type": None}),
    ("unknown pod type", {"pod_type": "both"}),
    ("bool", {"num_request_waiting": True}),
    ("string number", {"num_request_waiting": "3"}),
    ("negative", {"num_request_running": -1}),
    ("kv above 1", {"kv_cache_percentage": 1.5}),
    ("too large", {"input_token_length": 2**31}),
    ("huge int", {"input_token_length": 10**30}),
    ("negative zero", {"kv_cache_percentage": -0.0}),
    ("exponent", {"prefix_cache_score": 1e-3}),
    ("missing required", {"input_token_length": ...}),
]


@pytest.mark.parametrize("case", UNUSUAL_OR_BAD, ids=[name for name, _ in UNUSUAL_OR_BAD])
def test_unusual_and_invalid_rows(case: tuple[str, Any]) -> None:
    _, change = case
    row = {**REQUIRED, **change}
    row = {key: value for key, value in row.items() if value is not ...}
    _check(_body(row))
    _check(_body(REQUIRED, row, REQUIRED))
    fast, general = decode_row(_row(row)), _general_row(_row(row))
    if fast is not None:
        assert general is not None and _same(fast, general)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"[]",
        b'{"requests": []}',
        b'{"requests": {}}',
        b'{"requests": [1]}',
        b'{"requests": [[]]}',
        b'{"requests": null}',
        b'{"requests": [' + orjson.dumps(REQUIRED) + b"]} trailing",
        b'{"requests": [' + orjson.dumps(REQUIRED) + b"]",
        b'{"requests": [' + orjson.dumps(REQUIRED) + b'], "requests": []}',
        b'{"requests": [], "requests": [' + orjson.dumps(REQUIRED) + b"]}",
        b'{"requests": [{"kv_cache_percentage": 0.5, "kv_cache_percentage": 0.7'
        + orjson.dumps(REQUIRED)[1:]
        + b"]}",
        b'{"requests": [' + orjson.dumps({**REQUIRED, "x": "\\ud800"}) + b"]}",
        b'{"requests": [' + orjson.dumps(REQUIRED)[:-1] + b', "x": "\xff\xfe"}]}',
        b'\xef\xbb\xbf{"requests": [' + orjson.dumps(REQUIRED) + b"]}",
        b'{"requests": [' + orjson.dumps({**REQUIRED, "pod_type": "pre\\u0066ill"}) + b"]}",
        b'{"requests": [' + orjson.dumps(REQUIRED).replace(b"100", b"1E2") + b"]}",
        b'{"requests": [' + orjson.dumps(REQUIRED).replace(b"0.5", b"NaN") + b"]}",
        b'{"requests": [' + orjson.dumps(REQUIRED).replace(b"0.5", b"Infinity") + b"]}",
        b'{"requests": [' + orjson.dumps(REQUIRED).replace(b"0.5", b"5e-1") + b"]}",
    ],
)
def test_bodies_at_the_edges_of_json(raw: bytes) -> None:
    _check(raw)


def test_too_many_rows_take_the_general_path() -> None:
    assert _check(_body(*([REQUIRED] * (MAX_BULK_ROWS + 1)))) is None
    assert _check(_body(*([REQUIRED] * MAX_BULK_ROWS))) is not None


def test_randomly_mutated_bodies_never_decode_to_other_values() -> None:
    """Byte-level mutations of valid bodies: whatever the decoder accepts, the general path
    accepts with the same values (and most mutations are refused by both)."""
    rng = np.random.default_rng(7)
    alphabet = b'0123456789.-+eE,:{}[]" nul\\tx'
    accepted = 0
    for _ in range(3000):
        raw = bytearray(_body(*random_rows(int(rng.integers(1, 4)), rng)))
        for _ in range(int(rng.integers(1, 4))):
            at = int(rng.integers(0, len(raw)))
            action = int(rng.integers(0, 3))
            byte = alphabet[int(rng.integers(0, len(alphabet)))]
            if action == 0:
                raw[at] = byte
            elif action == 1:
                raw.insert(at, byte)
            else:
                del raw[at]
        if _check(bytes(raw)) is not None:
            accepted += 1
    assert 0 < accepted < 3000  # both outcomes were exercised
