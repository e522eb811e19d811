"""The stratified sliding window: strata, caps, eviction, age-out and persistence."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from training_server import synthetic
from training_server.window import (
    NUM_STRATA,
    StratifiedWindow,
    _Ring,
    stratum_ids,
    stratum_label,
)


def _insert(window: StratifiedWindow, n: int, rng: np.random.Generator, **kw: int) -> np.ndarray:
    columns = synthetic.samples(n, rng, **kw)
    window.insert(columns, np.full(n, time.time()))
    return columns["actual_ttft_ms"]


def test_ring_keeps_newest_rows_in_order_across_wraps_and_growth() -> None:
    ring = _Ring(cap=600, width=1)
    seen: list[float] = []
    evicted = 0
    for start in range(0, 2000, 170):  # odd chunk size: wraps at every position
        rows = np.arange(start, start + 170, dtype=np.float64)[:, None]
        seen.extend(rows[:, 0].tolist())
        evicted += ring.extend(rows)
    assert ring.ordered()[:, 0].tolist() == seen[-600:]
    assert evicted == len(seen) - 600
    # 600 old rows leave, and 400 of the new rows never fit: the size stays 600
    assert ring.extend(np.arange(5000, 6000, dtype=np.float64)[:, None]) == 1000
    assert ring.ordered()[:, 0].tolist() == list(range(5400, 6000))


def test_strata_cover_queue_kv_prefix_and_pod_type() -> None:
    columns = {
        "num_request_waiting": np.array([0.0, 1, 3, 100, 0]),
        "kv_cache_percentage": np.array([0.0, 0.3, 0.95, 1.0, 0.0]),
        "prefix_cache_score": np.array([0.0, 0.2, 0.6, 1.0, 0.0]),
        "pod_type": np.array([0.0, 1, 2, 0, 2]),
    }
    ids = stratum_ids(columns)
    assert len(set(ids.tolist())) == 5
    assert ((ids >= 0) & (ids < NUM_STRATA)).all()
    assert stratum_label(int(ids[0])) == "waiting=0-0 kv=0-0.25 prefix=0-0.1 pod=monolithic"
    assert stratum_label(int(ids[3])) == "waiting=32+ kv=0.9-1 prefix=0.9-1 pod=monolithic"
    assert stratum_label(int(ids[4])).endswith("pod=decode")


def test_rare_regime_survives_a_flood_of_common_traffic() -> None:
    rng = np.random.default_rng(0)
    window = StratifiedWindow(stratum_cap=300, max_age_s=3600)
    rare_ttft = _insert(window, 120, rng, waiting=50)  # a deep-queue regime seen once
    for _ in range(100):  # then 100k samples of ordinary traffic (short queues)
        _insert(window, 1000, rng, waiting=0)
    snap = window.snapshot()
    rare = snap.column("num_request_waiting") == 50
    assert rare.sum() == 120
    assert np.array_equal(np.sort(snap.column("actual_ttft_ms")[rare]), np.sort(rare_ttft))
    sizes = window.strata_sizes()
    assert max(sizes.values()) == 300  # common strata are capped ...
    assert window.size == sum(sizes.values()) == len(snap) < 100_000  # ... so the flood is bounded


def test_each_stratum_keeps_its_newest_samples() -> None:
    window = StratifiedWindow(stratum_cap=50, max_age_s=3600)
    rng = np.random.default_rng(1)
    columns = synthetic.samples(1, rng, waiting=0)
    for i in range(200):
        columns["actual_ttft_ms"] = np.array([float(i + 1)])
        window.insert(columns, np.array([time.time()]))
    assert window.snapshot().column("actual_ttft_ms").tolist() == [float(i) for i in range(151, 201)]


def test_stale_samples_are_aged_out() -> None:
    window = StratifiedWindow(stratum_cap=1000, max_age_s=60)
    rng = np.random.default_rng(2)
    now = time.time()
    columns = synthetic.samples(400, rng)
    stamps = np.where(np.arange(400) % 2 == 0, now - 120, now - 10)
    window.insert(columns, stamps)
    assert window.age_out(now) == 200
    assert window.size == 200
    assert (window.snapshot().column("timestamp") >= now - 60).all()


def test_persistence_round_trip_is_atomic_and_pickle_free(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    window = StratifiedWindow(stratum_cap=500, max_age_s=3600)
    for _ in range(5):
        _insert(window, 1000, rng)
    path = tmp_path / "window.npz"
    assert window.save(path) == window.size
    assert [p.name for p in tmp_path.iterdir()] == ["window.npz"]  # no temporary file left
    with np.load(path, allow_pickle=False) as saved:  # loads without pickle
        assert saved["data"].dtype == np.float64

    restored = StratifiedWindow(stratum_cap=500, max_age_s=3600)
    assert restored.load(path, time.time()) == window.size
    assert restored.strata_sizes() == window.strata_sizes()
    before, after = window.snapshot(), restored.snapshot()
    cols = [i for i in range(before.data.shape[1]) if i != before.data.shape[1] - 1]  # all but seq
    assert np.array_equal(before.data[:, cols], after.data[:, cols])

    smaller = StratifiedWindow(stratum_cap=10, max_age_s=3600)  # caps are re-applied on load
    assert smaller.load(path, time.time()) == sum(min(n, 10) for n in window.strata_sizes().values())


def test_missing_file_is_an_empty_window_and_garbage_is_refused(tmp_path: Path) -> None:
    window = StratifiedWindow(stratum_cap=10, max_age_s=60)
    assert window.load(tmp_path / "absent.npz", time.time()) == 0
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip file")
    with pytest.raises(ValueError):
        window.load(bad, time.time())


def test_bounded_snapshot_keeps_small_strata_whole_and_the_newest_of_big_ones() -> None:
    rng = np.random.default_rng(4)
    window = StratifiedWindow(stratum_cap=100_000, max_age_s=3600)
    for waiting, n in ((0, 5000), (50, 40)):
        columns = synthetic.samples(n, rng, waiting=waiting)
        columns["actual_ttft_ms"] = np.arange(n, dtype=np.float64)  # arrival order within the regime
        window.insert(columns, np.full(n, time.time()))
    full = window.snapshot()
    bounded = window.snapshot(max_samples=1000)
    assert len(full) == 5040 and len(bounded) <= 1000
    rare = bounded.column("num_request_waiting") == 50
    assert rare.sum() == 40, "the rare regime is kept whole"
    for stratum in np.unique(full.strata).tolist():  # every stratum keeps its newest samples
        everything = full.column("actual_ttft_ms")[full.strata == stratum]
        kept = bounded.column("actual_ttft_ms")[bounded.strata == stratum]
        assert kept.tolist() == everything[len(everything) - len(kept) :].tolist()
