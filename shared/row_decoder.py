"""Prediction bodies decoded straight from JSON bytes into row matrices (msgspec), when valid.

The prediction hot path's first step. ``decode_bulk`` (``{"requests": [row, ...]}``) and
``decode_row`` (one row) turn a body into a ``RowMatrix`` in one C pass of msgspec over the bytes,
against typed structs generated from ``shared.wire_fields.ROW_FIELDS``: no dict per row, no
Python-level check per value. They accept a strict subset of what ``shared.schemas`` accepts:
ints for int fields, ints or floats for float fields, each within its bounds, a known
``pod_type`` name, optional fields absent, an ASCII body (msgspec skips unknown fields without
checking their UTF-8; JSON escapes non-ASCII text in ASCII). Anything else (a float for an int
field, an explicit ``null``, a malformed body, a bad value) gives ``None``, and the caller takes
the general path (``orjson`` + ``shared.schemas.parse_rows``), which accepts what it accepts and
writes the 422 that names every bad field. So a body gets the same answer on either path, and
the same values: ``tests/unit/test_row_decoder.py`` checks both on valid, unusual and mutated
bodies.
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter
from typing import Annotated, Any, Literal, NamedTuple

import msgspec
import numpy as np

from shared.schemas import MAX_BULK_ROWS
from shared.wire_fields import POD_TYPE_CODES, ROW_FIELDS, Columns, FieldSpec

NUMERIC_ROW_FIELDS: tuple[str, ...] = tuple(spec.name for spec in ROW_FIELDS if spec.kind != "pod_type")
NUMERIC_FIELDS = len(NUMERIC_ROW_FIELDS)
_POD_FIELDS = tuple(spec.name for spec in ROW_FIELDS if spec.kind == "pod_type")
if _POD_FIELDS != ("pod_type",):
    raise ImportError("RowMatrix holds exactly one pod-type column")


class RowMatrix(NamedTuple):
    """Validated rows: ``numeric`` ``(n, NUMERIC_FIELDS)`` float64 (``NUMERIC_ROW_FIELDS`` order),
    ``codes`` ``(n,)`` float64 pod-type codes (``POD_TYPE_CODES``)."""

    numeric: np.ndarray
    codes: np.ndarray


def _field_type(spec: FieldSpec) -> Any:
    if spec.kind == "pod_type":
        return Literal[tuple(POD_TYPE_CODES)]
    if spec.kind == "int":
        return Annotated[int, msgspec.Meta(ge=int(spec.lo), le=int(spec.hi))]
    return Annotated[float, msgspec.Meta(ge=spec.lo, le=spec.hi)]


def _field(spec: FieldSpec) -> tuple[Any, ...]:
    kind = _field_type(spec)
    if spec.default is None:
        return (spec.name, kind)
    default: Any = (
        "" if spec.kind == "pod_type" else int(spec.default) if spec.kind == "int" else spec.default
    )
    return (spec.name, kind, default)


_Row = msgspec.defstruct("Row", [_field(spec) for spec in ROW_FIELDS], gc=False)
_Body = msgspec.defstruct(
    "Body",
    [("requests", Annotated[list[_Row], msgspec.Meta(min_length=1, max_length=MAX_BULK_ROWS)])],  # type: ignore[valid-type]
    gc=False,
)
_BULK = msgspec.json.Decoder(_Body)
_ONE = msgspec.json.Decoder(_Row)
_NUMBERS = attrgetter(*NUMERIC_ROW_FIELDS)
_POD = attrgetter("pod_type")
_CODES = {name: float(code) for name, code in POD_TYPE_CODES.items()}


def decode_bulk(raw: bytes) -> RowMatrix | None:
    """The rows of a valid ``{"requests": [...]}`` body, or ``None`` (see the module docstring)."""
    if not raw.isascii():  # msgspec does not check the UTF-8 of the fields it skips
        return None
    try:
        rows = _BULK.decode(raw).requests  # type: ignore[attr-defined]
    except msgspec.DecodeError:  # ValidationError included
        return None
    return _matrix(rows)


def decode_row(raw: bytes) -> RowMatrix | None:
    """The one row of a valid ``POST /predict`` body, or ``None``."""
    if not raw.isascii():
        return None
    try:
        row = _ONE.decode(raw)
    except msgspec.DecodeError:
        return None
    return _matrix([row])


def _matrix(rows: list[Any]) -> RowMatrix:
    n = len(rows)  # fromiter with a count: no shape discovery over nested tuples
    numeric = np.fromiter(chain.from_iterable(map(_NUMBERS, rows)), np.float64, count=n * NUMERIC_FIELDS)
    codes = np.fromiter(map(_CODES.__getitem__, map(_POD, rows)), np.float64, count=n)
    return RowMatrix(numeric.reshape(n, NUMERIC_FIELDS), codes)


def from_columns(columns: Columns) -> RowMatrix:
    """The rows of ``shared.schemas.parse_rows``' columns."""
    numeric = np.stack([columns[name] for name in NUMERIC_ROW_FIELDS], axis=1)  # C-contiguous
    codes = np.asarray(columns["pod_type"], dtype=np.float64)
    return RowMatrix(numeric.astype(np.float64, copy=False), codes)


def to_columns(rows: RowMatrix) -> Columns:
    """``shared.schemas``' columns of ``rows`` (what ``shared.features.build_features`` takes)."""
    columns: Columns = dict(zip(NUMERIC_ROW_FIELDS, rows.numeric.T, strict=True))
    columns["pod_type"] = rows.codes
    return {spec.name: columns[spec.name] for spec in ROW_FIELDS}
