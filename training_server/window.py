"""The stratified sliding window of training samples, and its persistence.

Samples are kept in strata over the regime features that drive latency: queue depth
(``num_request_waiting``) bins x KV-cache bins x prefix-score bins x pod type. Each stratum
is a numpy ring buffer holding its newest ``stratum_cap`` samples, so a busy regime
refreshes quickly while a rare regime keeps its last samples however much common traffic
arrives. Every sample carries its timestamp (epoch seconds) and an arrival sequence
number; samples older than ``max_age_s`` are aged out.

All state is guarded by ``lock``. Callers (the intake thread, the trainer, the persister)
hold it only for array copies, never for I/O or training.

The window persists as one ``.npz`` (plain arrays, ``allow_pickle=False``) replaced atomically
(``shared.atomic``). It records ``applied_lsn``, the last journal record it contains, so a
restart replays only the journal records after it (``training_server.journal``).
"""

from __future__ import annotations

import threading
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shared.atomic import write_atomic
from shared.regimes import KV_EDGES, WAITING_EDGES
from shared.wire_fields import ROW_FIELD_NAMES, Columns, pod_type_name

TARGET_NAMES: tuple[str, ...] = ("actual_ttft_ms", "actual_tpot_ms")
COLUMN_NAMES: tuple[str, ...] = (*ROW_FIELD_NAMES, *TARGET_NAMES, "timestamp", "seq")
_COL = {name: j for j, name in enumerate(COLUMN_NAMES)}
TIMESTAMP, SEQ = _COL["timestamp"], _COL["seq"]
JOURNAL_COLUMNS: tuple[str, ...] = COLUMN_NAMES[:-1]
"""What the journal stores per sample: everything but ``seq`` (assigned again on insert)."""

# Bin edges: a value v falls in bin searchsorted(edges, v, side="right"). The queue and KV
# edges are the load regimes' (shared.regimes), which online calibration coarsens.
PREFIX_EDGES = np.array([0.1, 0.5, 0.9])
POD_TYPES = 3
NUM_STRATA = (len(WAITING_EDGES) + 1) * (len(KV_EDGES) + 1) * (len(PREFIX_EDGES) + 1) * POD_TYPES
PERSIST_FORMAT = 1
_INITIAL_RING = 256


def stratum_ids(columns: Columns) -> np.ndarray:
    """The stratum of each row (int64 in ``[0, NUM_STRATA)``)."""
    waiting = np.searchsorted(WAITING_EDGES, columns["num_request_waiting"], side="right")
    kv = np.searchsorted(KV_EDGES, columns["kv_cache_percentage"], side="right")
    prefix = np.searchsorted(PREFIX_EDGES, columns["prefix_cache_score"], side="right")
    pod = columns["pod_type"].astype(np.int64)
    ids = ((waiting * (len(KV_EDGES) + 1) + kv) * (len(PREFIX_EDGES) + 1) + prefix) * POD_TYPES + pod
    return ids.astype(np.int64)


def stratum_label(stratum: int) -> str:
    """A readable name such as ``waiting=2-3 kv=0.5-0.75 prefix=0-0.1 pod=decode``."""
    rest, pod = divmod(int(stratum), POD_TYPES)
    rest, prefix = divmod(rest, len(PREFIX_EDGES) + 1)
    waiting, kv = divmod(rest, len(KV_EDGES) + 1)
    return (
        f"waiting={_range(WAITING_EDGES, waiting, integer=True)} kv={_range(KV_EDGES, kv)} "
        f"prefix={_range(PREFIX_EDGES, prefix)} pod={pod_type_name(pod) or 'monolithic'}"
    )


def _range(edges: np.ndarray, index: int, integer: bool = False) -> str:
    lo = 0.0 if index == 0 else float(edges[index - 1])
    if integer:
        return f"{int(lo)}+" if index == len(edges) else f"{int(lo)}-{int(edges[index]) - 1}"
    return f"{lo:g}-1" if index == len(edges) else f"{lo:g}-{float(edges[index]):g}"


