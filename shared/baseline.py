"""The work-ahead baseline: a linear latency model that grows with queued work (numpy only).

Trees predict a constant beyond the deepest queue they were trained on. A model whose latency is
``baseline_ms * exp(trees)`` instead keeps growing with the work ahead of a request, because the
baseline is linear in that work and the trees learn only the log-ratio around it. The training
server fits the baseline (``training_server.baseline_fit``) and records it in the manifest
(``shared.artifacts.ModelSpec.baseline``) as a plain dict::

    {"kind": "linear", "features": ["num_request_waiting", ...], "intercept": 12.0,
     "coefficients": [30.5, ...]}

``baseline_ms`` evaluates it on a feature matrix built by ``shared.features.build_features``;
training, evaluation and serving all call it, through ``shared.artifacts.served_latency_ms``.
A ``"piecewise-linear"`` baseline also has ``upper``, a bound per term that caps its feature
before it is weighted; a feature may appear more than once, capped at different bounds, so the
baseline can be concave: its slope falls at each bound it passes (TPOT's decode step saturates;
``training_server.baseline_fit`` decides when), or flat beyond a bound (TPOT's prefill in flight,
of which a step processes at most its budget, beyond the largest its fit rows saw). Its own kind
makes a prediction server that predates it refuse the version rather than misread it.

A ``"scaled-piecewise-linear"`` baseline also has ``scale_features`` and ``scale_from``: a term
whose scale feature is not ``null`` is multiplied by ``max(scale_feature - scale_from, 0)``, so
its slope grows with another feature. TTFT's may (the training server's ``--baseline-kv-scale``;
``training_server.baseline_fit`` decides when): work queued behind a full KV cache waits for running
requests to finish and free it, not just for prefill compute, so each token ahead costs more once
the cache is nearly full (the terms ``prefill_work_tokens * kv_cache_percentage`` and
``prefill_work_tokens * max(kv_cache_percentage - 0.9, 0)``). Its own kind again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shared.errors import ArtifactError
from shared.features import FEATURE_NAMES

BASELINE_KIND = "linear"
# A baseline with ``upper`` bounds has its own kind, so a prediction server older than the bounds
# refuses it (and keeps serving the version it has) instead of reading the repeated terms as a sum.
PIECEWISE_KIND = "piecewise-linear"
# A baseline whose terms may be scaled by another feature has its own kind, for the same reason.
SCALED_KIND = "scaled-piecewise-linear"
_BOUNDED = (PIECEWISE_KIND, SCALED_KIND)
_INDEX = {name: j for j, name in enumerate(FEATURE_NAMES)}

# The work ahead of a request, per model: what a quantile regression with non-negative slopes
# is fitted on. TTFT waits for the prefill queued and in flight ahead of it, plus its own
# uncached prompt; TPOT slows with the decode work sharing the batch and prefill interleaved with it.
WORK_FEATURES: dict[str, tuple[str, ...]] = {
    "ttft": ("num_request_waiting", "prefill_tokens_in_flight", "uncached_input_tokens", "queue_depth"),
    "tpot": ("num_request_running", "decode_tokens_in_flight", "prefill_tokens_in_flight"),
}


def check_baseline(baseline: dict[str, Any]) -> None:
    """Raise ``ArtifactError`` unless ``baseline`` is a usable description (see the module docstring)."""
    try:
        names = list(baseline["features"])
        coefficients = [float(c) for c in baseline["coefficients"]]
        intercept = float(baseline["intercept"])
        kind = baseline["kind"]
        upper = [float(u) for u in baseline.get("upper", coefficients)]
        scale_names = list(baseline.get("scale_features", [None] * len(names)))
        scale_from = [float(v) for v in baseline.get("scale_from", [0.0] * len(names))]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ArtifactError(f"unreadable baseline: {exc!r}") from exc
    if kind not in (BASELINE_KIND, *_BOUNDED):
        raise ArtifactError(f"unknown baseline kind {kind!r}")
    if (kind in _BOUNDED) != ("upper" in baseline):
        raise ArtifactError(f"a {kind!r} baseline {'needs' if kind in _BOUNDED else 'has no'} upper bounds")
    scales = {"scale_features", "scale_from"} & baseline.keys()
    if (kind == SCALED_KIND) != bool(scales) or len(scales) == 1:
        need = "needs" if kind == SCALED_KIND else "has no"
        raise ArtifactError(f"a {kind!r} baseline {need} scale_features and scale_from")
    unknown = [name for name in names if name not in _INDEX]
    unknown += [name for name in scale_names if name is not None and name not in _INDEX]
    if unknown or not len(names) == len(coefficients) == len(upper) == len(scale_names) == len(scale_from):
        raise ArtifactError(
            f"baseline features {names} do not match the feature schema, coefficients, upper bounds or scales"
        )
    if not np.isfinite([intercept, *coefficients, *upper, *scale_from]).all():
        raise ArtifactError("baseline coefficients, upper bounds or scale offsets are not finite")


def baseline_ms(features: np.ndarray, baseline: dict[str, Any]) -> np.ndarray:
    """The baseline latency (ms, float64, >= 0) of each row of a ``build_features`` matrix.

    On the prediction hot path: the description is turned into arrays once per baseline object.
    Summed term by term, element-wise, in a fixed order (not a BLAS dot product, whose rounding
    depends on the matrix's shape): ``((intercept + x0 c0) + x1 c1) + ...`` in float64, by one
    ``np.add.accumulate`` along each row (sequential by definition), so a row gets the same bits
    alone or in any batch, and a caller's prediction does not depend on whom the coalescer
    batched it with.
    With ``upper``, each feature is first capped at its bound (in float32, exact); with scales, a
    scaled term is ``(capped * max(scale - scale_from, 0)) * coefficient`` in float64 (an unscaled
    one is multiplied by exactly 1.0).
    """
    _, columns, coefficients, intercept, upper, scaling = _compiled(baseline)
    terms = np.empty((len(features), len(columns) + 1), dtype=np.float64)
    terms[:, 0] = intercept
    work = features[:, columns] if upper is None else np.minimum(features[:, columns], upper)
    if scaling is None:
        np.multiply(work, coefficients, out=terms[:, 1:])  # float32 -> float64, exact
    else:
        scale_columns, scale_from, unscaled = scaling
        scale = np.maximum(features[:, scale_columns].astype(np.float64) - scale_from, 0.0)
        scale[:, unscaled] = 1.0
        np.multiply(work, scale, out=terms[:, 1:])
        terms[:, 1:] *= coefficients
    values = np.add.accumulate(terms, axis=1)[:, -1]
    return np.maximum(values, 0.0)


_Scaling = tuple[np.ndarray, np.ndarray, np.ndarray]  # scale columns, scale_from, unscaled terms
_Compiled = tuple[dict[str, Any], np.ndarray, np.ndarray, float, np.ndarray | None, _Scaling | None]
_COMPILED: dict[int, _Compiled] = {}


def _compiled(baseline: dict[str, Any]) -> _Compiled:
    entry = _COMPILED.get(id(baseline))
    if entry is None or entry[0] is not baseline:  # ids are reused once an object is gone
        if len(_COMPILED) > 64:
            _COMPILED.clear()
        columns = np.array([_INDEX[name] for name in baseline["features"]], dtype=np.intp)
        coefficients = np.asarray(baseline["coefficients"], dtype=np.float64)
        bounds = baseline.get("upper")
        upper = None if bounds is None else np.asarray(bounds, dtype=np.float32)
        scaling = None
        if "scale_features" in baseline:
            names = baseline["scale_features"]
            scaling = (
                np.array([0 if name is None else _INDEX[name] for name in names], dtype=np.intp),
                np.asarray(baseline["scale_from"], dtype=np.float64),
                np.array([name is None for name in names], dtype=bool),
            )
        entry = _COMPILED[id(baseline)] = (
            baseline,
            columns,
            coefficients,
            float(baseline["intercept"]),
            upper,
            scaling,
        )
    return entry
