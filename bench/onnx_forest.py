"""XGBoost boosters evaluated by onnxruntime's TreeEnsembleRegressor: an alternative to the JIT.

Install (the optional ``onnx`` extra, not a runtime dependency):

    .venv/bin/pip install -e '.[onnx]'

``OnnxForests.from_boosters([ttft, tpot])`` builds one ``ai.onnx.ml`` TreeEnsembleRegressor
(opset 3) per booster straight from their JSON models with ``onnx.helper`` (no onnxmltools), all
in one graph, so one ``session.run`` evaluates every model.

Semantics, node for node: XGBoost sends a row left when ``x < threshold`` (``BRANCH_LT``, the
true branch is the left child) and a missing value to its default side
(``nodes_missing_value_tracks_true = default_left``); a leaf's value is its split condition.

Exactness: with float attributes onnxruntime sums a target's leaves in float32, in tree order,
and adds ``base_values`` only after the sum; XGBoost starts its float32 sum from base_score.
So base_score (``prediction_server.trees.read_gbtree_model``, the served evaluators' reading)
goes in as a one-leaf tree ahead of the booster's trees, and the sum runs in XGBoost's order.
Measured (onnxruntime 1.32, xgboost 3.2, 200x6 models): margins bit-identical to
``inplace_predict(..., predict_type="margin")`` on random, NaN and on-threshold rows; with
``base_values`` instead they differed by up to 2e-5 on ~90 % of rows. With double attributes
(``*_as_tensor``) onnxruntime would sum in double, which rounds differently again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import orjson
from onnx import helper

from prediction_server.trees import read_gbtree_model

INPUT = "X"
_ML_OPSET = 3  # TreeEnsembleRegressor-3 with float attributes: float32 thresholds and sums


class OnnxForests:
    """One onnxruntime session, single-threaded, evaluating several boosters' margins in one run."""

    def __init__(self, model: onnx.ModelProto) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )

    @classmethod
    def from_boosters(cls, boosters: Sequence[Any]) -> OnnxForests:
        """Compile XGBoost boosters (identity-link, one output each) via their JSON models."""
        return cls(forest_model([orjson.loads(booster.save_raw("json")) for booster in boosters]))

    def predict_margins(self, X: np.ndarray) -> list[np.ndarray]:
        """One float32 margin array of shape (n,) per booster, for float32 rows `X` (NaN: missing)."""
        return [margins[:, 0] for margins in self.session.run(None, {INPUT: X})]


def forest_model(models: Sequence[Any]) -> onnx.ModelProto:
    """An ONNX graph with one TreeEnsembleRegressor per parsed XGBoost model, output k for model k.

    One node per model rather than one node with a target per model: measured, onnxruntime's
    multi-target aggregation cost more than the second node (10 rows: 70 against 48 µs).
    """
    nodes, outputs = [], []
    num_features = None
    for k, model in enumerate(models):
        features, base_score, trees = read_gbtree_model(model)
        if num_features not in (None, features):
            raise ValueError(f"models disagree on the number of features: {num_features}, {features}")
        num_features = features
        columns: dict[str, Any] = {}  # attribute name -> values, over all trees
        for tree_id, tree in enumerate([_constant_tree(base_score), *trees]):
            for name, values in _tree_columns(tree, tree_id).items():
                columns.setdefault(name, []).extend(values)
        output = f"margin{k}"
        nodes.append(
            helper.make_node(
                "TreeEnsembleRegressor",
                [INPUT],
                [output],
                domain="ai.onnx.ml",
                n_targets=1,
                aggregate_function="SUM",
                post_transform="NONE",
                **columns,
            )
        )
        outputs.append(helper.make_tensor_value_info(output, onnx.TensorProto.FLOAT, [None, 1]))
    inputs = [helper.make_tensor_value_info(INPUT, onnx.TensorProto.FLOAT, [None, num_features])]
    model = helper.make_model(
        helper.make_graph(nodes, "xgboost_margins", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", _ML_OPSET)],
    )
    onnx.checker.check_model(model)
    return model


def _constant_tree(value: np.float32) -> dict[str, Any]:
    """A one-leaf tree in XGBoost's JSON layout: every row gets `value`."""
    return {
        "left_children": [-1],
        "right_children": [-1],
        "split_indices": [0],
        "split_conditions": [float(value)],
        "default_left": [0],
    }


def _tree_columns(tree: Any, tree_id: int) -> dict[str, list[Any]]:
    """TreeEnsembleRegressor attribute values for one XGBoost tree (node ids kept as they are)."""
    if any(tree.get("split_type", [])):
        raise ValueError("categorical splits are not supported")
    left = np.asarray(tree["left_children"], dtype=np.int64)
    right = np.asarray(tree["right_children"], dtype=np.int64)
    # XGBoost writes float32 in shortest round-trip form: parse as float64, round to float32.
    value = np.asarray(tree["split_conditions"], dtype=np.float64).astype(np.float32)
    internal = left != -1
    nodes = np.arange(left.size)
    leaves = nodes[~internal]
    return {
        "nodes_treeids": [tree_id] * left.size,
        "nodes_nodeids": nodes.tolist(),
        "nodes_modes": np.where(internal, "BRANCH_LT", "LEAF").tolist(),
        "nodes_featureids": np.where(internal, tree["split_indices"], 0).tolist(),
        "nodes_values": np.where(internal, value, np.float32(0)).tolist(),
        "nodes_truenodeids": np.where(internal, left, 0).tolist(),
        "nodes_falsenodeids": np.where(internal, right, 0).tolist(),
        "nodes_missing_value_tracks_true": (internal & np.asarray(tree["default_left"], dtype=bool))
        .astype(np.int64)
        .tolist(),
        "target_treeids": [tree_id] * leaves.size,
        "target_nodeids": leaves.tolist(),
        "target_ids": [0] * leaves.size,
        "target_weights": value[leaves].tolist(),
    }