@dataclass(frozen=True)
class WindowSnapshot:
    """A copy of the window: ``data`` is ``(n, len(COLUMN_NAMES))``; rows of a stratum are
    contiguous, oldest first; ``strata`` gives each row's stratum."""

    data: np.ndarray
    strata: np.ndarray

    def __len__(self) -> int:
        return len(self.data)

    def column(self, name: str) -> np.ndarray:
        return self.data[:, _COL[name]]

    def columns(self) -> Columns:
        return {name: self.data[:, _COL[name]] for name in ROW_FIELD_NAMES}

    def take(self, rows: np.ndarray) -> WindowSnapshot:
        return WindowSnapshot(self.data[rows], self.strata[rows])

    def thinned(self, max_samples: int) -> WindowSnapshot:
        """At most ``max_samples`` rows, thinned as ``StratifiedWindow.snapshot`` does (``newest_fairly``)."""
        if len(self) <= max_samples:
            return self
        ids, starts, counts = np.unique(self.strata, return_index=True, return_counts=True)
        parts = newest_fairly(
            [self.data[a : a + c] for a, c in zip(starts, counts, strict=True)], max_samples
        )
        return _from_parts(ids.tolist(), parts)


def newest_fairly(parts: list[np.ndarray], max_samples: int | None) -> list[np.ndarray]:
    """Fair thinning, the one implementation: of each stratum's rows (oldest first) keep the newest
    ``min(size, quota)``, one quota for all strata (``fair_quota``), so small strata stay whole."""
    total = sum(len(p) for p in parts)
    if max_samples is None or total <= max_samples:
        return parts
    quota = fair_quota(np.array([len(p) for p in parts]), max_samples)
    return [p[len(p) - min(len(p), quota) :] for p in parts]


def _from_parts(strata: list[int], parts: list[np.ndarray]) -> WindowSnapshot:
    data = np.concatenate(parts) if parts else np.empty((0, len(COLUMN_NAMES)))
    sizes = [len(p) for p in parts]
    return WindowSnapshot(data, np.repeat(np.array(strata, dtype=np.int64), sizes))


def fair_quota(counts: np.ndarray, max_total: int) -> int:
    """Largest per-stratum quota q with ``sum(min(counts, q)) <= max_total`` (water-filling):
    strata smaller than q are kept whole, larger ones are cut to their newest q samples."""
    lo, hi = 0, int(counts.max()) if len(counts) else 0
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if int(np.minimum(counts, mid).sum()) <= max_total:
            lo = mid
        else:
            hi = mid - 1
    return lo


class _Ring:
    """Newest ``cap`` rows of one stratum; grows by doubling up to ``cap``."""

    __slots__ = ("cap", "data", "size", "start")

    def __init__(self, cap: int, width: int) -> None:
        self.cap = cap
        self.data = np.empty((min(cap, _INITIAL_RING), width))
        self.start = 0
        self.size = 0

    def ordered(self) -> np.ndarray:
        end = self.start + self.size
        if end <= len(self.data):
            return self.data[self.start : end]
        return np.concatenate((self.data[self.start :], self.data[: end - len(self.data)]))

    def reset(self, rows: np.ndarray) -> None:
        """Replace the contents with ``rows`` (oldest first, at most ``cap``)."""
        rows = rows[-self.cap :]
        if len(rows) > len(self.data):
            self.data = np.empty((min(self.cap, max(len(rows), 2 * len(self.data))), self.data.shape[1]))
        self.data[: len(rows)] = rows
        self.start, self.size = 0, len(rows)

    def extend(self, rows: np.ndarray) -> int:
        """Append rows (oldest first), evicting the oldest beyond ``cap``; returns the number evicted."""
        n = len(rows)
        if self.size + n > len(self.data) and len(self.data) < self.cap:
            kept = self.ordered()
            self.data = np.empty((min(self.cap, max(2 * len(self.data), self.size + n)), self.data.shape[1]))
            self.data[: self.size] = kept
            self.start = 0
        capacity = len(self.data)
        if n >= capacity:
            evicted = self.size + n - capacity
            self.data[:] = rows[-capacity:]
            self.start, self.size = 0, capacity
            return evicted
        write = (self.start + self.size) % capacity
        first = min(n, capacity - write)
        self.data[write : write + first] = rows[:first]
        self.data[: n - first] = rows[first:]
        evicted = max(0, self.size + n - capacity)
        self.start = (self.start + evicted) % capacity
        self.size = min(self.size + n, capacity)
        return evicted


