"""The ingest journal: every accepted batch is on disk before its 202 goes out.

Layout: ``<data-dir>/journal/journal-<first lsn, 20 digits>.log``, one active segment at a time,
a new one per start and per snapshot. Each segment is::

    header  = MAGIC (8 bytes, b"LMJRNL\\r\\n") | u32 version | u32 meta length | meta (JSON: columns)
    record  = u32 payload length | u32 CRC32(payload) | payload           (little-endian)
    payload = u8 kind | u64 lsn | f64 accepted_at | u32 rows | u32 acknowledged | u16 key length
              | key (UTF-8, the Idempotency-Key or empty) | rows x columns float64 (C order)

``kind`` is 1 for a batch of samples, 2 for a flush (drop everything journalled before it). The
log sequence number (lsn) grows by one per record across segments; the window snapshot stores
the last lsn it contains, so replay applies only the records after it, and segments whose
records are all in the snapshot are deleted (compaction).

Group commit: handlers hand records to ``append`` and wait on the returned future; one writer
thread takes everything queued, writes it with one ``write`` and, per ``--journal-fsync``, one
``fsync`` ("always": before any of them is acknowledged; "everysec": at most a second later;
"no": left to the OS). A ``kill -9`` loses nothing in all three (the data is in the page cache);
only a power loss tells them apart. Once durable, records are handed to ``on_durable`` in lsn
order, so the window sees batches in journal order.

A torn or corrupt tail (a crash mid-write, a bad disk block) is found by the length and the CRC;
the bad bytes are moved to ``<segment>.corrupt-<time>`` and the segment is truncated to its last
good record, with a log line and a metric. Never fatal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import orjson

from shared.atomic import fsync_dir
from shared.logging import log_event

log = logging.getLogger(__name__)

MAGIC = b"LMJRNL\r\n"
FORMAT_VERSION = 1
SAMPLES, FLUSH = 1, 2
_HEADER = struct.Struct("<8sII")
_FRAME = struct.Struct("<II")
_FIXED = struct.Struct("<BQdIIH")
MAX_RECORD_BYTES = 1 << 30
FsyncPolicy = Literal["always", "everysec", "no"]


@dataclass
class JournalRecord:
    """One journalled batch (``data`` is rows x columns) or flush."""

    kind: int
    data: np.ndarray
    key: str = ""
    acknowledged: int = 0
    accepted_at: float = field(default_factory=time.time)
    lsn: int = 0


@dataclass
class SegmentScan:
    path: Path
    first_lsn: int
    records: list[JournalRecord]
    good_bytes: int
    problem: str | None


def segment_name(first_lsn: int) -> str:
    return f"journal-{first_lsn:020d}.log"


def encode_header(columns: tuple[str, ...]) -> bytes:
    meta = orjson.dumps({"columns": list(columns)})
    return _HEADER.pack(MAGIC, FORMAT_VERSION, len(meta)) + meta


def encode_record(record: JournalRecord) -> bytes:
    key = record.key.encode()
    data = np.ascontiguousarray(record.data, dtype="<f8")
    payload = b"".join(
        (
            _FIXED.pack(
                record.kind, record.lsn, record.accepted_at, len(data), record.acknowledged, len(key)
            ),
            key,
            data.tobytes(),
        )
    )
    return _FRAME.pack(len(payload), zlib.crc32(payload)) + payload


def scan_segment(path: Path, columns: tuple[str, ...]) -> SegmentScan:
    """Read every intact record of a segment; ``problem`` says why reading stopped early."""
    first_lsn = int(path.stem.split("-", 1)[1])
    raw = path.read_bytes()
    records: list[JournalRecord] = []
    if len(raw) < _HEADER.size:
        return SegmentScan(path, first_lsn, records, 0, "truncated header" if raw else None)
    magic, version, meta_len = _HEADER.unpack_from(raw)
    if magic != MAGIC or version != FORMAT_VERSION:
        return SegmentScan(path, first_lsn, records, 0, f"not a journal segment of version {FORMAT_VERSION}")
    try:
        saved_columns = tuple(orjson.loads(raw[_HEADER.size : _HEADER.size + meta_len])["columns"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return SegmentScan(path, first_lsn, records, 0, "unreadable header")
    if saved_columns != columns:
        return SegmentScan(path, first_lsn, records, 0, f"written for other columns {saved_columns}")
    width = len(columns)
    pos = _HEADER.size + meta_len
    while pos < len(raw):
        if pos + _FRAME.size > len(raw):
            return SegmentScan(path, first_lsn, records, pos, "torn record frame")
        length, crc = _FRAME.unpack_from(raw, pos)
        start, end = pos + _FRAME.size, pos + _FRAME.size + length
        if length < _FIXED.size or length > MAX_RECORD_BYTES or end > len(raw):
            return SegmentScan(path, first_lsn, records, pos, "torn record (length beyond the end)")
        payload = memoryview(raw)[start:end]
        if zlib.crc32(payload) != crc:
            return SegmentScan(path, first_lsn, records, pos, "CRC mismatch")
        kind, lsn, accepted_at, rows, acknowledged, key_len = _FIXED.unpack_from(payload)
        body = _FIXED.size + key_len
        if length != body + rows * width * 8 or kind not in (SAMPLES, FLUSH):
            return SegmentScan(path, first_lsn, records, pos, "malformed record")
        key = bytes(payload[_FIXED.size : body]).decode(errors="replace")
        data = np.frombuffer(payload, dtype="<f8", offset=body, count=rows * width).reshape(rows, width)
        records.append(JournalRecord(kind, data.astype(np.float64), key, acknowledged, accepted_at, lsn))
        pos = end
    return SegmentScan(path, first_lsn, records, pos, None)


class Journal:
    """The append-only journal of one training server (see the module docstring)."""

    def __init__(
        self,
        directory: Path,
        columns: tuple[str, ...],
        fsync: FsyncPolicy,
        on_durable: Callable[[JournalRecord], None],
        on_corrupt: Callable[[], None] = lambda: None,
    ) -> None:
        self.directory = directory
        self.columns = columns
        self.fsync_policy = fsync
        self._on_durable = on_durable
        self._on_corrupt = on_corrupt
        self._queue: list[tuple[JournalRecord, Future[int]]] = []
        self._cond = threading.Condition()
        self._io_lock = threading.Lock()  # the active file: writes, fsyncs, rotation
        self._fd: int | None = None
        self._active: Path | None = None
        self._active_bytes = 0
        self._header = encode_header(columns)
        self._next_lsn = 1
        self._last_fsync = time.monotonic()
        self._dirty = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self.bytes_written = 0
        self.commits = 0

    # ---- recovery --------------------------------------------------------------------------
    def segments(self) -> list[Path]:
        try:
            return sorted(self.directory.glob("journal-*.log"))
        except FileNotFoundError:
            return []

    def recover(self) -> Iterator[JournalRecord]:
        """Yield every intact record in lsn order, quarantining torn or corrupt parts; call once,
        before ``start``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for path in self.segments():
            scan = scan_segment(path, self.columns)
            if scan.problem is not None:
                self._quarantine(scan)
            for record in scan.records:
                self._next_lsn = max(self._next_lsn, record.lsn + 1)
                yield record

    def _quarantine(self, scan: SegmentScan) -> None:
        path = scan.path
        moved = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        with open(path, "rb") as f:
            f.seek(scan.good_bytes)
            moved.write_bytes(f.read())
        if scan.good_bytes:
            os.truncate(path, scan.good_bytes)
        else:
            path.unlink()
        fsync_dir(self.directory)
        self._on_corrupt()
        log_event(
            log, "journal_corrupt_tail_quarantined", logging.ERROR, segment=path.name,
            problem=scan.problem, kept_records=len(scan.records), kept_bytes=scan.good_bytes,
            moved_to=moved.name,
        )  # fmt: skip

    # ---- writing ---------------------------------------------------------------------------
    def start(self, next_lsn: int) -> None:
        """Open a fresh active segment (records start at ``next_lsn`` or later) and the writer."""
        self._next_lsn = max(self._next_lsn, next_lsn)
        with self._io_lock:
            self._open_segment()
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        self._thread.start()

    @property
    def next_lsn(self) -> int:
        return self._next_lsn

    def append(self, record: JournalRecord) -> Future[int]:
        """Queue a record; the future resolves to its lsn once it is durable (and handed on)."""
        future: Future[int] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the journal is closed")
            self._queue.append((record, future))
            self._cond.notify()
        return future

    def rotate(self) -> None:
        """Start a new active segment (so the old one can be compacted once snapshotted)."""
        with self._io_lock:
            if self._closed:  # after close (the final save): nothing stays active
                self._active = None
            elif self._active_bytes > len(self._header):
                self._sync()
                self._close_fd()
                self._open_segment()

    def compact(self, snapshot_lsn: int) -> int:
        """Delete segments whose records are all <= ``snapshot_lsn``; returns how many."""
        with self._io_lock:
            # A segment's records end just before the next segment's first lsn.
            paths = self.segments()
            firsts = [int(p.stem.split("-", 1)[1]) for p in paths]
            ends = [*firsts[1:], self._next_lsn]
            doomed = [
                p for p, nxt in zip(paths, ends, strict=True) if p != self._active and nxt <= snapshot_lsn + 1
            ]
            for path in doomed:
                path.unlink(missing_ok=True)
            if doomed:
                fsync_dir(self.directory)
        return len(doomed)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(10.0)
        with self._io_lock:
            self._sync()
            self._close_fd()

    def size_bytes(self) -> int:
        total = 0
        for path in self.segments():
            with contextlib.suppress(FileNotFoundError):
                total += path.stat().st_size
        return total

    def _open_segment(self) -> None:
        path = self.directory / segment_name(self._next_lsn)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        os.write(fd, self._header)
        os.fsync(fd)
        fsync_dir(self.directory)
        self._fd, self._active, self._active_bytes = fd, path, len(self._header)

    def _close_fd(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _sync(self) -> None:
        if self._fd is not None and self._dirty:
            os.fsync(self._fd)
            self._dirty = False
            self._last_fsync = time.monotonic()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    timeout = 1.0 if self._dirty and self.fsync_policy == "everysec" else None
                    if not self._cond.wait(timeout) and timeout is not None:
                        break
                if not self._queue and self._closed:
                    return
                batch, self._queue = self._queue, []
            if batch:
                self._commit(batch)
            elif self.fsync_policy == "everysec":
                with self._io_lock:
                    self._sync()

    def _commit(self, batch: list[tuple[JournalRecord, Future[int]]]) -> None:
        try:
            with self._io_lock:
                for record, _ in batch:
                    record.lsn = self._next_lsn
                    self._next_lsn += 1
                blob = b"".join(encode_record(record) for record, _ in batch)
                self._write(blob)
                if self.fsync_policy == "always" or (
                    self.fsync_policy == "everysec" and time.monotonic() - self._last_fsync >= 1.0
                ):
                    self._sync()
        except Exception as exc:
            log_event(log, "journal_write_failed", logging.ERROR, records=len(batch), error=repr(exc))
            for _, future in batch:
                future.set_exception(exc)
            return
        self.commits += 1
        self.bytes_written += len(blob)
        for record, future in batch:
            try:
                self._on_durable(record)
            finally:
                future.set_result(record.lsn)

    def _write(self, blob: bytes) -> None:
        assert self._fd is not None
        view = memoryview(blob)
        written = 0
        try:
            while written < len(view):
                written += os.write(self._fd, view[written:])
        except BaseException:
            # Never leave a partial record before later ones: cut the file back to where it was.
            os.ftruncate(self._fd, self._active_bytes)
            raise
        self._active_bytes += len(blob)
        self._dirty = True
