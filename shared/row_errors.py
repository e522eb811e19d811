"""Explaining bad rows: which row, which field, why (the one explanation every 422 of a row uses).

``explain_rows`` checks every field's column of a body on its own and raises ``InvalidInput``
with FastAPI-style error items (``type``, ``loc``, ``msg``, ``input``) naming the row index and the
field, so a caller learns exactly what to fix. ``shared.schemas`` calls it once its fast path has
found something wrong (or unusual, such as an explicit ``null``); ``explain_column`` and
``ErrorItems`` serve its one-row and training-entry checks too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from shared.errors import InvalidInput
from shared.wire_fields import POD_TYPE_CODES, Columns, FieldSpec

MAX_REPORTED_ERRORS = 20
NUMBER_TYPES = frozenset({int, float})


def explain_rows(
    rows: Sequence[Any], loc: Sequence[str | int], fields: Sequence[FieldSpec], max_errors: int | None
) -> Columns:
    """``parse_rows`` without its fast path: every field's column checked on its own, every
    error located and counted."""
    errors = ErrorItems(max_errors)
    not_objects = [i for i, row in enumerate(rows) if type(row) is not dict]
    objects = [i for i, row in enumerate(rows) if type(row) is dict] if not_objects else None
    checked = rows if objects is None else [rows[i] for i in objects]
    for i in not_objects:
        errors.add("dict_type", [*loc, i], "Input should be a valid dictionary", rows[i])
    columns = {spec.name: explain_column(checked, spec, loc, errors, indices=objects) for spec in fields}
    errors.raise_if_any()
    return columns


class ErrorItems:
    """Collects error items, keeping the first few and counting all."""

    def __init__(self, max_items: int | None = MAX_REPORTED_ERRORS) -> None:
        self.items: list[dict[str, Any]] = []
        self.total = 0
        self.max_items = max_items

    def add(self, kind: str, loc: list[Any], msg: str, value: Any) -> None:
        self.total += 1
        if self.max_items is None or len(self.items) < self.max_items:
            self.items.append(error_item(kind, loc, msg, value))

    def raise_if_any(self) -> None:
        if self.total:
            raise InvalidInput(self.items, total_errors=self.total)


def error_item(kind: str, loc: list[Any], msg: str, value: Any) -> dict[str, Any]:
    """One FastAPI-style error item; a value JSON cannot carry (NaN, a huge int) is given as text."""
    if (isinstance(value, float) and not math.isfinite(value)) or (
        isinstance(value, int) and abs(value) >= 2**63
    ):
        value = str(value)  # keep the 422 body valid, serialisable JSON
    return {"type": kind, "loc": loc, "msg": msg, "input": value}


def explain_column(
    rows: Sequence[dict[str, Any]],
    spec: FieldSpec,
    loc: Sequence[str | int],
    errors: ErrorItems,
    single: bool = False,
    indices: Sequence[int] | None = None,
) -> np.ndarray:
    """One field of ``rows`` as a column, every bad value added to ``errors`` (``single``: one row,
    located at ``loc`` + field); ``indices`` maps a position in ``rows`` to the index reported."""
    name = spec.name
    values = [row.get(name) for row in rows]

    def where(i: int) -> list[Any]:
        if single:
            return [*loc, name]
        return [*loc, i if indices is None else indices[i], name]

    if spec.kind == "pod_type":
        return _parse_pod_type(values, spec, where, errors)
    types = set(map(type, values))
    column: np.ndarray | None = None
    if types <= NUMBER_TYPES:
        try:
            column = np.array(values, dtype=np.float64)
        except OverflowError:  # an int too large for a float: find it below
            column = None
    if column is None:
        column = np.empty(len(values), dtype=np.float64)
        for i, value in enumerate(values):
            vtype = type(value)
            if vtype is float or vtype is int:
                column[i] = float(value) if abs(value) < 1e300 else math.inf  # type: ignore[arg-type]
            elif value is None and not spec.required:
                column[i] = spec.default
            else:
                column[i] = math.nan  # keeps the range check below from reporting it twice
                if value is None and name not in rows[i]:
                    errors.add("missing", where(i), "Field required", None)
                elif value is None:
                    errors.add(f"{spec.kind}_type", where(i), f"Input should be a valid {_noun(spec)}", None)
                else:
                    errors.add(f"{spec.kind}_type", where(i), f"Input should be a valid {_noun(spec)}", value)
        reported = ~np.isfinite(column) & np.array([type(v) not in NUMBER_TYPES for v in values])
    else:
        reported = None
    bad = ~np.isfinite(column)
    if reported is not None:
        bad &= ~reported
    for i in np.flatnonzero(bad).tolist():
        errors.add("finite_number", where(i), "Input should be a finite number", values[i])
    finite = ~bad if reported is None else np.isfinite(column)
    lo, hi = (int(spec.lo), int(spec.hi)) if spec.kind == "int" else (spec.lo, spec.hi)
    for i in np.flatnonzero(finite & (column < spec.lo)).tolist():
        errors.add(
            "greater_than_equal", where(i), f"Input should be greater than or equal to {lo}", values[i]
        )
    for i in np.flatnonzero(finite & (column > spec.hi)).tolist():
        errors.add("less_than_equal", where(i), f"Input should be less than or equal to {hi}", values[i])
    if spec.kind == "int":
        fractional = finite & (column != np.trunc(column))
        for i in np.flatnonzero(fractional).tolist():
            errors.add(
                "int_from_float",
                where(i),
                "Input should be a valid integer, got a number with a fractional part",
                values[i],
            )
    return column


def _parse_pod_type(values: list[Any], spec: FieldSpec, where: Any, errors: ErrorItems) -> np.ndarray:
    codes = np.zeros(len(values), dtype=np.float64)
    if _only_defaults(values):
        return codes
    for i, value in enumerate(values):
        code = 0 if value is None else POD_TYPE_CODES.get(value) if isinstance(value, str) else None
        if code is None:
            errors.add("enum", where(i), "Input should be '', 'prefill' or 'decode'", value)
        else:
            codes[i] = code
    return codes


def _only_defaults(values: list[Any]) -> bool:
    """Every value is "" or None; an unhashable value (a list, an object) is simply not (no TypeError)."""
    try:
        return set(values) <= {"", None}
    except TypeError:
        return False


def _noun(spec: FieldSpec) -> str:
    return "integer" if spec.kind == "int" else "number"
