"""Wire schemas of the scheduler-facing API and their vectorised validation.

Rows arrive as JSON objects (see wire-contract.md section 1). We never build a
per-row object: each field is pulled out as one list, type-checked with a set of
types, converted to one numpy column and range-checked with array operations.
Invalid values become FastAPI-style error items naming the row index and the
field, so a caller learns exactly what to fix. The fields themselves are defined in
``shared.wire_fields``; the field-by-field explanation of a bad body is ``shared.row_errors``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np
import orjson

from shared.errors import InvalidInput, PayloadTooLarge
from shared.row_errors import (
    MAX_REPORTED_ERRORS,
    NUMBER_TYPES,
    ErrorItems,
    error_item,
    explain_column,
    explain_rows,
)
from shared.wire_fields import (
    POD_TYPE_CODES,
    PREDICTED_FIELDS,
    ROW_FIELDS,
    TARGET_FIELDS,
    Columns,
    FieldSpec,
)

MAX_BULK_ROWS = 10_000
# Rows of a failing body explained on the event loop; beyond this, in a worker thread.
INLINE_EXPLAIN_ROWS = 256
# The byte caps of training-sample bodies, the same on every service that takes them: the
# coalescer refuses (413) exactly what the training server would, so it never acknowledges what
# the training server then refuses. A real entry is a few hundred bytes.
MAX_TRAINING_BODY_BYTES = 8 * 1024 * 1024
MAX_TRAINING_ENTRY_BYTES = 1024 * 1024  # a body no larger than this needs no per-entry measuring
_POD_TYPE_OR_NONE: dict[str | None, int] = {None: 0}
_POD_TYPE_OR_NONE.update(POD_TYPE_CODES)
# The Go client's zero time.Time: "no timestamp", which means "now".
ZERO_TIMESTAMPS = frozenset({"0001-01-01T00:00:00Z", "0001-01-01T00:00:00+00:00", ""})

_DICT_TYPE = frozenset({dict})


def loads(raw: bytes | str) -> Any:
    """Parse JSON with orjson, turning a syntax error into a 422 naming the position."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(
            [
                {
                    "type": "json_invalid",
                    "loc": ["body", exc.pos],
                    "msg": f"JSON decode error: {exc.msg}",
                    "input": None,
                }
            ]
        ) from None


def require_list(body: Any, key: str, *, max_items: int = MAX_BULK_ROWS) -> list[Any]:
    """Return ``body[key]`` as a non-empty list of at most ``max_items`` items, or raise a 422."""
    if not isinstance(body, dict):
        raise InvalidInput([error_item("dict_type", ["body"], "Input should be a valid dictionary", None)])
    items = body.get(key)
    loc = ["body", key]
    if items is None:
        raise InvalidInput([error_item("missing", loc, "Field required", None)])
    if not isinstance(items, list):
        raise InvalidInput([error_item("list_type", loc, "Input should be a valid list", None)])
    if not items:
        raise InvalidInput(
            [error_item("too_short", loc, "List should have at least 1 item after validation, not 0", [])]
        )
    if len(items) > max_items:
        raise InvalidInput(
            [
                error_item(
                    "too_long",
                    loc,
                    f"List should have at most {max_items} items after validation, not {len(items)}",
                    None,
                )
            ]
        )
    return items


def require_entries(body: bytes, *, max_items: int = MAX_BULK_ROWS) -> list[Any]:
    """The ``entries`` of a training-sample body: 413 if the body or any entry is over its byte cap
    (``MAX_TRAINING_BODY_BYTES``, ``MAX_TRAINING_ENTRY_BYTES``), 422 if it is not a list of entries."""
    if len(body) > MAX_TRAINING_BODY_BYTES:
        raise PayloadTooLarge(
            f"Request body of {len(body)} bytes exceeds the limit of {MAX_TRAINING_BODY_BYTES} bytes"
        )
    entries = require_list(loads(body), "entries", max_items=max_items)
    if len(body) > MAX_TRAINING_ENTRY_BYTES:  # else no entry can be over the cap: skip measuring
        for i, entry in enumerate(entries):
            size = len(orjson.dumps(entry))
            if size > MAX_TRAINING_ENTRY_BYTES:
                raise PayloadTooLarge(
                    f"Entry {i} is {size} bytes, over the limit of {MAX_TRAINING_ENTRY_BYTES} bytes per entry"
                )
    return entries


