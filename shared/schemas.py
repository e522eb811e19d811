"""Wire schemas of the scheduler-facing API and their vectorised validation.

Rows arrive as JSON objects (see wire-contract.md section 1). We never build a
per-row object: each field is pulled out as one list, type-checked with a set of
types, converted to one numpy column and range-checked with array operations.
Invalid values become FastAPI-style error items naming the row index and the
field, so a caller learns exactly what to fix.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from itertools import chain
from operator import itemgetter
from typing import Any, Literal

import numpy as np
import orjson

from shared.errors import InvalidInput, PayloadTooLarge

MAX_BULK_ROWS = 10_000
MAX_REPORTED_ERRORS = 20
# Rows of a failing body explained on the event loop; beyond this, in a worker thread.
INLINE_EXPLAIN_ROWS = 256
# Generous but finite: keeps every feature exactly representable after float32 conversion
# of the derived features and rejects garbage such as 1e300 tokens.
MAX_COUNT = 2**31 - 1
MAX_LATENCY_MS = 3_600_000.0  # one hour
# The byte caps of training-sample bodies, the same on every service that takes them: the
# coalescer refuses (413) exactly what the training server would, so it never acknowledges what
# the training server then refuses. A real entry is a few hundred bytes.
MAX_TRAINING_BODY_BYTES = 8 * 1024 * 1024
MAX_TRAINING_ENTRY_BYTES = 1024 * 1024  # a body no larger than this needs no per-entry measuring
POD_TYPE_CODES: dict[str, int] = {"": 0, "prefill": 1, "decode": 2}
POD_TYPE_NAMES = {code: name for name, code in POD_TYPE_CODES.items()}
_POD_TYPE_OR_NONE: dict[str | None, int] = {None: 0}
_POD_TYPE_OR_NONE.update(POD_TYPE_CODES)
# The Go client's zero time.Time: "no timestamp", which means "now".
ZERO_TIMESTAMPS = frozenset({"0001-01-01T00:00:00Z", "0001-01-01T00:00:00+00:00", ""})

Kind = Literal["float", "int", "pod_type"]


@dataclass(frozen=True)
class FieldSpec:
    """One wire field: its kind, inclusive bounds and default (``None`` = required)."""

    name: str
    kind: Kind
    lo: float = 0.0
    hi: float = MAX_COUNT
    default: float | None = None

    @property
    def required(self) -> bool:
        return self.default is None


ROW_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("kv_cache_percentage", "float", 0.0, 1.0),
    FieldSpec("input_token_length", "int"),
    FieldSpec("num_request_waiting", "int"),
    FieldSpec("num_request_running", "int"),
    FieldSpec("num_tokens_generated", "int"),
    FieldSpec("prefix_cache_score", "float", 0.0, 1.0),
    FieldSpec("pod_type", "pod_type", default=0),
    FieldSpec("prefill_tokens_in_flight", "int", default=0),
    FieldSpec("decode_tokens_in_flight", "int", default=0),
    FieldSpec("encoder_matched_size", "int", default=0),
    FieldSpec("encoder_input_size", "int", default=0),
)
ROW_FIELD_NAMES = tuple(f.name for f in ROW_FIELDS)

TARGET_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("actual_ttft_ms", "float", 0.0, MAX_LATENCY_MS),
    FieldSpec("actual_tpot_ms", "float", 0.0, MAX_LATENCY_MS),
)
# Optional: the prediction the scheduler acted on for this request (newer llm-d routers send
# it). 0 or absent means "not sent", the same convention as the ``actual_*`` targets.
PREDICTED_FIELDS: tuple[FieldSpec, ...] = (
    FieldSpec("predicted_ttft_ms", "float", 0.0, MAX_LATENCY_MS, default=0.0),
    FieldSpec("predicted_tpot_ms", "float", 0.0, MAX_LATENCY_MS, default=0.0),
)

Columns = dict[str, np.ndarray]
"""Field name -> float64 column (``pod_type`` holds its integer code)."""

_NUMBER_TYPES = frozenset({int, float})
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
        raise InvalidInput([_err("dict_type", ["body"], "Input should be a valid dictionary", None)])
    items = body.get(key)
    loc = ["body", key]
    if items is None:
        raise InvalidInput([_err("missing", loc, "Field required", None)])
    if not isinstance(items, list):
        raise InvalidInput([_err("list_type", loc, "Input should be a valid list", None)])
    if not items:
        raise InvalidInput(
            [_err("too_short", loc, "List should have at least 1 item after validation, not 0", [])]
        )
    if len(items) > max_items:
        raise InvalidInput(
            [
                _err(
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
    return _parse_field_by_field(rows, loc, fields, max_errors)


def _parse_field_by_field(
    rows: Sequence[Any], loc: Sequence[str | int], fields: Sequence[FieldSpec], max_errors: int | None
) -> Columns:
    """``parse_rows`` without its fast path: every field's column checked on its own, every
    error located and counted."""
    errors = _Errors(max_errors)
    not_objects = [i for i, row in enumerate(rows) if type(row) is not dict]
    objects = [i for i, row in enumerate(rows) if type(row) is dict] if not_objects else None
    checked = rows if objects is None else [rows[i] for i in objects]
    for i in not_objects:
        errors.add("dict_type", [*loc, i], "Input should be a valid dictionary", rows[i])
    columns = {spec.name: _parse_column(checked, spec, loc, errors, indices=objects) for spec in fields}
    errors.raise_if_any()
    return columns


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
    if not types <= _NUMBER_TYPES:
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
        raise InvalidInput([_err("dict_type", ["body"], "Input should be a valid dictionary", None)])
    fast = _parse_valid_fast([row], ROW_FIELDS)
    if fast is not None:
        return fast
    errors = _Errors()
    columns = {spec.name: _parse_column([row], spec, ("body",), errors, single=True) for spec in ROW_FIELDS}
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
    errors = _Errors()
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


def pod_type_name(code: int) -> str:
    return POD_TYPE_NAMES.get(int(code), "")


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


class _Errors:
    """Collects error items, keeping the first few and counting all."""

    def __init__(self, max_items: int | None = MAX_REPORTED_ERRORS) -> None:
        self.items: list[dict[str, Any]] = []
        self.total = 0
        self.max_items = max_items

    def add(self, kind: str, loc: list[Any], msg: str, value: Any) -> None:
        self.total += 1
        if self.max_items is None or len(self.items) < self.max_items:
            self.items.append(_err(kind, loc, msg, value))

    def raise_if_any(self) -> None:
        if self.total:
            raise InvalidInput(self.items, total_errors=self.total)


def _err(kind: str, loc: list[Any], msg: str, value: Any) -> dict[str, Any]:
    if (isinstance(value, float) and not math.isfinite(value)) or (
        isinstance(value, int) and abs(value) >= 2**63
    ):
        value = str(value)  # keep the 422 body valid, serialisable JSON
    return {"type": kind, "loc": loc, "msg": msg, "input": value}


def _parse_column(
    rows: Sequence[dict[str, Any]],
    spec: FieldSpec,
    loc: Sequence[str | int],
    errors: _Errors,
    single: bool = False,
    indices: Sequence[int] | None = None,
) -> np.ndarray:
    """One field of ``rows``; ``indices`` maps a position in ``rows`` to the index reported."""
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
    if types <= _NUMBER_TYPES:
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
        reported = ~np.isfinite(column) & np.array([type(v) not in _NUMBER_TYPES for v in values])
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


def _parse_pod_type(values: list[Any], spec: FieldSpec, where: Any, errors: _Errors) -> np.ndarray:
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