class StratifiedWindow:
    """Thread-safe stratified sliding window (see the module docstring)."""

    def __init__(self, stratum_cap: int, max_age_s: float) -> None:
        self.stratum_cap = stratum_cap
        self.max_age_s = max_age_s
        self.lock = threading.Lock()
        self._rings: dict[int, _Ring] = {}
        self._size = 0
        self._next_seq = 0
        self.mutations = 0  # bumped on every change; the persister saves only when it moved
        self.applied_lsn = 0  # the last journal record reflected in the window

    @property
    def size(self) -> int:
        return self._size

    def insert(self, columns: Columns, timestamps: np.ndarray, lsn: int | None = None) -> int:
        """Add validated samples (arrival order = row order); returns how many old samples were evicted.

        ``columns`` holds the row fields and both ``actual_*`` targets (as parsed from the wire);
        ``lsn`` is the last journal record these rows come from.
        """
        n = len(timestamps)
        if n == 0:
            if lsn is not None:
                with self.lock:
                    self.applied_lsn = max(self.applied_lsn, lsn)
            return 0
        rows = np.empty((n, len(COLUMN_NAMES)))
        for name in (*ROW_FIELD_NAMES, *TARGET_NAMES):
            rows[:, _COL[name]] = columns[name]
        rows[:, TIMESTAMP] = timestamps
        ids = stratum_ids(columns)
        order = np.argsort(ids, kind="stable")
        sorted_ids = ids[order]
        starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
        ends = np.r_[starts[1:], n]
        evicted = 0
        with self.lock:
            rows[:, SEQ] = np.arange(self._next_seq, self._next_seq + n)
            self._next_seq += n
            grouped = rows[order]
            for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
                stratum = int(sorted_ids[lo])
                ring = self._rings.get(stratum)
                if ring is None:
                    ring = self._rings[stratum] = _Ring(self.stratum_cap, len(COLUMN_NAMES))
                evicted += ring.extend(grouped[lo:hi])
            self._size += n - evicted
            self.mutations += 1
            if lsn is not None:
                self.applied_lsn = max(self.applied_lsn, lsn)
        return evicted

    def age_out(self, now_s: float) -> int:
        """Drop samples whose timestamp is older than ``now_s - max_age_s``; returns how many."""
        cutoff = now_s - self.max_age_s
        dropped = 0
        with self.lock:
            for stratum, ring in list(self._rings.items()):
                rows = ring.ordered()
                keep = rows[:, TIMESTAMP] >= cutoff
                if keep.all():
                    continue
                dropped += int(len(rows) - keep.sum())
                if keep.any():
                    ring.reset(rows[keep])
                else:
                    del self._rings[stratum]
            self._size -= dropped
            if dropped:
                self.mutations += 1
        return dropped

    def snapshot(self, max_samples: int | None = None) -> WindowSnapshot:
        """A consistent copy of the samples, grouped by stratum (ascending), oldest first.

        With ``max_samples``, thinned fairly across strata (``newest_fairly``) before the copy,
        so the lock is held for a bounded copy.
        """
        with self.lock:
            return self._copy(max_samples)

    def _copy(self, max_samples: int | None) -> WindowSnapshot:
        strata = sorted(self._rings)
        return _from_parts(strata, newest_fairly([self._rings[s].ordered() for s in strata], max_samples))

    def strata_sizes(self) -> dict[int, int]:
        """Samples per non-empty stratum. Lock-free for the event loop: copying the dict's items
        is atomic under the GIL, and a size read mid-insert is at worst one batch stale."""
        items = list(self._rings.items())
        return {s: ring.size for s, ring in sorted(items)}

    def clear(self, lsn: int | None = None) -> int:
        """Drop every sample (``lsn``: the journal's flush record); returns how many were dropped."""
        with self.lock:
            dropped = self._size
            self._rings.clear()
            self._size = 0
            self.mutations += 1
            if lsn is not None:
                self.applied_lsn = max(self.applied_lsn, lsn)
        return dropped

    def save(self, path: Path) -> int:
        """Write the window atomically to ``path``; returns the samples written."""
        return self.save_snapshot(path)[0]

    def save_snapshot(self, path: Path, extra: dict[str, np.ndarray] | None = None) -> tuple[int, int]:
        """Write the window atomically to ``path`` (.npz, no pickle) with ``extra`` arrays;
        returns (samples written, the ``applied_lsn`` they reflect)."""
        with self.lock:
            snap = self._copy(None)
            next_seq, applied_lsn = self._next_seq, self.applied_lsn
        arrays = {
            **(extra or {}),
            "format": np.array([PERSIST_FORMAT]),
            "columns": np.array(COLUMN_NAMES),
            "data": snap.data,
            "next_seq": np.array([next_seq]),
            "applied_lsn": np.array([applied_lsn]),
        }
        write_atomic(path, lambda f: np.savez(f, allow_pickle=False, **arrays))
        return len(snap), applied_lsn

    def load(self, path: Path, now_s: float) -> int:
        """Re-insert samples saved by ``save``; see ``read_snapshot`` and ``restore``."""
        return self.restore(read_snapshot(path), now_s)

    def restore(self, saved: dict[str, np.ndarray], now_s: float) -> int:
        """Re-insert a snapshot read by ``read_snapshot`` (re-stratified with the current bins and
        caps); returns the number of samples now in the window. An empty dict is an empty window."""
        if not saved:
            return self._size
        names = [str(name) for name in saved["columns"]]
        data = np.asarray(saved["data"], dtype=np.float64)
        index = {name: j for j, name in enumerate(names)}
        data = data[np.argsort(data[:, index["seq"]], kind="stable")]
        fresh = data[:, index["timestamp"]] >= now_s - self.max_age_s
        data = data[fresh]
        columns = {name: data[:, index[name]] for name in (*ROW_FIELD_NAMES, *TARGET_NAMES)}
        with self.lock:
            self._next_seq = max(self._next_seq, int(saved["next_seq"][0]))
        lsn = int(saved["applied_lsn"][0]) if "applied_lsn" in saved else 0
        self.insert(columns, data[:, index["timestamp"]], lsn)
        return self._size


def read_snapshot(path: Path) -> dict[str, np.ndarray]:
    """Every array of a snapshot written by ``StratifiedWindow.save``; ``{}`` if there is none.

    Raises ``ValueError`` for a file that is unreadable (truncated, not a zip, garbage) or of
    another format; the caller quarantines it.
    """
    try:
        with np.load(path, allow_pickle=False) as saved:
            arrays = {name: np.asarray(saved[name]) for name in saved.files}
    except FileNotFoundError:
        return {}
    except (KeyError, OSError, EOFError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: unreadable window file: {exc!r}") from exc
    try:
        version = int(arrays["format"][0])
        names = [str(name) for name in arrays["columns"]]
        data = arrays["data"]
        int(arrays["next_seq"][0])
    except (KeyError, IndexError, ValueError, TypeError) as exc:
        raise ValueError(f"{path}: incomplete window file: {exc!r}") from exc
    if version != PERSIST_FORMAT:
        raise ValueError(f"{path}: unknown window format {version}")
    missing = set(COLUMN_NAMES) - set(names)
    if missing or data.ndim != 2 or data.shape[1] != len(names):
        raise ValueError(f"{path}: window file lacks columns {sorted(missing)}")
    return arrays