def parse_rows(
    rows: Sequence[Any],
    loc: Sequence[str | int] = ("body", "requests"),
    fields: Sequence[FieldSpec] = ROW_FIELDS,
    *,
    max_errors: int | None = MAX_REPORTED_ERRORS,
) -> Columns:
    """Validate feature rows and return them as columns, or raise ``InvalidInput``.

    ``loc`` prefixes each error location; the row index and the field name follow it.
    Unknown fields are ignored. Optional fields that are absent or ``null`` take their default.
    The exception lists at most ``max_errors`` items (``None``: every one) and counts all of
    them; rows that are not objects are reported along with the field errors of the others.
    This is the one explanation of bad rows: ``/predict/bulk`` of the prediction server and of
    the coalescer answer their whole-body 422 with it.
    """
    if _all_dicts(rows):
        columns = _parse_valid_fast(rows, fields)
        if columns is not None:
            return columns
    # Something is wrong (or unusual, e.g. an explicit null): field by field, to say exactly what.
    return explain_rows(rows, loc, fields, max_errors)


def valid_columns(rows: Sequence[Any], fields: Sequence[FieldSpec] = ROW_FIELDS) -> Columns | None:
    """The columns of ``rows`` if every row is valid, else ``None`` at the cost of the fast check
    only: no explanation is built (``parse_rows`` or ``parse_all_rows`` give it)."""
    if not _all_dicts(rows):
        return None
    return _parse_valid_fast(rows, fields)


def _all_dicts(rows: Sequence[Any]) -> bool:
    return set(map(type, rows)) <= _DICT_TYPE


async def parse_all_rows(rows: Sequence[Any], *, inline_rows: int = INLINE_EXPLAIN_ROWS) -> Columns:
    """``parse_rows`` reporting every bad row and field: the whole-body 422 of ``/predict/bulk`` on
    the prediction server and on the coalescer.

    A body of more than ``inline_rows`` rows is validated in a worker thread, so that one large
    malformed body does not stall the other calls on the event loop.
    """
    if len(rows) <= inline_rows:
        return parse_rows(rows, max_errors=None)
    return await asyncio.to_thread(parse_rows, rows, max_errors=None)


def _parse_valid_fast(rows: Sequence[dict[str, Any]], fields: Sequence[FieldSpec]) -> Columns | None:
    """The columns of rows that are all valid; ``None`` as soon as anything is not (``parse_rows``
    then explains it field by field).

    This is the hot path of every prediction call, so its work per value is done by C loops over
    tuples (``itemgetter``, ``zip``, ``set(map(type, ...))``, ``sum``, ``min``, ``max``), with a
    fixed number of Python steps per field and one numpy array at the end: no per-row object and
    no per-field numpy call. It accepts exactly what ``_parse_column`` accepts: ints and floats
    (not bools) within the bounds, integral floats for int fields, absent optional fields (their
    default; an explicit ``null`` takes the slow path, which accepts it), ``None``, ``""`` or a
    known name for ``pod_type``.
    """
    plan = _ROW_PLAN if fields is ROW_FIELDS else _fast_plan(tuple(fields))
    try:
        numbers = list(map(plan.getter, rows))
    except KeyError:  # an optional field absent somewhere: its default (a required one: None)
        numbers = [tuple([row.get(name, default) for name, default in plan.defaults]) for row in rows]
    by_field = list(zip(*numbers, strict=True)) if numbers else []
    values = list(chain.from_iterable(by_field))
    types = set(map(type, values))
    if not types <= NUMBER_TYPES:
        return None
    try:
        total = sum(values)
    except OverflowError:  # an int too large for a float
        return None
    if total != total:  # NaN somewhere (min and max below do not see it)
        return None
    for column, (lo, hi) in zip(by_field, plan.bounds, strict=True):
        if min(column) < lo or max(column) > hi:
            return None
    if float in types:
        for i in plan.int_fields:
            column = by_field[i]
            if float in set(map(type, column)) and not all(map(_integral, column)):
                return None
    matrix = np.array(values, dtype=np.float64).reshape(len(plan.bounds), len(rows))
    parsed: Columns = dict(zip(plan.names, matrix, strict=True))
    for name in plan.pod_fields:
        try:
            codes = [_POD_TYPE_OR_NONE.get(row.get(name), -1) for row in rows]
        except TypeError:  # an unhashable value (a list, an object)
            return None
        if -1 in codes:
            return None
        parsed[name] = np.array(codes, dtype=np.float64)
    return {spec.name: parsed[spec.name] for spec in fields}


def _integral(value: float) -> bool:
    return type(value) is int or value.is_integer()


@dataclass(frozen=True)
class _FastPlan:
    """``_parse_valid_fast``'s view of a field list: its numeric fields' getter and checks."""

    names: tuple[str, ...]
    getter: Callable[[dict[str, Any]], tuple[Any, ...]]
    defaults: tuple[tuple[str, float | None], ...]
    bounds: tuple[tuple[float, float], ...]
    int_fields: tuple[int, ...]
    pod_fields: tuple[str, ...]


