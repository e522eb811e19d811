"""The numba kernels behind ``prediction_server.jit_forest``, compiled once per machine and cached.

Importing this module imports numba (~0.4 s) and loads or compiles the kernels, so only
``jit_forest`` imports it, off the load path (``jit_forest.warm_kernel``). Two entry points:

- ``tree_margins(X, ...)``: every model's float32 margins for a float32 feature matrix;
- ``served_terms(numeric, codes, ...)``: the same margins for wire rows, plus everything of the
  served value that is plain arithmetic: the feature matrix (``shared.features.build_features``),
  the calibration offset, the work-ahead baseline (``shared.baseline.baseline_ms``) and each row's
  regime offset (``shared.regimes``). Only the inverse transforms (``log1p``/``expm1``) are left
  to numpy, whose SIMD implementations round differently from the C library's.

Every formula here repeats one of those modules' operation for operation (the same float64
operations in the same order, no fused multiply-add), so the results are the same bits;
``prediction_server.predictor`` checks that on the probe rows before it serves a version through
``served_terms``, and ``tests/unit/test_jit_served.py`` on random and extreme rows.

Tree walk: trees are laid out by ``jit_forest`` as perfect binary trees, in groups of ``GROUP``
consecutive trees of one model padded to the group's depth. Rows are taken in blocks of
``BLOCK``. A block of fewer than ``ROWS_TOGETHER`` rows (a typical scheduler call of a few
candidate pods) walks each group's trees together, row by row, one level at a time: ``GROUP``
independent chains of loads, so the CPU overlaps them, where one tree at a time waits on each
load (4-5x faster for one row). A larger block goes tree by tree, all its rows one level at a time,
a loop of independent loads, one per row (1.2-1.4x faster from 10 rows on; numba emits no
gather instructions for it on an AVX-512 machine, so the gain is overlapped loads, not SIMD lanes).
Leaf values are added in tree order, as XGBoost does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from prediction_server.jit_layout import (
    BLOCK,
    F_CALIBRATION,
    F_INTERCEPT,
    GROUP,
    KEY_MAX,
    LAYOUT,
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
    ROWS_TOGETHER,
)
from shared.logging import log_event

log = logging.getLogger(__name__)

# jit_layout.LAYOUT as these kernels were written and cached for (see there); _walk_trees_together
# walks groups of exactly 8 trees.
_COMPILED_LAYOUT = (8, 32, 6, 0xFFFFFFFF, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1)
if LAYOUT != _COMPILED_LAYOUT or GROUP != 8:
    raise ImportError(f"jit_layout.LAYOUT {LAYOUT} is not the layout these kernels read {_COMPILED_LAYOUT}")


_uncached: list[str] = []


def _njit(function: Callable[..., Any]) -> Any:
    try:
        return numba.njit(function, cache=True, nogil=True, boundscheck=False, error_model="numpy")
    except RuntimeError as exc:  # "cannot cache function ...: no locator available"
        if not _uncached:  # one warning for the module
            log_event(log, "jit_cache_unavailable", logging.WARNING, error=str(exc))
        _uncached.append(function.__name__)
        return numba.njit(function, cache=False, nogil=True, boundscheck=False, error_model="numpy")


@_njit
def _fill_keys(X: Any, start: int, m: int, keys: Any) -> None:
    """Rows ``start .. start+m`` of ``X`` as order-preserving keys, twice per feature: column ``f``
    with NaN lowest, column ``nf + f`` with NaN highest (``trees.order_keys``, inlined; +0.0 merges
    -0.0 into +0.0)."""
    nf = X.shape[1]
    stride = 2 * nf
    for j in range(m):
        for f in range(nf):
            x = X[start + j, f]
            if x != x:
                low = np.uint64(0)
                high = np.uint64(KEY_MAX)
            else:
                bits = np.int64(np.float32(x + np.float32(0.0)).view(np.int32))
                if bits < 0:
                    bits = bits ^ np.int64(0x7FFFFFFF)
                low = high = np.uint64(bits + np.int64(1 << 31))
            keys[j * stride + f] = low
            keys[j * stride + nf + f] = high


@_njit
def _walk_rows_together(
    keys: Any, stride: int, start: int, m: int, packed: Any, leaves: Any, groups: Any, out: Any
) -> None:
    """``_walk_trees_together`` for blocks of ``ROWS_TOGETHER`` rows or more: tree by tree, all rows
    of the block one level at a time (independent loads, one per row), in uint64."""
    nodes = np.empty(BLOCK, np.uint64)
    one = np.uint64(1)
    mask = np.uint64(0xFFFF)
    shift = np.uint64(32)
    for g in range(groups.shape[0]):
        depth = groups[g, 0]
        n0 = groups[g, 1]
        k = groups[g, 3]
        size = (np.int64(1) << depth) - 1
        width = size + 1
        for t in range(groups[g, 4]):
            first = np.uint64(n0 + t * size)
            for j in range(m):
                nodes[j] = np.uint64(0)
            for _ in range(depth):
                for j in range(m):
                    node = nodes[j]
                    split = packed[first + node]
                    key = keys[np.uint64(j * stride) + (split & mask)]
                    nodes[j] = node + node + one + np.uint64(key >= (split >> shift))
            l0 = groups[g, 2] + t * width - size
            for j in range(m):
                out[k, start + j] += leaves[l0 + np.int64(nodes[j])]


@_njit
def _walk_trees_together(
    keys: Any, stride: int, start: int, m: int, packed: Any, leaves: Any, groups: Any, out: Any
) -> None:
    """Add every tree's leaf to ``out[model, start + j]`` for the block's ``m`` rows, in tree order.

    ``groups[g]`` is (depth, first node, first leaf, model, trees) of group ``g``; its trees follow
    each other with ``2^depth - 1`` nodes and ``2^depth`` leaves each. A visit is two loads, one
    integer comparison and ``node = 2 node + 1 + (key >= threshold key)``."""
    mask = np.uint64(0xFFFF)
    shift = np.uint64(32)
    for g in range(groups.shape[0]):
        depth = groups[g, 0]
        n0 = groups[g, 1]
        first_leaf = groups[g, 2]
        k = groups[g, 3]
        count = groups[g, 4]
        size = (np.int64(1) << depth) - 1
        width = size + 1
        l0 = first_leaf - size  # leaf of bottom node q: l0 + q
        for j in range(m):
            kb = j * stride
            acc = out[k, start + j]
            if count == GROUP:
                n1 = n0 + size
                n2 = n1 + size
                n3 = n2 + size
                n4 = n3 + size
                n5 = n4 + size
                n6 = n5 + size
                n7 = n6 + size
                q0 = q1 = q2 = q3 = q4 = q5 = q6 = q7 = np.int64(0)
                for _ in range(depth):
                    s = packed[n0 + q0]
                    q0 = q0 + q0 + 1 + np.int64(keys[kb + np.int64(s & mask)] >= (s >> shift))
                    s = packed[n1 + q1]
                    q1 = q1 + q1 + 1 + np.int64(keys[kb + np.int64(s & mask)] >= (s >> shift))
                    s = packed[n2 + q2]
                    q2 = q2 + q2 + 1 + np.int64(keys[kb + np.int64(s & mask)] >= (s >> shift))
                    s = packed[n3 + q3]
                    q3 = q3 + q3 + 1 + np.int64(keys[kb + np.int64(s & mask)] >= (s >> shift))
                    s = packed[n4 + q4]
                    q4 = q4 + q4 + 1 + np.int64(keys[kb + np.int64(s & mask)] >= (s >> shift))
                    s = packed[n5 + q5]
                    q5 = q5 + q5 + 1 + np.int64(keys[kb + np.int64(s & mask)] >= (s >> shift))
                    s = packed[n6 + q6]
                    q6 = q6 + q6 + 1 + np.int64(keys[kb + np.int64(s & mask)] >= (s >> shift))
                    s = packed[n7 + q7]
                    q7 = q7 + q7 + 1 + np.int64(keys[kb + np.int64(s & mask)] >= (s >> shift))
                acc += leaves[l0 + q0]
                acc += leaves[l0 + width + q1]
                acc += leaves[l0 + 2 * width + q2]
                acc += leaves[l0 + 3 * width + q3]
                acc += leaves[l0 + 4 * width + q4]
                acc += leaves[l0 + 5 * width + q5]
                acc += leaves[l0 + 6 * width + q6]
                acc += leaves[l0 + 7 * width + q7]
            else:
                for t in range(count):
                    first = n0 + t * size
                    q = np.int64(0)
                    for _ in range(depth):
                        s = packed[first + q]
                        q = q + q + 1 + np.int64(keys[kb + np.int64(s & mask)] >= (s >> shift))
                    acc += leaves[l0 + t * width + q]
            out[k, start + j] = acc


@_njit
def _tree_margins(X: Any, packed: Any, leaves: Any, groups: Any, base: Any, out: Any) -> None:
    """``out[k, i]``: model ``k``'s float32 margin for row ``i`` (``base[k]`` plus its leaves)."""
    n, nf = X.shape
    for k in range(base.shape[0]):
        for i in range(n):
            out[k, i] = base[k]
    stride = 2 * nf
    keys = np.empty(BLOCK * stride, np.uint64)
    for start in range(0, n, BLOCK):
        m = min(n, start + BLOCK) - start
        _fill_keys(X, start, m, keys)
        if m >= ROWS_TOGETHER:
            _walk_rows_together(keys, stride, start, m, packed, leaves, groups, out)
        else:
            _walk_trees_together(keys, stride, start, m, packed, leaves, groups, out)


