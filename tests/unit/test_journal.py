"""The journal's record format, recovery of damaged segments, compaction, and the bounded keys."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from training_server.idempotency import RecentKeys
from training_server.journal import FLUSH, SAMPLES, Journal, JournalRecord, scan_segment

COLUMNS = ("a", "b", "timestamp")


def _journal(directory: Path, received: list[JournalRecord]) -> Journal:
    return Journal(directory, COLUMNS, "always", received.append)


def _write(directory: Path, batches: int) -> list[JournalRecord]:
    received: list[JournalRecord] = []
    journal = _journal(directory, received)
    list(journal.recover())
    journal.start(1)
    futures = [
        journal.append(JournalRecord(SAMPLES, np.full((10, 3), float(i)), f"k{i}", 10))
        for i in range(batches)
    ]
    assert [f.result(10) for f in futures] == list(range(1, batches + 1))
    journal.close()
    return received


def test_records_round_trip_in_lsn_order(tmp_path: Path) -> None:
    received = _write(tmp_path, 5)
    assert [r.lsn for r in received] == [1, 2, 3, 4, 5]
    again = list(_journal(tmp_path, []).recover())
    assert [(r.lsn, r.key, r.acknowledged) for r in again] == [(i, f"k{i - 1}", 10) for i in range(1, 6)]
    assert all(np.array_equal(r.data, np.full((10, 3), float(r.lsn - 1))) for r in again)


def test_a_flipped_byte_stops_the_scan_at_the_bad_record_and_is_quarantined(tmp_path: Path) -> None:
    _write(tmp_path, 4)
    (segment,) = tmp_path.glob("journal-*.log")
    raw = bytearray(segment.read_bytes())
    raw[-100] ^= 0xFF  # inside the last record's data
    segment.write_bytes(bytes(raw))
    assert scan_segment(segment, COLUMNS).problem == "CRC mismatch"
    journal = _journal(tmp_path, [])
    assert [r.lsn for r in journal.recover()] == [1, 2, 3]
    assert scan_segment(segment, COLUMNS).problem is None  # truncated to the good records
    assert len(list(tmp_path.glob("journal-*.log.corrupt-*"))) == 1
    journal.start(1)
    assert journal.next_lsn == 4  # continues after the last good record


def test_compaction_deletes_only_segments_the_snapshot_covers(tmp_path: Path) -> None:
    journal = _journal(tmp_path, [])
    list(journal.recover())
    journal.start(1)
    for _ in range(3):  # three segments of two records each
        for _ in range(2):
            journal.append(JournalRecord(SAMPLES, np.zeros((1, 3)))).result(10)
        journal.rotate()
    assert len(journal.segments()) == 4  # plus the empty active one
    assert journal.compact(snapshot_lsn=3) == 1  # records 1-2 only; 3-4 not all covered
    assert journal.compact(snapshot_lsn=6) == 2
    assert len(journal.segments()) == 1
    journal.close()


def test_concurrent_appends_share_group_commits(tmp_path: Path) -> None:
    received: list[JournalRecord] = []
    journal = _journal(tmp_path, received)
    list(journal.recover())
    journal.start(1)
    barrier = threading.Barrier(8)

    def send() -> None:
        barrier.wait()
        for _ in range(20):
            journal.append(JournalRecord(SAMPLES, np.zeros((100, 3)))).result(10)

    threads = [threading.Thread(target=send) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    journal.append(JournalRecord(FLUSH, np.zeros((0, 3)))).result(10)
    journal.close()
    assert [r.lsn for r in received] == list(range(1, 162))
    assert journal.commits <= 161


def test_recent_keys_are_bounded_by_count_and_age() -> None:
    keys = RecentKeys(ttl_s=600, max_keys=3)
    for i in range(5):
        keys.add(f"k{i}", 1000.0 + i, (10, 0))
    assert len(keys) == 3 and keys.get("k0", 1005) is None and keys.get("k4", 1005) == (10, 0)
    assert keys.get("k4", 1004 + 601) is None  # expired
    restored = RecentKeys()
    restored.restore(keys.export())
    assert restored.get("k3", 1005) == (10, 0)