@lru_cache(maxsize=8)
def _fast_plan(fields: tuple[FieldSpec, ...]) -> _FastPlan:
    numeric = [spec for spec in fields if spec.kind != "pod_type"]
    names = tuple(spec.name for spec in numeric)
    getter = itemgetter(*names) if len(names) > 1 else lambda row: (row[names[0]],)
    return _FastPlan(
        names=names,
        getter=getter,
        defaults=tuple((spec.name, spec.default) for spec in numeric),
        bounds=tuple((spec.lo, spec.hi) for spec in numeric),
        int_fields=tuple(i for i, spec in enumerate(numeric) if spec.kind == "int"),
        pod_fields=tuple(spec.name for spec in fields if spec.kind == "pod_type"),
    )


def rows_valid(rows: Sequence[Any], fields: Sequence[FieldSpec] = ROW_FIELDS) -> bool:
    """``True`` iff ``parse_rows(rows, fields=fields)`` would accept ``rows``, without building columns.

    Plain Python, no numpy: for the handful of rows of a typical scheduler call this is several
    times cheaper than ``parse_rows``'s fixed numpy overhead. Callers that only need a verdict
    (the coalescer forwards the rows as they came) use it first and call ``parse_rows`` only to
    explain a rejection.
    """
    numeric, pod_fields = _ROW_CHECKS if fields is ROW_FIELDS else _checks(tuple(fields))
    for row in rows:
        if type(row) is not dict:
            return False
        get = row.get
        for name, lo, hi, is_int, default in numeric:
            value: Any = get(name)
            kind = type(value)
            if kind is int:
                if value < lo or value > hi:
                    return False
            elif kind is float:
                if not lo <= value <= hi or (is_int and not value.is_integer()):  # NaN fails the range
                    return False
            elif value is not None or default is None:
                return False
        for name in pod_fields:
            value = get(name)
            if value is not None and (not isinstance(value, str) or value not in POD_TYPE_CODES):
                return False
    return True


@lru_cache(maxsize=8)
def _checks(
    fields: tuple[FieldSpec, ...],
) -> tuple[tuple[tuple[str, float, float, bool, float | None], ...], tuple[str, ...]]:
    """``rows_valid``'s view of ``fields``: numeric (name, lo, hi, is_int, default or ``None`` if
    required) and pod-type names."""
    numeric = tuple(
        (spec.name, spec.lo, spec.hi, spec.kind == "int", spec.default)
        for spec in fields
        if spec.kind != "pod_type"
    )
    return numeric, tuple(spec.name for spec in fields if spec.kind == "pod_type")


_ROW_CHECKS = _checks(ROW_FIELDS)
_ROW_PLAN = _fast_plan(ROW_FIELDS)


def parse_row(row: Any) -> Columns:
    """Validate one feature row (the body of ``POST /predict``); errors are located at ``body.<field>``."""
    if type(row) is not dict:
        raise InvalidInput([error_item("dict_type", ["body"], "Input should be a valid dictionary", None)])
    fast = _parse_valid_fast([row], ROW_FIELDS)
    if fast is not None:
        return fast
    errors = ErrorItems()
    columns = {spec.name: explain_column([row], spec, ("body",), errors, single=True) for spec in ROW_FIELDS}
    errors.raise_if_any()
    return columns


def parse_training_entries(
    entries: Sequence[Any], *, now_s: float, loc: Sequence[str | int] = ("body", "entries")
) -> tuple[Columns, np.ndarray]:
    """Validate training entries: feature columns, ``actual_*`` targets and the optional
    ``predicted_*`` fields (0 when absent), and timestamps in epoch seconds.

    An absent, null or zero-value (``0001-01-01T00:00:00Z``) timestamp means ``now_s``.
    """
    columns = parse_rows(entries, loc, (*ROW_FIELDS, *TARGET_FIELDS, *PREDICTED_FIELDS))
    errors = ErrorItems()
    timestamps = np.full(len(entries), now_s, dtype=np.float64)
    cache: dict[str, float] = {}
    for i, entry in enumerate(entries):
        value = entry.get("timestamp")
        if value is None or (type(value) is str and value in ZERO_TIMESTAMPS):
            continue
        parsed = cache.get(value) if isinstance(value, str) else None
        if parsed is None:
            parsed = _parse_timestamp(value)
            if parsed is None:
                errors.add(
                    "datetime_parsing",
                    [*loc, i, "timestamp"],
                    "Input should be an RFC 3339 date-time string",
                    value,
                )
                continue
            cache[value] = parsed
        timestamps[i] = parsed
    errors.raise_if_any()
    return columns, timestamps


def _parse_timestamp(value: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    if parsed.year <= 1:
        return None
    return parsed.timestamp()
