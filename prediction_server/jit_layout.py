"""The memory layout shared by ``jit_forest`` (which builds it, without numba) and ``jit_kernels``
(which reads it, compiled): tree groups, row blocks, split keys and the served-terms plan."""

from __future__ import annotations

# Trees of one model walked together (laid out one after the other, padded to the group's
# depth), rows per block: see jit_kernels.
GROUP = 8
BLOCK = 32
# Blocks of at least this many rows walk tree by tree (jit_kernels._walk_rows_together); smaller
# ones walk GROUP trees together (measured crossover: 6 rows, both models of 200x6 trees).
ROWS_TOGETHER = 6
KEY_MAX = 0xFFFFFFFF
# Columns index [keys with NaN lowest | keys with NaN highest]: 2 * num_features < 2^16.
MAX_FEATURES = 0x7FFF

# jit_kernels.served_terms' plan of one model: a row of ints, a row of float64s they point into.
P_HAS_BASELINE, P_TERMS, P_COEF_AT, P_HAS_REGIMES, P_WAITING_AT, P_WAITING_N, P_KV_AT, P_KV_N = range(8)
P_OFFSETS_AT, P_COLUMNS = 8, 9  # the baseline's feature columns follow, then its scale columns
F_INTERCEPT, F_CALIBRATION = 0, 1

# Every value above that the kernels use, in this order. numba bakes them into the machine code it
# caches and invalidates that cache only when jit_kernels.py itself changes (numba's documented
# limitation for globals and other files), so jit_kernels.py holds a literal copy and refuses to
# import (the numpy evaluator serves) unless it matches: a layout change must edit both files.
LAYOUT = (
    GROUP,
    BLOCK,
    ROWS_TOGETHER,
    KEY_MAX,
    P_HAS_BASELINE,
    P_TERMS,
    P_COEF_AT,
    P_HAS_REGIMES,
    P_WAITING_AT,
    P_WAITING_N,
    P_KV_AT,
    P_KV_N,
    P_OFFSETS_AT,
    P_COLUMNS,
    F_INTERCEPT,
    F_CALIBRATION,
)
