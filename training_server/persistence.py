"""What makes the window survive a crash: the journal, the snapshot and the idempotency keys.

- ``commit`` journals an accepted batch (group commit) before the handler answers 202; once
  durable it reaches the intake in journal order.
- ``restore`` (start-up) loads the last snapshot (``window.npz``), then replays the journal
  records after the snapshot's ``applied_lsn``. A corrupt snapshot is quarantined (renamed
  ``window.npz.corrupt-<time>``) and the journal alone is replayed.
- ``save`` (periodic, on shutdown, after a flush) rotates the journal, writes the snapshot and
  deletes the journal segments it covers.
- ``flush`` goes through the journal too, so a replay after a flush never brings samples back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np

from shared.errors import Overloaded
from shared.logging import log_event
from shared.wire_fields import ROW_FIELD_NAMES, Columns
from training_server.config import TrainingSettings
from training_server.idempotency import Claim, Outcome, RecentKeys
from training_server.intake import Intake
from training_server.journal import FLUSH, SAMPLES, Journal, JournalRecord
from training_server.metrics import TrainingMetrics
from training_server.window import JOURNAL_COLUMNS, TARGET_NAMES, StratifiedWindow, read_snapshot

log = logging.getLogger(__name__)

_SAMPLE_FIELDS = (*ROW_FIELD_NAMES, *TARGET_NAMES)
_TIMESTAMP = JOURNAL_COLUMNS.index("timestamp")
_REPLAY_CHUNK = 50_000


def _columns(data: np.ndarray) -> tuple[Columns, np.ndarray]:
    return {name: data[:, j] for j, name in enumerate(_SAMPLE_FIELDS)}, data[:, _TIMESTAMP]


class Persistence:
    """The journal, snapshot and idempotency keys of one training server (module docstring)."""

    def __init__(
        self, settings: TrainingSettings, window: StratifiedWindow, intake: Intake, metrics: TrainingMetrics
    ) -> None:
        self.settings = settings
        self.window = window
        self.intake = intake
        self.metrics = metrics
        self.keys = RecentKeys(settings.idempotency_ttl_s, settings.idempotency_max_keys)
        self.journal = Journal(
            settings.journal_dir,
            JOURNAL_COLUMNS,
            settings.journal_fsync,
            self._on_durable,
            on_corrupt=lambda: metrics.quarantined.labels("journal").inc(),
        )
        self.replayed_samples = 0
        self.snapshot_lsn = 0
        self._lock = asyncio.Lock()
        self._bytes_at_save = 0

    # ---- start-up --------------------------------------------------------------------------
    def restore(self, now_s: float) -> int:
        """Snapshot + journal replay (blocking; before the intake starts); returns the window size."""
        path = self.settings.window_path
        try:
            saved = read_snapshot(path)
        except ValueError as exc:
            corrupt = path.with_name(path.name + f".corrupt-{int(now_s)}")
            path.rename(corrupt)
            self.metrics.quarantined.labels("window").inc()
            log_event(log, "window_restore_failed", logging.ERROR, error=str(exc), moved_to=str(corrupt))
            saved = {}
        self.window.restore(saved, now_s)
        self.keys.restore(saved)
        self.snapshot_lsn = self.window.applied_lsn
        pending: list[JournalRecord] = []
        for record in self.journal.recover():
            if record.key:
                outcome = (record.acknowledged, record.acknowledged - len(record.data))
                self.keys.add(record.key, record.accepted_at, outcome)
            if record.lsn <= self.snapshot_lsn:
                continue
            if record.kind == FLUSH:
                self._replay(pending, now_s)
                pending = []
                self.window.clear(record.lsn)
            else:
                pending.append(record)
                if sum(len(r.data) for r in pending) >= _REPLAY_CHUNK:
                    self._replay(pending, now_s)
                    pending = []
        self._replay(pending, now_s)
        self.journal.start(self.window.applied_lsn + 1)
        if self.replayed_samples:
            log_event(log, "journal_replayed", samples=self.replayed_samples, after_lsn=self.snapshot_lsn)
        return self.window.size

    def _replay(self, records: list[JournalRecord], now_s: float) -> None:
        if not records:
            return
        data = np.concatenate([r.data for r in records])
        data = data[data[:, _TIMESTAMP] >= now_s - self.settings.max_age_s]
        columns, timestamps = _columns(data)
        self.window.insert(columns, timestamps, records[-1].lsn)
        self.replayed_samples += len(data)
        self.metrics.journal_replayed.inc(len(data))

    # ---- ingestion -------------------------------------------------------------------------
    async def claim(self, key: str) -> tuple[Outcome | None, Claim | None]:
        """Before a keyed request reads its body: ``(outcome, None)`` if a batch with ``key`` was
        already accepted (or is accepted meanwhile by the request committing it), else
        ``(None, claim)``: this request now owns the key until ``release``, so a resend that
        arrives while it still reads, parses or journals its batch waits for it instead of
        inserting the samples a second time. A claim whose request fails is released unsettled,
        and one waiting resend claims the key afresh."""
        while True:
            known = self.keys.get(key, time.time())
            if known is not None:
                return known, None
            future = self.keys.inflight(key)
            if future is None:
                return None, self.keys.begin(key)
            try:
                return await asyncio.shield(future), None
            except asyncio.CancelledError:
                if not future.cancelled():  # this request itself was cancelled
                    raise

    def release(self, key: str, claim: Claim) -> None:
        """End a claim (settled by ``commit`` or not: then the key is free again)."""
        self.keys.end(key, claim)

    async def commit(
        self,
        columns: Columns,
        timestamps: np.ndarray,
        key: str | None,
        outcome: Outcome,
        now_s: float,
        claim: Claim | None = None,
    ) -> None:
        """Journal a validated batch (durable when this returns); it then reaches the window.
        ``outcome`` = (entries acknowledged, of which stale and not in ``columns``); a keyed batch
        is committed under the ``claim`` its request holds (``claim``), which it settles."""
        n = len(timestamps)
        if n == 0 and not key:
            return
        if key and claim is None:
            raise ValueError("a keyed batch is committed under its claim")
        if n:
            self.intake.reserve(n)
        data = np.column_stack([*(columns[name] for name in _SAMPLE_FIELDS), timestamps])
        record = JournalRecord(SAMPLES, data, key or "", outcome[0], now_s)
        try:
            await asyncio.wrap_future(self.journal.append(record))
        except Exception as exc:
            if n:
                self.intake.release(n)
            raise Overloaded(f"The journal could not be written: {exc}", retry_after_s=1.0) from exc
        if key and claim is not None:
            self.keys.add(key, now_s, outcome)
            claim.set_result(outcome)

    def _on_durable(self, record: JournalRecord) -> None:
        """Journal-writer thread, in lsn order."""
        self.metrics.journal_records.inc()
        if record.kind == FLUSH:
            self.intake.enqueue_flush(record.lsn)
        elif len(record.data):
            columns, timestamps = _columns(record.data)
            self.intake.enqueue(columns, timestamps, record.lsn)

    async def flush(self) -> int:
        """Journal a flush, wait until the intake applied it, save; returns the samples dropped."""
        empty = np.empty((0, len(JOURNAL_COLUMNS)))
        lsn = await asyncio.wrap_future(self.journal.append(JournalRecord(FLUSH, empty)))
        dropped = await asyncio.to_thread(self.intake.wait_flushed, lsn)
        await self.save()
        return dropped

    # ---- snapshots -------------------------------------------------------------------------
    def save_due(self) -> bool:
        return self.journal.bytes_written - self._bytes_at_save >= self.settings.journal_snapshot_bytes

    async def save(self) -> int:
        """Rotate the journal, write the snapshot, delete the segments it covers."""
        async with self._lock:
            extra = self.keys.export()
            self._bytes_at_save = self.journal.bytes_written
            await asyncio.to_thread(self.journal.rotate)
            saved, lsn = await asyncio.to_thread(self.window.save_snapshot, self.settings.window_path, extra)
            self.snapshot_lsn = lsn
            await asyncio.to_thread(self.journal.compact, lsn)
        return saved

    def close(self) -> None:
        """Write and hand on everything queued; further appends fail (answered 503)."""
        self.journal.close()

    def status(self) -> dict[str, Any]:
        return {
            "fsync": self.settings.journal_fsync,
            "segments": len(self.journal.segments()),
            "bytes": self.journal.size_bytes(),
            "next_lsn": self.journal.next_lsn,
            "group_commits": self.journal.commits,
            "bytes_written": self.journal.bytes_written,
            "snapshot_lsn": self.snapshot_lsn,
            "replayed_samples": self.replayed_samples,
            "idempotency_keys": len(self.keys),
        }