@_njit
def _nonnegative(value: float) -> float:
    """``np.maximum(value, 0.0)``: NaN stays NaN, -0.0 becomes +0.0."""
    return value if value > 0.0 or value != value else 0.0


@_njit
def _bin(value: float, plan_floats: Any, at: int, count: int) -> int:
    """``np.searchsorted(edges, value, side="right")`` for the ``count`` sorted edges at ``at``."""
    if value != value:  # NaN sorts after every edge
        return count
    b = 0
    while b < count and plan_floats[at + b] <= value:
        b += 1
    return b


@_njit
def _served_terms(
    numeric: Any,
    codes: Any,
    packed: Any,
    leaves: Any,
    groups: Any,
    base: Any,
    plan_ints: Any,
    plan_floats: Any,
    X: Any,
    margins: Any,
    baselines: Any,
    regimes: Any,
) -> None:
    """For wire rows (``numeric``: the ten numeric row fields in wire order, float64; ``codes``:
    the pod-type codes), fill ``X`` with ``build_features``' matrix and, per model ``k``:
    ``margins[k]`` = the trees' margin (float32, widened) + the calibration offset,
    ``baselines[k]`` = ``baseline_ms`` (each term capped at its bound and scaled; 0 without a baseline),
    ``regimes[k]`` = the row's regime offset (0 without offsets)."""
    n = numeric.shape[0]
    for i in range(n):
        tokens = numeric[i, 1]
        waiting = numeric[i, 2]
        running = numeric[i, 3]
        prefix = numeric[i, 5]
        prefill = numeric[i, 6]
        matched = numeric[i, 8]
        encoder = numeric[i, 9]
        for f in range(6):  # kv .. prefix_cache_score
            X[i, f] = np.float32(numeric[i, f])
        X[i, 6] = np.float32(codes[i])
        for f in range(6, 10):  # prefill_tokens_in_flight .. encoder_input_size
            X[i, f + 1] = np.float32(numeric[i, f])
        uncached = tokens * (1.0 - prefix)
        X[i, 11] = np.float32(uncached)
        X[i, 12] = np.float32(waiting + running)
        X[i, 13] = np.float32(prefill + uncached)
        difference = encoder - matched
        X[i, 14] = np.float32(_nonnegative(difference))
    tree_out = np.empty((base.shape[0], n), np.float32)
    _tree_margins(X, packed, leaves, groups, base, tree_out)
    for k in range(base.shape[0]):
        calibration = plan_floats[k, F_CALIBRATION]
        has_baseline = plan_ints[k, P_HAS_BASELINE] != 0
        has_regimes = plan_ints[k, P_HAS_REGIMES] != 0
        terms = plan_ints[k, P_TERMS]
        coef_at = plan_ints[k, P_COEF_AT]
        intercept = plan_floats[k, F_INTERCEPT]
        for i in range(n):
            margins[k, i] = np.float64(tree_out[k, i]) + calibration
            value = 0.0
            if has_baseline:
                value = intercept
                for c in range(terms):
                    column = plan_ints[k, P_COLUMNS + c]
                    work = min(np.float64(X[i, column]), plan_floats[k, coef_at + terms + c])
                    scale_column = plan_ints[k, P_COLUMNS + terms + c]
                    if scale_column >= 0:
                        scale_from = plan_floats[k, coef_at + 2 * terms + c]
                        work = work * _nonnegative(np.float64(X[i, scale_column]) - scale_from)
                    value = value + work * plan_floats[k, coef_at + c]
                value = _nonnegative(value)
            baselines[k, i] = value
            offset = 0.0
            if has_regimes:
                waiting_bin = _bin(
                    np.float64(X[i, 2]), plan_floats[k], plan_ints[k, P_WAITING_AT], plan_ints[k, P_WAITING_N]
                )
                kv_bin = _bin(
                    np.float64(X[i, 0]), plan_floats[k], plan_ints[k, P_KV_AT], plan_ints[k, P_KV_N]
                )
                regime = waiting_bin * (plan_ints[k, P_KV_N] + 1) + kv_bin
                offset = plan_floats[k, plan_ints[k, P_OFFSETS_AT] + regime]
            regimes[k, i] = offset


tree_margins = _tree_margins
served_terms = _served_terms
