"""``python -m training_server import-trace FILE...``: load recorded samples into the window.

A new deployment then starts from history instead of the built-in prior. Files are JSON lines,
CSV or Parquet (Parquet needs the ``parquet`` extra), optionally ``.gz``/``.xz``/``.bz2``
compressed, one training entry per line/row in the wire format (docs/wire-contract.md section 3,
as the recorded traces in ``llmd-h200-traces``). Every entry goes through the same validation as
ingestion (``shared.schemas.parse_training_entries``); an invalid entry is skipped and counted,
the rest load.

Entries without a ``timestamp`` are timed by their order: line order is time, across the files
in the order given, with increasing timestamps ``--spacing-s`` apart ending now.

- ``--data-dir DIR``: offline, with the training server stopped: the samples are added to the
  window persisted in ``DIR`` through the server's own persistence (snapshot plus journal,
  ``training_server.persistence``), with the server's stratum cap and age limit.
- ``--url URL``: into a running training server (or a coalescer), in bulk requests of
  ``--batch-size`` entries to ``/add_training_data_bulk``, waiting ``Retry-After`` on 429/503.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from shared.client import bearer_headers, retry_after_s
from shared.errors import InvalidInput
from shared.schemas import parse_training_entries
from shared.wire_fields import Columns
from training_server.config import TrainingSettings
from training_server.trace_files import read_entries

PROG = "python -m training_server import-trace"
_CHUNK = 5000


def validate(entries: list[dict[str, Any]], now_s: float) -> tuple[list[int], dict[str, int]]:
    """Indexes of the valid entries (in order) and the count of invalid ones by error type."""
    valid: list[int] = []
    invalid: dict[str, int] = {}
    for lo in range(0, len(entries), _CHUNK):
        chunk = entries[lo : lo + _CHUNK]
        try:
            parse_training_entries(chunk, now_s=now_s)
            valid.extend(range(lo, lo + len(chunk)))
            continue
        except InvalidInput:
            pass
        for i, entry in enumerate(chunk, start=lo):  # a chunk with a bad entry: find which
            try:
                parse_training_entries([entry], now_s=now_s)
                valid.append(i)
            except InvalidInput as exc:
                kind = str(exc.errors[0].get("type", "invalid")) if exc.errors else "invalid"
                invalid[kind] = invalid.get(kind, 0) + 1
    return valid, invalid


def assign_timestamps(entries: list[dict[str, Any]], now_s: float, spacing_s: float) -> None:
    """Give entries without a timestamp increasing ones, ``spacing_s`` apart, the last one ``now_s``."""
    untimed = [e for e in entries if not e.get("timestamp") or e["timestamp"] == "0001-01-01T00:00:00Z"]
    n = len(untimed)
    for i, entry in enumerate(untimed):
        entry["timestamp"] = rfc3339(now_s - (n - 1 - i) * spacing_s)


def rfc3339(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def import_offline(settings: TrainingSettings, entries: list[dict[str, Any]], now_s: float) -> dict[str, int]:
    """Add ``entries`` (valid, timed) to the window persisted under ``settings.data_dir``, through
    the server's own persistence: restore (snapshot + journal replay), insert, save (a new
    snapshot with the idempotency keys, the journal compacted)."""
    import asyncio

    from shared.metrics import new_registry
    from training_server.intake import Intake
    from training_server.metrics import TrainingMetrics
    from training_server.persistence import Persistence
    from training_server.window import StratifiedWindow

    window = StratifiedWindow(settings.stratum_cap, settings.max_age_s)
    intake = Intake(window, settings.max_pending_samples, lambda inserted, evicted: None)
    persistence = Persistence(settings, window, intake, TrainingMetrics(new_registry()))
    try:
        before = persistence.restore(now_s)
        columns, timestamps = parse_training_entries(entries, now_s=now_s)
        columns, timestamps, stale = _keep_fresh(columns, timestamps, now_s, settings.max_age_s)
        evicted = window.insert(columns, timestamps)
        saved = asyncio.run(persistence.save())
    finally:
        persistence.close()
    return {"window_before": before, "stale": stale, "evicted_by_cap": evicted, "window_after": saved}


def _keep_fresh(
    columns: Columns, timestamps: np.ndarray, now_s: float, max_age_s: float
) -> tuple[Columns, np.ndarray, int]:
    """As ingestion does: future timestamps count as now, samples past the age limit are dropped."""
    timestamps = np.minimum(timestamps, now_s)
    fresh = timestamps >= now_s - max_age_s
    stale = int(len(fresh) - fresh.sum())
    if stale:
        columns = {name: column[fresh] for name, column in columns.items()}
        timestamps = timestamps[fresh]
    return columns, timestamps, stale


def import_online(
    url: str, entries: list[dict[str, Any]], batch_size: int, token: str | None, timeout_s: float
) -> dict[str, int]:
    """POST ``entries`` in batches; retry a batch after Retry-After on 429/503 until ``timeout_s``."""
    import httpx

    headers = {"content-type": "application/json", **bearer_headers(token)}
    deadline = time.monotonic() + timeout_s
    sent = retries = 0
    target = url.rstrip("/") + "/add_training_data_bulk"
    import orjson

    with httpx.Client(timeout=30.0) as client:
        for lo in range(0, len(entries), batch_size):
            body = orjson.dumps({"entries": entries[lo : lo + batch_size]})
            while True:
                resp = client.post(target, content=body, headers=headers)
                if resp.status_code in (200, 202):
                    sent += len(entries[lo : lo + batch_size])
                    break
                if resp.status_code in (429, 503) and time.monotonic() < deadline:
                    retries += 1
                    hinted = retry_after_s(resp.headers, 30.0)
                    time.sleep(1.0 if hinted is None else max(hinted, 0.05))
                    continue
                raise RuntimeError(f"{target} answered {resp.status_code}: {resp.text[:300]}")
    return {"sent": sent, "retries": retries}


def main(argv: Sequence[str] | None = None) -> int:
    defaults = TrainingSettings()  # TRAINING_SERVER_* variables apply, as for the server
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__.split("\n\n")[1] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE", help=".jsonl/.csv/.parquet[.gz|.xz]")
    parser.add_argument(
        "--data-dir", type=Path, help=f"offline: the server's --data-dir ({defaults.data_dir})"
    )
    parser.add_argument("--url", help="online: a running training server (or coalescer) base URL")
    parser.add_argument("--stratum-cap", type=int, default=defaults.stratum_cap, help="as the server's")
    parser.add_argument("--max-age-s", type=float, default=defaults.max_age_s, help="as the server's")
    parser.add_argument("--spacing-s", type=float, default=0.001, help="time between untimed entries")
    parser.add_argument("--batch-size", type=int, default=1000, help="entries per request (--url)")
    parser.add_argument("--auth-token-file", type=Path, help="token for a server that protects ingestion")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="give up retrying after this long")
    args = parser.parse_args(argv)
    if args.url is None and args.data_dir is None:
        args.data_dir = defaults.data_dir
    now_s = time.time()
    entries: list[dict[str, Any]] = []
    for path in args.files:
        try:
            rows = read_entries(path)
        except (OSError, ValueError, ImportError) as exc:
            print(f"{PROG}: cannot read {path}: {exc}", file=sys.stderr)
            return 1
        print(f"{path}: {len(rows)} entries", flush=True)
        entries.extend(rows)
    assign_timestamps(entries, now_s, args.spacing_s)
    valid, invalid = validate(entries, now_s)
    good = [entries[i] for i in valid]
    skipped = ", ".join(f"{n} {kind}" for kind, n in sorted(invalid.items())) or "none"
    print(f"{len(good)} of {len(entries)} entries valid (invalid, skipped: {skipped})", flush=True)
    if args.data_dir is not None:
        settings = TrainingSettings(
            data_dir=args.data_dir, stratum_cap=args.stratum_cap, max_age_s=args.max_age_s
        )
        r = import_offline(settings, good, now_s)
        print(
            f"window {settings.window_path}: {r['window_before']} samples before, {r['window_after']} now "
            f"({r['stale']} older than --max-age-s dropped, {r['evicted_by_cap']} evicted by "
            "--stratum-cap); start the training server with this --data-dir to train on them",
            flush=True,
        )
    if args.url is not None:
        token = args.auth_token_file.read_text().strip() if args.auth_token_file else None
        try:
            r = import_online(args.url, good, args.batch_size, token, args.timeout_s)
        except Exception as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 1
        print(f"{args.url}: {r['sent']} entries accepted ({r['retries']} retries after 429/503)", flush=True)
    return 0
