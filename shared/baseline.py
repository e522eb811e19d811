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
``training_server.baseline_fit`` decides when). Its own kind makes a prediction server that
predates it refuse the version rather than misread it.
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
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ArtifactError(f"unreadable baseline: {exc!r}") from exc
    if kind not in (BASELINE_KIND, PIECEWISE_KIND):
        raise ArtifactError(f"unknown baseline kind {kind!r}")
    if (kind == PIECEWISE_KIND) != ("upper" in baseline):
        raise ArtifactError(
            f"a {kind!r} baseline {'needs' if kind == PIECEWISE_KIND else 'has no'} upper bounds"
        )
    unknown = [name for name in names if name not in _INDEX]
    if unknown or len(names) != len(coefficients) or len(upper) != len(coefficients):
        raise ArtifactError(
            f"baseline features {names} do not match the feature schema, coefficients or upper bounds"
        )
    if not np.isfinite([intercept, *coefficients, *upper]).all():
        raise ArtifactError("baseline coefficients or upper bounds are not finite")


def baseline_ms(features: np.ndarray, baseline: dict[str, Any]) -> np.ndarray:
    """The baseline latency (ms, float64, >= 0) of each row of a ``build_features`` matrix.

    On the prediction hot path: the description is turned into arrays once per baseline object.
    Summed term by term, element-wise, in a fixed order (not a BLAS dot product, whose rounding
    depends on the matrix's shape): ``((intercept + x0 c0) + x1 c1) + ...`` in float64, by one
    ``np.add.accumulate`` along each row (sequential by definition), so a row gets the same bits
    alone or in any batch, and a caller's prediction does not depend on whom the coalescer
    batched it with.
    With ``upper``, each feature is first capped at its bound (in float32, exact).
    """
    _, columns, coefficients, intercept, upper = _compiled(baseline)
    terms = np.empty((len(features), len(columns) + 1), dtype=np.float64)
    terms[:, 0] = intercept
    work = features[:, columns] if upper is None else np.minimum(features[:, columns], upper)
    np.multiply(work, coefficients, out=terms[:, 1:])  # float32 -> float64, exact
    values = np.add.accumulate(terms, axis=1)[:, -1]
    return np.maximum(values, 0.0)


_Compiled = tuple[dict[str, Any], np.ndarray, np.ndarray, float, np.ndarray | None]
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
        entry = _COMPILED[id(baseline)] = (
            baseline,
            columns,
            coefficients,
            float(baseline["intercept"]),
            upper,
        )
    return entry
