"""Several XGBoost models' trees evaluated in one JIT-compiled pass (numba, persistent cache).

``JitForests.from_boosters([ttft, tpot])`` lays every tree out as a perfect binary tree of its
own depth (node ``i``'s children are ``2i+1`` and ``2i+2``; a leaf above the bottom level is
padded with a split whose two sides lead to the same leaf value) and packs each split into one
uint64: the order-preserving key of its threshold (``trees.order_keys``) in the high 32 bits, the
input column in the low ones. A row's inputs become keys once per call, twice per feature: column
``f`` holds NaN as the smallest key, column ``num_features + f`` as the largest, and a
default-right split reads the second column. So a visit is two loads, one integer comparison and
``node = 2 node + 1 + (key >= threshold_key)``: no branch, no NaN test. Rows are walked in blocks
of ``_BLOCK``, tree by tree, all rows of a block one level at a time, so the rows' walks overlap
in the CPU instead of waiting on each other's loads.

Exactness: XGBoost sends a row left when ``x < threshold`` (right otherwise) and a missing value
to the split's default side, and adds the leaf values in float32 in tree order onto base_score;
the kernel does exactly that, so margins are bit-identical to ``inplace_predict(..., "margin")``
(``evaluators.compile_forests`` checks them on the probe matrix before serving, and the unit tests
over random, missing, extreme and on-threshold rows).

The kernel is compiled on first use with ``cache=True``: numba keeps the machine code in
``__pycache__`` beside this file, or, where that is read-only, in its user-wide cache
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np
import orjson

from prediction_server.trees import order_keys, read_gbtree_model
from shared.logging import log_event

log = logging.getLogger(__name__)

# Padding trees to perfect shape costs 2^depth nodes per tree: 12 KB at depth 10; deeper models
# go to the numpy evaluator.
MAX_DEPTH = 10
_BLOCK = 32
_KEY_MAX = 0xFFFFFFFF
# Columns index [keys with NaN lowest | keys with NaN highest]: 2 * num_features < 2^16.
_MAX_FEATURES = 0x7FFF


def _kernel_source(X: Any, packed: Any, leaves: Any, trees: Any, base: Any, out: Any) -> None:
    """``out[k, i]``: the margin of model ``k`` for row ``i`` (compiled by numba, see the module doc).

    ``trees[t]`` is (depth, first node, first leaf, model) of tree ``t``; ``base[k]`` model ``k``'s
    base_score. Plain Python as written (and slow as such): only its compiled form is used.
    """
    n, nf = X.shape
    for k in range(base.shape[0]):
        for i in range(n):
            out[k, i] = base[k]
    stride = 2 * nf
    keys = np.empty(_BLOCK * stride, np.uint64)
    nodes = np.empty(_BLOCK, np.uint64)
    one = np.uint64(1)
    column_mask = np.uint64(0xFFFF)
    shift = np.uint64(32)
    for start in range(0, n, _BLOCK):
        m = min(n, start + _BLOCK) - start
        for j in range(m):
            for f in range(nf):
                x = X[start + j, f]
                if x != x:
                    low = np.uint64(0)
                    high = np.uint64(_KEY_MAX)
                else:
                    # trees.order_keys, inlined: +0.0 merges -0.0 into +0.0.
                    bits = np.int64(np.float32(x + np.float32(0.0)).view(np.int32))
                    if bits < 0:
                        bits = bits ^ np.int64(0x7FFFFFFF)
                    low = high = np.uint64(bits + np.int64(1 << 31))
                keys[j * stride + f] = low
                keys[j * stride + nf + f] = high
        for t in range(trees.shape[0]):
            depth = trees[t, 0]
            first_node = np.uint64(trees[t, 1])
            k = trees[t, 3]
            for j in range(m):
                nodes[j] = np.uint64(0)
            for _ in range(depth):
                for j in range(m):
                    node = nodes[j]
                    split = packed[first_node + node]
                    key = keys[np.uint64(j * stride) + (split & column_mask)]
                    nodes[j] = node + node + one + np.uint64(key >= (split >> shift))
            first_leaf = trees[t, 2] - ((1 << depth) - 1)
            for j in range(m):
                out[k, start + j] += leaves[first_leaf + np.int64(nodes[j])]


@cache
def _kernel() -> Callable[..., None]:
    """The compiled kernel; raises ``ImportError`` without numba."""
    import numba

    try:
        kernel = numba.njit(_kernel_source, cache=True, nogil=True, boundscheck=False, error_model="numpy")
    except RuntimeError as exc:  # "cannot cache function ...: no locator available"
        log_event(log, "jit_cache_unavailable", logging.WARNING, error=str(exc))
        kernel = numba.njit(_kernel_source, cache=False, nogil=True, boundscheck=False, error_model="numpy")
    return kernel


@cache
def jit_available() -> bool:
    """Whether numba imports here (the compiled evaluator can be used at all)."""
    try:
        _kernel()
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
        tables = (
            _frozen(np.zeros(1, dtype=np.uint64)),
            _frozen(np.zeros(1, dtype=np.float32)),
            _frozen(np.zeros((0, 4), dtype=np.int64)),
            _frozen(np.zeros(1, dtype=np.float32)),
        )
        for rows in (np.zeros((1, 1), dtype=np.float32), _frozen(np.zeros((1, 1), dtype=np.float32))):
            _kernel()(rows, *tables, np.empty((1, 1), dtype=np.float32))
        _warm.set()
    return True


@dataclass(frozen=True, eq=False)
class JitForests:
    """Immutable evaluator of several boosters' trees over the same features, in one pass."""

    num_features: int
    num_models: int
    num_trees: int
    max_depth: int
    _packed: np.ndarray = field(repr=False)
    _leaves: np.ndarray = field(repr=False)
    _trees: np.ndarray = field(repr=False)
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
        rows: list[tuple[int, int, int, int]] = []
        bases: list[np.float32] = []
        num_features = -1
        node_offset = leaf_offset = 0
        for k, model in enumerate(models):
            features, base_score, trees = read_gbtree_model(model)
            if num_features not in (-1, features):
                raise ValueError(f"models disagree on the number of features ({num_features}, {features})")
            num_features = features
            if not 0 < num_features <= _MAX_FEATURES:
                raise ValueError(f"{num_features} features: too many to pack")
            if not trees:
                raise ValueError("model has no trees")
            bases.append(base_score)
            depths, tree_splits, tree_leaves = _perfect_trees(trees, num_features)
            node_sizes, leaf_sizes = (1 << depths) - 1, 1 << depths
            node_starts = node_offset + np.cumsum(node_sizes) - node_sizes
            leaf_starts = leaf_offset + np.cumsum(leaf_sizes) - leaf_sizes
            rows.extend(
                zip(
                    depths.tolist(), node_starts.tolist(), leaf_starts.tolist(), [k] * len(trees), strict=True
                )
            )
            splits.append(tree_splits)
            leaves.append(tree_leaves)
            node_offset += tree_splits.size
            leaf_offset += tree_leaves.size
        if not rows:
            raise ValueError("no models")
        table = np.asarray(rows, dtype=np.int64)
        return cls(
            num_features=num_features,
            num_models=len(bases),
            num_trees=len(rows),
            max_depth=int(table[:, 0].max()),
            # One spare entry so that the table is never empty (all trees stumps).
            _packed=_frozen(np.concatenate([*splits, np.zeros(1, dtype=np.uint64)])),
            _leaves=_frozen(np.concatenate(leaves)),
            _trees=_frozen(table),
            _base=_frozen(np.asarray(bases, dtype=np.float32)),
        )

    def predict_margins(self, features: np.ndarray) -> np.ndarray:
        """``(num_models, n)`` float32 margins for float32 rows of shape ``(n, num_features)``."""
        X = np.ascontiguousarray(features, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self.num_features:
            raise ValueError(f"expected rows of shape (n, {self.num_features}), got {X.shape}")
        out = np.empty((self.num_models, X.shape[0]), dtype=np.float32)
        _kernel()(X, self._packed, self._leaves, self._trees, self._base, out)
        return out

    def margins(self, features: np.ndarray) -> tuple[np.ndarray, ...]:
        """One float32 margin array per model, in ``from_boosters``' order."""
        return tuple(self.predict_margins(features))


def _perfect_trees(trees: Sequence[Any], num_features: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(depths, packed splits, leaf values)`` of one model's XGBoost JSON trees laid out as perfect
    trees of their own depth, one after the other (``2^depth - 1`` splits and ``2^depth`` leaves
    each), built level by level for all trees at once."""
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
    padding = np.uint64(_KEY_MAX << 32)

    depths = np.zeros(len(trees), dtype=np.int64)
    level_splits: list[tuple[np.ndarray, int, np.ndarray]] = []  # (trees, level, splits)
    bottom: dict[int, np.ndarray] = {}  # tree -> its leaves' node ids
    active = np.arange(len(trees))
    current = starts[:, None]  # (active trees, 2^level) node ids
    for level in range(MAX_DEPTH + 1):
        split = internal[current]
        going_on = split.any(axis=1)
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
