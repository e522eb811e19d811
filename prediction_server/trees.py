"""Vectorised evaluator for XGBoost regression-tree ensembles on the prediction hot path.

`Booster.inplace_predict` spends ~150-250 µs per call on fixed overhead even with one thread,
which dominates the 5-100 row calls a scheduler makes. `CompiledForest` packs every tree into
flat numpy tables once and walks all (tree, row) pairs together, one tree level per iteration,
so a call costs a few dozen numpy operations instead of a trip through XGBoost's C API.

Layout: nodes are renumbered breadth-first per tree so a node's two children are adjacent
(`right == left + 1`), and XGBoost's test `x < threshold -> left` becomes
`child = first_child + (x >= threshold)`. Leaves step to themselves, so trees of different depths
all finish after `max_depth` steps.

Encoding: numpy gathers cost far more than elementwise ops, so each step does only two: one
packed int64 per node and one input value. Inputs and thresholds are mapped to order-preserving
integer keys in [0, 2^32) (`order_keys`), and a node packs
    feature + ((first_child + 1) << (B + 32)) - (threshold_key << B)        (B = feature bits)
so that `(packed + (x_key << B)) >> (B + 32)` is first_child + 1 when x_key >= threshold_key
(the low 32+B bits stay non-negative) and first_child otherwise (they borrow one). A leaf packs
`node << (B + 32)`, which the same step maps back to itself. The feature is `packed & (2^B - 1)`.

Missing values: XGBoost sends NaN to the node's default child. Rather than test for NaN at every
step, a call whose input contains NaN evaluates on `[X with NaN->-inf | X with NaN->+inf]` and
default-right nodes read the second half (+inf >= t goes right, -inf >= t goes left).

Exactness: leaf values are added in float32 in tree order onto base_score, which is how XGBoost's
CPU predictor accumulates, so margins are bit-identical to `inplace_predict(..., "margin")`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import orjson
from numpy.typing import NDArray

if TYPE_CHECKING:
    import xgboost

# Objectives whose margin is the identity of base_score; for any other link (logit, log) the
# JSON base_score is a probability/mean that XGBoost transforms, which we do not replicate.
_IDENTITY_LINK_OBJECTIVES = frozenset(
    {"reg:squarederror", "reg:quantileerror", "reg:absoluteerror", "reg:pseudohubererror"}
)

# Rows are processed in blocks so the (trees x rows) temporaries stay ~1 MB whatever the batch;
# measured: 2^16-2^17 is fastest, one unblocked matrix was ~35% slower at 10k rows.
_BLOCK_ELEMENTS = 1 << 17

IntArray = NDArray[np.int64]
FloatArray = NDArray[np.float32]
_TreeTables = tuple[IntArray, IntArray, FloatArray, IntArray, FloatArray]
_Array = TypeVar("_Array", bound=np.ndarray)


@dataclass(frozen=True, eq=False)
class CompiledForest:
    """Immutable, thread-safe evaluator of one XGBoost booster's trees.

    Tables are read-only and every call allocates its own temporaries, so one instance can be
    shared by any number of threads. Uses all trees (like `Booster.inplace_predict`, unlike an
    early-stopped `XGBRegressor.predict`, which stops at `best_iteration`).
    """

    num_features: int
    num_trees: int
    max_depth: int
    base_score: np.float32
    _roots: IntArray = field(repr=False)
    _step: IntArray = field(repr=False)
    _step_if_missing: IntArray = field(repr=False)
    _leaf_value: FloatArray = field(repr=False)
    _feature_bits: int = field(repr=False)

    @classmethod
    def from_booster(cls, booster: xgboost.Booster) -> CompiledForest:
        """Compile a trained or loaded booster via its JSON dump (float32 values round-trip exactly)."""
        return cls._from_model(orjson.loads(booster.save_raw("json")))

    @classmethod
    def from_model(cls, model: Any) -> CompiledForest:
        """Compile a booster's parsed JSON dump (``orjson.loads(booster.save_raw("json"))``)."""
        return cls._from_model(model)

    @classmethod
    def from_json_bytes(cls, raw: bytes) -> CompiledForest:
        """Compile XGBoost's native model format: JSON, or UBJSON (loaded through xgboost)."""
        if _looks_like_ubjson(raw):
            import xgboost  # only this path needs the library

            return cls.from_booster(xgboost.Booster(model_file=bytearray(raw)))
        try:
            model = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"not an XGBoost JSON model: {exc}") from exc
        return cls._from_model(model)

    @classmethod
    def _from_model(cls, model: Any) -> CompiledForest:
        num_features, base_score, trees = read_gbtree_model(model)

        roots: list[int] = []
        parts: list[_TreeTables] = []
        max_depth = 0
        offset = 0
        for tree in trees:
            depth, arrays = _compile_tree(tree, num_features, offset)
            roots.append(offset)
            parts.append(arrays)
            max_depth = max(max_depth, depth)
            offset += arrays[0].size
        if not parts:
            raise ValueError("model has no trees")

        feature, default_right, threshold, first_child, leaf_value = (
            np.concatenate(column) for column in zip(*parts, strict=True)
        )
        # Room for a feature index into [X_low | X_high] (2 * num_features columns).
        feature_bits = max(1, (2 * num_features - 1).bit_length())
        if offset + 2 > 1 << (31 - feature_bits):  # keeps `packed + key` below 2^63
            raise ValueError(f"model too large to pack: {offset} nodes, {num_features} features")
        return cls(
            num_features=num_features,
            num_trees=len(roots),
            max_depth=max_depth,
            base_score=base_score,
            _roots=_frozen(np.asarray(roots, dtype=np.int64)),
            _step=_frozen(_pack(feature, threshold, first_child, feature_bits)),
            _step_if_missing=_frozen(
                _pack(feature + default_right * num_features, threshold, first_child, feature_bits)
            ),
            _leaf_value=_frozen(leaf_value),
            _feature_bits=feature_bits,
        )

    def predict_margin(self, X: np.ndarray) -> FloatArray:
        """Margins for float32 rows `X` of shape (n, num_features); NaN means missing."""
        X = np.ascontiguousarray(X, dtype=np.float32)
        if X.ndim != 2 or X.shape[1] != self.num_features:
            raise ValueError(f"expected X of shape (n, {self.num_features}), got {X.shape}")
        step = self._step
        missing = np.isnan(X)
        if missing.any():
            low, high = np.float32(-np.inf), np.float32(np.inf)
            X = np.concatenate((np.where(missing, low, X), np.where(missing, high, X)), axis=1)
            step = self._step_if_missing
        keys = order_keys(X)
        keys <<= self._feature_bits
        n = X.shape[0]
        rows_per_block = max(1, _BLOCK_ELEMENTS // self.num_trees)
        if n <= rows_per_block:
            return self._predict_block(keys, step)
        out = np.empty(n, dtype=np.float32)
        for start in range(0, n, rows_per_block):
            stop = min(n, start + rows_per_block)
            out[start:stop] = self._predict_block(keys[start:stop], step)
        return out

    def _predict_block(self, keys: IntArray, step: IntArray) -> FloatArray:
        n, stride = keys.shape
        flat_keys = keys.reshape(-1)
        row_offset = np.arange(n, dtype=np.int64) * stride
        feature_mask = (1 << self._feature_bits) - 1
        shift = self._feature_bits + 32
        # (trees, rows) so the final accumulation runs across trees with rows as the inner loop.
        node = np.broadcast_to(self._roots[:, None], (self.num_trees, n))
        packed = step.take(self._roots)[:, None]  # every row starts at the root: (trees, 1)
        for level in range(self.max_depth):
            if level:
                packed = step.take(node)
            column = (packed & feature_mask) + row_offset
            node = packed + flat_keys.take(column)
            node >>= shift
        terms = np.empty((self.num_trees + 1, n), dtype=np.float32)
        terms[0] = self.base_score
        terms[1:] = self._leaf_value.take(node)
        # accumulate (not sum) keeps XGBoost's strictly sequential float32 order; np.sum would
        # use pairwise summation and differ in the last bit.
        return np.add.accumulate(terms, axis=0)[-1]


def read_gbtree_model(model: Any) -> tuple[int, np.float32, list[Any]]:
    """``(num_features, base_score, trees)`` of a parsed XGBoost JSON model that the compiled
    evaluators support (one output, gbtree, an identity-link objective); ``ValueError`` otherwise."""
    try:
        learner = model["learner"]
        params = learner["learner_model_param"]
        objective = learner["objective"]["name"]
        gbm = learner["gradient_booster"]
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not an XGBoost JSON model: missing {exc}") from exc
    if int(params.get("num_target", "1")) != 1 or int(params.get("num_class", "0")) > 1:
        raise ValueError("multi-output models (num_target > 1 or num_class > 1) are not supported")
    if gbm.get("name") != "gbtree":
        raise ValueError(f"only 'gbtree' boosters are supported, got {gbm.get('name')!r}")
    if objective not in _IDENTITY_LINK_OBJECTIVES:
        raise ValueError(
            f"objective {objective!r} is not supported; expected one of {sorted(_IDENTITY_LINK_OBJECTIVES)}"
        )
    try:
        trees = list(gbm["model"]["trees"])
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not an XGBoost JSON model: missing {exc}") from exc
    return int(params["num_feature"]), _parse_base_score(params["base_score"]), trees


def _compile_tree(tree: Any, num_features: int, offset: int) -> tuple[int, _TreeTables]:
    """Renumber one tree breadth-first with adjacent children; return (depth, tables).

    Leaves come back with a NaN threshold and themselves as first child; `_pack` relies on both.
    """
    left = np.asarray(tree["left_children"], dtype=np.int64)
    right = np.asarray(tree["right_children"], dtype=np.int64)
    # Parsed as float64 then rounded: XGBoost writes float32 in shortest round-trip form.
    conditions = np.asarray(tree["split_conditions"], dtype=np.float64).astype(np.float32)
    split_index = np.asarray(tree["split_indices"], dtype=np.int64)
    default_left = np.asarray(tree["default_left"], dtype=bool)
    size = left.size
    if not (size and right.size == conditions.size == split_index.size == default_left.size == size):
        raise ValueError(f"tree {tree.get('id')}: malformed node arrays")
    if int(tree.get("tree_param", {}).get("size_leaf_vector", "1")) > 1:
        raise ValueError("multi-target trees are not supported")
    if np.any(np.asarray(tree.get("split_type", []), dtype=np.int64) != 0):
        raise ValueError("categorical splits are not supported")
    is_internal = left != -1
    children = np.concatenate((left[is_internal], right[is_internal]))
    if children.size and (children.min() < 0 or children.max() >= size):
        raise ValueError(f"tree {tree.get('id')}: child index out of range")

    levels = [np.zeros(1, dtype=np.int64)]
    while True:
        parents = levels[-1][is_internal[levels[-1]]]
        if parents.size == 0:
            break
        if len(levels) > size:
            raise ValueError(f"tree {tree.get('id')}: cycle in child links")
        # Interleave so each parent's (left, right) land next to each other.
        levels.append(np.stack((left[parents], right[parents]), axis=1).reshape(-1))
    order = np.concatenate(levels)
    if np.unique(order).size != order.size:
        raise ValueError(f"tree {tree.get('id')}: a node is reached twice, not a tree")
    new_id = np.full(size, -1, dtype=np.int64)
    new_id[order] = np.arange(order.size, dtype=np.int64) + offset

    internal = is_internal[order]
    feature = np.where(internal, split_index[order], 0)
    if np.any((feature < 0) | (feature >= num_features)):
        raise ValueError(f"tree {tree.get('id')}: split feature index out of range")
    threshold = np.where(internal, conditions[order], np.float32(np.nan))
    if not np.all(np.isfinite(threshold[internal])):
        # Missing values become -inf on default-left nodes, and -inf >= -inf would go right.
        raise ValueError(f"tree {tree.get('id')}: non-finite split threshold")
    first_child = np.where(internal, new_id[np.maximum(left[order], 0)], new_id[order])
    leaf_value = np.where(internal, np.float32(0), conditions[order])
    default_right = (internal & ~default_left[order]).astype(np.int64)
    return len(levels) - 1, (feature, default_right, threshold, first_child, leaf_value)


def order_keys(values: FloatArray) -> IntArray:
    """Map non-NaN float32 to int64 in [0, 2^32) so that a >= b exactly when key(a) >= key(b)."""
    # Adding +0.0 turns -0.0 into +0.0: they compare equal, so they must share a key.
    bits = (values + np.float32(0.0)).view(np.int32).astype(np.int64)
    bits ^= (bits >> 31) & 0x7FFFFFFF  # sign-magnitude -> two's complement order
    bits += 1 << 31
    return bits


def _pack(feature: IntArray, threshold: FloatArray, first_child: IntArray, feature_bits: int) -> IntArray:
    """One int64 per node for the step described in the module docstring."""
    internal = ~np.isnan(threshold)
    node = np.arange(threshold.size, dtype=np.int64)
    key = order_keys(np.where(internal, threshold, np.float32(0.0)))
    shift = feature_bits + 32
    return np.where(internal, feature + ((first_child + 1) << shift) - (key << feature_bits), node << shift)


def _parse_base_score(text: str) -> np.float32:
    # XGBoost >= 3 writes a vector ("[2.8769784E0]"), 2.x a scalar ("2.8769784E0").
    values = text.strip().strip("[]").split(",")
    if len(values) != 1:
        raise ValueError(f"expected one base_score, got {text!r}")
    return np.float32(float(values[0]))


def _looks_like_ubjson(raw: bytes) -> bool:
    # Both formats open with '{'; JSON follows it with a quote, brace or whitespace, XGBoost's
    # UBJSON with the integer type marker of the first key's length.
    head = bytes(raw[:2])
    return len(head) == 2 and head[0:1] == b"{" and head[1:2] not in b'"} \t\r\n'


def _frozen(array: _Array) -> _Array:
    array.flags.writeable = False
    return array
