"""Several XGBoost models' trees evaluated in one JIT-compiled pass (numba, persistent cache).

``JitForests.from_boosters([ttft, tpot])`` lays every tree out as a perfect binary tree of its
own depth (node ``i``'s children are ``2i+1`` and ``2i+2``; a leaf above the bottom level is
padded with a split whose two sides lead to the same leaf value) and packs each split into one
uint64: the order-preserving key of its threshold (``trees.order_keys``) in the high 32 bits, the
input column in the low ones. A row's inputs become keys once per call, twice per feature: column
``f`` holds NaN as the smallest key, column ``num_features + f`` as the largest, and a
default-right split reads the second column. So a visit is two loads, one integer comparison and
``node = 2 node + 1 + (key >= threshold_key)``: no branch, no NaN test. Each run of ``GROUP``
consecutive trees of a model is padded to the run's deepest tree. Rows go in blocks of
``BLOCK``; a block of fewer than ``ROWS_TOGETHER`` rows walks a group's eight trees together,
row by row, so the walks overlap in the CPU instead of waiting on each other's loads, and a
larger one goes tree by tree, all its rows one level at a time (``jit_kernels``).

``served_terms`` goes further for wire rows: it builds the feature matrix and adds the
calibration offset, the work-ahead baseline and the regime offsets in the same compiled pass
(``prediction_server.predictor.ServedPath`` uses it once it reproduced the reference bit for
bit).

Exactness: XGBoost sends a row left when ``x < threshold`` (right otherwise) and a missing value
to the split's default side, and adds the leaf values in float32 in tree order onto base_score;
the kernel does exactly that, so margins are bit-identical to ``inplace_predict(..., "margin")``
(``evaluators.compile_forests`` checks them on the probe matrix before serving, and the unit tests
over random, missing, extreme and on-threshold rows).

The kernels (``jit_kernels``) are compiled on first use with ``cache=True``: numba keeps the
machine code in ``__pycache__`` beside them, or, where that is read-only, in its user-wide cache
(``NUMBA_CACHE_DIR`` chooses the directory), so later processes load it instead of compiling.
Even loaded from the cache it costs a process ~0.5-0.7 s (importing numba, initialising its
target), so ``warm_kernel()`` is run off the load path: ``evaluators.compile_forests`` serves
a process's first version through the numpy/XGBoost evaluators and switches it to the JIT once
the kernel is there (``evaluators.WarmingForests``). Without numba (``import numba`` fails)
``jit_available()`` is false and the numpy/XGBoost evaluators serve.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import orjson

from prediction_server.jit_layout import (
    F_CALIBRATION,
    F_INTERCEPT,
    GROUP,
    KEY_MAX,
    MAX_FEATURES,
    P_COEF_AT,
    P_COLUMNS,
    P_HAS_BASELINE,
    P_HAS_REGIMES,
    P_KV_AT,
    P_KV_N,
    P_OFFSETS_AT,
    P_TERMS,
    P_WAITING_AT,
    P_WAITING_N,
)
from prediction_server.trees import order_keys, read_gbtree_model
from shared.features import FEATURE_NAMES, NUM_FEATURES
from shared.row_decoder import NUMERIC_FIELDS

log = logging.getLogger(__name__)

# Padding trees to perfect shape costs 2^depth nodes per tree: 12 KB at depth 10; deeper models
# go to the numpy evaluator.
MAX_DEPTH = 10


@cache
def _kernels() -> Any:
    """The compiled kernels (``prediction_server.jit_kernels``); raises ``ImportError`` without numba."""
    from prediction_server import jit_kernels

    return jit_kernels


@cache
def jit_available() -> bool:
    """Whether numba imports here (the compiled evaluator can be used at all)."""
    try:
        _kernels()
    except ImportError:
        return False
    return True


@cache
def numba_installed() -> bool:
    """Whether a numba package is there to import, without importing it (that takes ~0.4 s)."""
    try:
        return importlib.util.find_spec("numba") is not None
    except (ImportError, ValueError, AttributeError):  # e.g. sys.modules["numba"] = None
        return False


_warm = threading.Event()
_warm_lock = threading.Lock()


def kernel_ready() -> bool:
    """Whether ``warm_kernel`` has finished in this process: the JIT serves at no start-up cost."""
    return _warm.is_set()


def warm_kernel() -> bool:
    """Import numba and load the kernel's machine code from the cache (or compile it, ~2 s, once per
    cache directory), once per process; thread-safe and blocking. ``False`` without numba."""
    with _warm_lock:
        if _warm.is_set():
            return True
        if not jit_available():
            return False
        # A call with the served argument types (numba tells read-only arrays apart) makes numba
        # load (or compile) that overload: rows as served (writable) and as probed (read-only).
        kernels = _kernels()
        tables = _tables()
        for rows in (np.zeros((1, 1), dtype=np.float32), _frozen(np.zeros((1, 1), dtype=np.float32))):
            kernels.tree_margins(rows, *tables, np.empty((1, 1), dtype=np.float32))
        _warm.set()
    return True


_served_warm = threading.Event()


def served_kernel_ready() -> bool:
    """Whether ``warm_served_kernel`` has finished: ``JitForests.served_terms`` costs no compile."""
    return _served_warm.is_set()


def warm_served_kernel() -> bool:
    """``warm_kernel``, then the same for ``served_terms`` (another ~1.5 s to compile on a new
    machine: done once the trees' kernel serves); ``False`` without numba."""
    if not warm_kernel():
        return False
    with _warm_lock:
        if not _served_warm.is_set():
            rows = (np.zeros((1, NUMERIC_FIELDS)), np.zeros(1))
            outputs = [np.empty((1, 1)) for _ in range(3)]
            X = np.empty((1, NUM_FEATURES), dtype=np.float32)
            _kernels().served_terms(*rows, *_tables(), *served_plan([None]), X, *outputs)
            _served_warm.set()
    return True


def _tables() -> tuple[np.ndarray, ...]:
    """Read-only trees tables of the served types (``JitForests``' fields), for warming up."""
    return (
        _frozen(np.zeros(1, dtype=np.uint64)),
        _frozen(np.zeros(1, dtype=np.float32)),
        _frozen(np.zeros((0, 5), dtype=np.int64)),
        _frozen(np.zeros(1, dtype=np.float32)),
    )


@dataclass(frozen=True, eq=False)
class JitForests:
    """Immutable evaluator of several boosters' trees over the same features, in one pass."""

    num_features: int
    num_models: int
    num_trees: int
    max_depth: int
    _packed: np.ndarray = field(repr=False)
    _leaves: np.ndarray = field(repr=False)
    _groups: np.ndarray = field(repr=False)
    _base: np.ndarray = field(repr=False)

    name = "numba-jit"

    @classmethod
    def from_boosters(cls, boosters: Sequence[Any]) -> JitForests:
        """Lay out the boosters' trees (via their JSON dumps); ``ValueError`` for an unsupported model."""
        return cls.from_models([orjson.loads(booster.save_raw("json")) for booster in boosters])

    @classmethod
    def from_models(cls, models: Sequence[Any]) -> JitForests:
        splits: list[np.ndarray] = []
        leaves: list[np.ndarray] = []
        groups: list[tuple[int, int, int, int, int]] = []
        bases: list[np.float32] = []
        num_features = -1
        num_trees = max_depth = node_offset = leaf_offset = 0
        for k, model in enumerate(models):
            features, base_score, trees = read_gbtree_model(model)
            if num_features not in (-1, features):
                raise ValueError(f"models disagree on the number of features ({num_features}, {features})")
            num_features = features
            if not 0 < num_features <= MAX_FEATURES:
                raise ValueError(f"{num_features} features: too many to pack")
            if not trees:
                raise ValueError("model has no trees")
            bases.append(base_score)
            depths, tree_splits, tree_leaves = _grouped_trees(trees, num_features)
            max_depth = max(max_depth, int(depths.max()))
            for first in range(0, len(trees), GROUP):
                depth, count = int(depths[first]), min(GROUP, len(trees) - first)
                groups.append((depth, node_offset, leaf_offset, k, count))
                node_offset += count * ((1 << depth) - 1)
                leaf_offset += count << depth
            num_trees += len(trees)
            splits.append(tree_splits)
            leaves.append(tree_leaves)
        if not groups:
            raise ValueError("no models")
        return cls(
            num_features=num_features,
            num_models=len(bases),
            num_trees=num_trees,
            max_depth=max_depth,
            # One spare entry so that the table is never empty (all trees stumps).
            _packed=_frozen(np.concatenate([*splits, np.zeros(1, dtype=np.uint64)])),
            _leaves=_frozen(np.concatenate(leaves)),
            _groups=_frozen(np.asarray(groups, dtype=np.int64)),
            _base=_frozen(np.asarray(bases, dtype=np.float32)),
        )

    def predict_margins(self, features: np.ndarray) -> np.ndarray:
        """``(num_models, n)`` float32 margins for float32 rows of shape ``(n, num_features)``."""
        X = np.ascontiguousarray(features, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self.num_features:
            raise ValueError(f"expected rows of shape (n, {self.num_features}), got {X.shape}")
        out = np.empty((self.num_models, X.shape[0]), dtype=np.float32)
        _kernels().tree_margins(X, self._packed, self._leaves, self._groups, self._base, out)
        return out

    def margins(self, features: np.ndarray) -> tuple[np.ndarray, ...]:
        """One float32 margin array per model, in ``from_boosters``' order."""
        return tuple(self.predict_margins(features))

    def served_terms(
        self, numeric: np.ndarray, codes: np.ndarray, plan: tuple[np.ndarray, np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``jit_kernels.served_terms`` for wire rows (``numeric``: ``(n, 10)`` float64, the numeric
        row fields in wire order; ``codes``: ``(n,)`` float64 pod-type codes) and a ``served_plan``:
        the feature matrix and, per model, ``(num_models, n)`` float64 margins with the calibration
        offset, baseline latencies and regime offsets."""
        if self.num_features != NUM_FEATURES:
            raise ValueError(f"served terms need the {NUM_FEATURES} features of shared.features")
        if numeric.dtype != np.float64 or numeric.ndim != 2 or numeric.shape[1] != NUMERIC_FIELDS:
            raise ValueError(f"expected numeric rows of shape (n, {NUMERIC_FIELDS}), got {numeric.shape}")
        numeric, codes = _as_compiled(numeric), _as_compiled(np.asarray(codes, dtype=np.float64))
        n = numeric.shape[0]
        X = np.empty((n, NUM_FEATURES), dtype=np.float32)
        margins, baselines, regimes = (np.empty((self.num_models, n)) for _ in range(3))
        _kernels().served_terms(
            numeric,
            codes,
            self._packed,
            self._leaves,
            self._groups,
            self._base,
            *plan,
            X,
            margins,
            baselines,
            regimes,
        )
        return X, margins, baselines, regimes


def _as_compiled(array: np.ndarray) -> np.ndarray:
    """``array`` as the overload ``warm_served_kernel`` compiled takes it: C-contiguous, writable
    (numba tells read-only arrays apart); a copy only when it is not."""
    return array if array.flags.c_contiguous and array.flags.writeable else array.copy()


def served_plan(specs: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    """``jit_kernels.served_terms``' plan (ints, float64s; read-only) of each model's
    ``shared.artifacts.ModelSpec`` (``None``: no offset, baseline or regimes): its calibration
    offset, baseline terms and regime scheme with offsets."""
    int_rows: list[list[int]] = []
    float_rows: list[list[float]] = []
    for spec in specs:
        ints = [0] * P_COLUMNS
        floats = [0.0, 0.0]
        if spec is not None:
            floats[F_CALIBRATION] = float(spec.calibration_offset)
            if spec.baseline is not None:
                names = list(spec.baseline["features"])
                ints[P_HAS_BASELINE], ints[P_TERMS], ints[P_COEF_AT] = 1, len(names), len(floats)
                floats[F_INTERCEPT] = float(spec.baseline["intercept"])
                floats.extend(float(c) for c in spec.baseline["coefficients"])
                # each term's cap (shared.baseline's ``upper``; +inf without one), after the slopes
                upper = spec.baseline.get("upper") or [np.inf] * len(names)
                floats.extend(float(np.float32(u)) for u in upper)
                # each term's scale (its feature's column, -1 for none; then scale_from after the caps)
                scales = spec.baseline.get("scale_features") or [None] * len(names)
                floats.extend(float(v) for v in spec.baseline.get("scale_from") or [0.0] * len(names))
                ints.extend(FEATURE_NAMES.index(name) for name in names)
                ints.extend(-1 if name is None else FEATURE_NAMES.index(name) for name in scales)
            offsets = spec.regime_offsets
            if offsets is not None:
                scheme = offsets.scheme
                ints[P_HAS_REGIMES] = 1
                ints[P_WAITING_AT], ints[P_WAITING_N] = len(floats), len(scheme.waiting_edges)
                floats.extend(float(e) for e in scheme.waiting_edges)
                ints[P_KV_AT], ints[P_KV_N] = len(floats), len(scheme.kv_edges)
                floats.extend(float(e) for e in scheme.kv_edges)
                ints[P_OFFSETS_AT] = len(floats)
                floats.extend(float(o) for o in offsets.offsets)
        int_rows.append(ints)
        float_rows.append(floats)
    width_i = max(map(len, int_rows))
    width_f = max(map(len, float_rows))
    plan_ints = np.zeros((len(specs), width_i), dtype=np.int64)
    plan_floats = np.zeros((len(specs), width_f), dtype=np.float64)
    for k, (ints, floats) in enumerate(zip(int_rows, float_rows, strict=True)):
        plan_ints[k, : len(ints)] = ints
        plan_floats[k, : len(floats)] = floats
    return _frozen(plan_ints), _frozen(plan_floats)


def _grouped_trees(trees: Sequence[Any], num_features: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_perfect_trees`` with each run of ``GROUP`` trees padded to the run's deepest tree."""
    depths, splits, leaves = _perfect_trees(trees, num_features)
    padded = depths.copy()
    for first in range(0, len(trees), GROUP):
        padded[first : first + GROUP] = depths[first : first + GROUP].max()
    if np.array_equal(padded, depths):
        return depths, splits, leaves
    return _perfect_trees(trees, num_features, padded)


def _perfect_trees(
    trees: Sequence[Any], num_features: int, min_depths: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(depths, packed splits, leaf values)`` of one model's XGBoost JSON trees laid out as perfect
    trees of their own depth (at least ``min_depths``), one after the other (``2^depth - 1`` splits
    and ``2^depth`` leaves each), built level by level for all trees at once."""
    sizes = []
    for tree in trees:
        if int(tree.get("tree_param", {}).get("size_leaf_vector", "1")) > 1:
            raise ValueError("multi-target trees are not supported")
        if any(int(kind) != 0 for kind in tree.get("split_type", [])):
            raise ValueError("categorical splits are not supported")
        sizes.append(len(tree["left_children"]))
    starts = np.cumsum(sizes) - np.asarray(sizes)
    total = int(np.sum(sizes))

    def column(key: str, dtype: Any) -> np.ndarray:
        values = np.concatenate([np.asarray(tree[key], dtype=dtype) for tree in trees])
        if values.size != total:
            raise ValueError(f"malformed node arrays ({key})")
        return values

    local_left, local_right = column("left_children", np.int64), column("right_children", np.int64)
    conditions = column("split_conditions", np.float64).astype(np.float32)
    split_index = column("split_indices", np.int64)
    default_left = column("default_left", np.int64) != 0
    internal = local_left != -1
    size_of_node = np.repeat(np.asarray(sizes), sizes)
    for child in (local_left, local_right):
        if np.any(internal & ((child < 0) | (child >= size_of_node))):
            raise ValueError("child index out of range")
    if np.any(internal & ((split_index < 0) | (split_index >= num_features))):
        raise ValueError("split feature index out of range")
    if not np.all(np.isfinite(conditions[internal])):
        raise ValueError("non-finite split threshold")
    base = np.repeat(starts, sizes)
    left, right = local_left + base, local_right + base  # global node ids
    column_of = split_index + np.where(default_left, 0, num_features)
    split_of = (order_keys(conditions).astype(np.uint64) << np.uint64(32)) | column_of.astype(np.uint64)
    padding = np.uint64(KEY_MAX << 32)

    depths = np.zeros(len(trees), dtype=np.int64)
    level_splits: list[tuple[np.ndarray, int, np.ndarray]] = []  # (trees, level, splits)
    bottom: dict[int, np.ndarray] = {}  # tree -> its leaves' node ids
    active = np.arange(len(trees))
    current = starts[:, None]  # (active trees, 2^level) node ids
    for level in range(MAX_DEPTH + 1):
        split = internal[current]
        going_on = split.any(axis=1)
        if min_depths is not None:
            going_on |= min_depths[active] > level
        for t, nodes in zip(active[~going_on].tolist(), current[~going_on], strict=True):
            depths[t] = level
            bottom[t] = nodes
        active, current, split = active[going_on], current[going_on], split[going_on]
        if active.size == 0:
            break
        if level == MAX_DEPTH:
            raise ValueError(f"tree {int(active[0])}: deeper than {MAX_DEPTH} levels")
        level_splits.append((active, level, np.where(split, split_of[current], padding)))
        # A leaf above the bottom is its own two children, whichever way a row goes.
        current = np.stack(
            (np.where(split, left[current], current), np.where(split, right[current], current)), axis=2
        ).reshape(len(active), -1)
    node_sizes = (1 << depths) - 1
    node_starts = np.cumsum(node_sizes) - node_sizes
    packed = np.zeros(int(node_sizes.sum()), dtype=np.uint64)
    for tree_ids, level, values in level_splits:
        slots = node_starts[tree_ids][:, None] + ((1 << level) - 1) + np.arange(1 << level)
        packed[slots] = values
    leaves = np.concatenate([conditions[bottom[t]] for t in range(len(trees))])
    return depths, packed, leaves


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array
