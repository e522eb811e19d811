"""Read recorded training entries from JSON lines, CSV or Parquet files (with pandas).

The format is named by the suffix before any compression suffix (``trace.jsonl.xz``,
``trace.csv.gz``, ``trace.parquet``); pandas infers the compression from the last suffix.
Values come back as plain Python values, with a missing cell (CSV) or null (JSON) left out of
its entry, so validation treats it as an absent field exactly as for an HTTP sender.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

_COMPRESSION = {".gz", ".xz", ".bz2", ".zst", ".zip"}
_JSON = {".jsonl", ".ndjson", ".json"}


def trace_format(path: Path) -> str:
    suffixes = [s.lower() for s in path.suffixes]
    while suffixes and suffixes[-1] in _COMPRESSION:
        suffixes.pop()
    suffix = suffixes[-1] if suffixes else ""
    if suffix in _JSON:
        return "jsonl"
    if suffix in (".csv", ".parquet"):
        return suffix[1:]
    raise ValueError(
        f"unknown trace format {path.name!r}: expected .jsonl, .csv or .parquet (optionally .gz/.xz)"
    )


def read_entries(path: Path) -> list[dict[str, Any]]:
    """Every row of ``path`` as a training-entry dict, in file order."""
    import pandas as pd  # only the importer needs pandas; the services never load it

    fmt = trace_format(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    if fmt == "jsonl":
        # dtype/convert_dates off: numbers and timestamp strings reach validation as written.
        frame = pd.read_json(path, lines=True, dtype=False, convert_dates=False, compression="infer")
    elif fmt == "csv":
        frame = pd.read_csv(path, compression="infer", keep_default_na=True, dtype={"timestamp": str})
    else:
        try:
            frame = pd.read_parquet(path)
        except ImportError as exc:
            raise ImportError(f"{exc} (install the 'parquet' extra: pip install '.[parquet]')") from exc
    return [_clean(row) for row in frame.to_dict(orient="records")]


def _clean(row: dict[Any, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    for key, value in row.items():
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        item = getattr(value, "item", None)  # numpy scalars (Parquet) -> Python values
        entry[str(key)] = item() if callable(item) else value
    return entry
