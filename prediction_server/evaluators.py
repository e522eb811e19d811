"""How the trees of a model are evaluated on the hot path, one thread per process.

``compile_forest(booster)`` is the one place that chooses the evaluator of a loaded model.
Every evaluator returns XGBoost's own float32 margins. A compiled evaluator is trusted only
after it reproduced ``Booster.inplace_predict`` on the probe matrix; otherwise XGBoost serves.

XGBoost's ``inplace_predict`` has a fixed cost per call (~300 µs: ~150 µs of Python argument
handling, the rest in C++) that dwarfs the tree walk of the 5-100 rows of a scheduler's call,
while a vectorised numpy walk (``trees.CompiledForest``) costs little per call but more per
row. ``AdaptiveForest`` therefore sends small batches to the compiled form and large ones to
XGBoost's C predictor called directly, at a crossover measured for each model when it is
loaded (it depends on the number and depth of the trees). All give the same margins, so the
choice only affects speed.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import time
from functools import cache
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from prediction_server.trees import CompiledForest
from shared.errors import ArtifactError
from shared.features import NUM_FEATURES
from shared.logging import log_event

log = logging.getLogger(__name__)

# Bounds of the measured crossover (rows): below the lower one the compiled walk always wins,
# and the upper one is the bulk row limit.
MIN_CROSSOVER_ROWS = 16
MAX_CROSSOVER_ROWS = 10_000
_CALIBRATION_ROWS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
_CALIBRATION_REPEATS = 5


class Forest(Protocol):
    """Anything that turns a float32 ``(n, NUM_FEATURES)`` matrix into float32 XGBoost margins."""

    def predict_margin(self, features: np.ndarray) -> np.ndarray: ...


def evaluator_name(forest: Forest) -> str:
    """A short description of an evaluator, for /status and logs."""
    return str(getattr(forest, "name", type(forest).__name__))


@cache
def import_xgboost() -> ModuleType:
    """Import xgboost for serving, without its optional scikit-learn integration.

    When scikit-learn is installed, ``import xgboost`` imports it eagerly to define the sklearn
    estimator classes, and scikit-learn drags pandas and most of scipy into the process: about a
    second of start-up and ~100 MB per worker, none of it used to serve predictions. A ``None``
    entry in ``sys.modules`` makes that optional import fail the way a missing package does, and
    xgboost falls back to its dummy base classes. The entry is removed right after, so a later
    explicit ``import sklearn`` still works.
    """
    if "xgboost" in sys.modules or "sklearn" in sys.modules:
        import xgboost

        return xgboost
    sys.modules["sklearn"] = None  # type: ignore[assignment]
    try:
        import xgboost
    finally:
        if sys.modules.get("sklearn", 0) is None:
            del sys.modules["sklearn"]
    return xgboost


def load_booster(raw: bytes, what: str) -> Any:
    """Load a native XGBoost model (UBJSON or JSON bytes), pinned to one thread."""
    xgb = import_xgboost()
    try:
        booster = xgb.Booster(model_file=bytearray(raw))
    except xgb.core.XGBoostError as exc:
        raise ArtifactError(f"{what}: not a loadable XGBoost model: {str(exc).splitlines()[0]}") from exc
    booster.set_param({"nthread": 1})
    if booster.num_features() != NUM_FEATURES:
        raise ArtifactError(f"{what}: model expects {booster.num_features()} features, not {NUM_FEATURES}")
    return booster


class BoosterForest:
    """XGBoost's own single-threaded in-place prediction."""

    name = "xgboost"

    def __init__(self, booster: Any) -> None:
        self._booster = booster

    def predict_margin(self, features: np.ndarray) -> np.ndarray:
        return np.asarray(self._booster.inplace_predict(features, predict_type="margin"), dtype=np.float32)


class NativeBoosterForest:
    """XGBoost's C predictor (``XGBoosterPredictFromDense``) called directly.

    The same computation as ``Booster.inplace_predict``, minus ~150 µs per call of Python-side
    argument inspection and JSON building: the configuration is encoded once, the array
    interface per call.
    """

    name = "xgboost-c"
    _CONFIG = (
        b'{"type": 1, "training": false, "iteration_begin": 0, "iteration_end": 0, '
        b'"missing": NaN, "strict_shape": false, "cache_id": 0}'
    )

    def __init__(self, booster: Any) -> None:
        self._booster = booster  # owns the handle
        self._lib = import_xgboost().core._LIB
        self._no_proxy = ctypes.c_void_p()

    def predict_margin(self, features: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(features, dtype=np.float32)
        rows, columns = x.shape
        interface = (
            b'{"data": [%d, true], "shape": [%d, %d], "strides": null, "typestr": "<f4", "version": 3}'
            % (
                x.ctypes.data,
                rows,
                columns,
            )
        )
        shape = ctypes.POINTER(ctypes.c_uint64)()
        dims = ctypes.c_uint64()
        out = ctypes.POINTER(ctypes.c_float)()
        status = self._lib.XGBoosterPredictFromDense(
            self._booster.handle,
            interface,
            self._CONFIG,
            self._no_proxy,
            ctypes.byref(shape),
            ctypes.byref(dims),
            ctypes.byref(out),
        )
        if status != 0:
            raise RuntimeError(f"XGBoosterPredictFromDense: {self._lib.XGBGetLastError()!r}")
        if dims.value != 1 or shape[0] != rows:
            raise RuntimeError(f"XGBoosterPredictFromDense: unexpected output of {dims.value} dimensions")
        # The buffer belongs to the booster and is reused by its next call: copy it out.
        return np.ctypeslib.as_array(out, shape=(rows,)).copy()


class AdaptiveForest:
    """``small`` for batches up to ``max_small_rows`` rows, ``large`` above."""

    def __init__(self, small: Forest, large: Forest, max_small_rows: int) -> None:
        self._small = small
        self._large = large
        self.max_small_rows = max_small_rows
        self.name = f"{evaluator_name(small)}<={max_small_rows}<{evaluator_name(large)}"

    def predict_margin(self, features: np.ndarray) -> np.ndarray:
        if len(features) <= self.max_small_rows:
            return self._small.predict_margin(features)
        return self._large.predict_margin(features)


def compile_forest(booster: Any, probe: np.ndarray, what: str) -> Forest:
    """The evaluator used to serve ``booster``'s trees (the one place that chooses it).

    Candidates must reproduce ``Booster.inplace_predict`` on ``probe`` (a feature matrix
    covering the input ranges) to be used; XGBoost's public API is the fallback for everything.
    """
    reference = BoosterForest(booster)
    expected = reference.predict_margin(probe)
    large = verified(_candidate(NativeBoosterForest, booster, what), expected, probe, what) or reference
    small = verified(_candidate(CompiledForest.from_booster, booster, what), expected, probe, what)
    if small is None:
        return large
    return AdaptiveForest(small, large, crossover_rows(small, large, probe))


def verified(candidate: Forest | None, expected: np.ndarray, probe: np.ndarray, what: str) -> Forest | None:
    """``candidate`` if its margins on ``probe`` equal ``expected`` (XGBoost's), else ``None``."""
    if candidate is None:
        return None
    try:
        got = candidate.predict_margin(probe)
    except Exception as exc:
        log_event(
            log,
            "evaluator_failed",
            logging.WARNING,
            model=what,
            evaluator=evaluator_name(candidate),
            error=repr(exc),
        )
        return None
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-6, atol=1e-6):
        worst = float(np.max(np.abs(got - expected))) if got.shape == expected.shape else None
        log_event(
            log,
            "evaluator_mismatch",
            logging.WARNING,
            model=what,
            evaluator=evaluator_name(candidate),
            max_abs_diff=worst,
        )
        return None
    return candidate


def _candidate(build: Any, booster: Any, what: str) -> Forest | None:
    try:
        forest: Forest = build(booster)
    except (ValueError, AttributeError, OSError) as exc:  # e.g. a model form it does not support
        log_event(
            log, "evaluator_unsupported", logging.INFO, model=what, builder=repr(build), reason=str(exc)
        )
        return None
    return forest


def crossover_rows(small: Forest, large: Forest, probe: np.ndarray) -> int:
    """The largest batch for which ``small`` is faster than ``large``, measured.

    Batch sizes double from ``MIN_CROSSOVER_ROWS`` until ``small`` loses; the crossover is
    interpolated between the last win and the first loss (costs are not linear in rows, so a fit
    from two sizes would misplace it).
    """
    last_win: tuple[int, float] | None = None
    for n in _CALIBRATION_ROWS:
        matrix = _rows(probe, n)
        lead_s = _best_time_s(small, matrix) - _best_time_s(large, matrix)  # < 0: small wins
        if lead_s >= 0:
            if last_win is None:
                return MIN_CROSSOVER_ROWS
            n0, lead0 = last_win
            return int(n0 + (n - n0) * -lead0 / (lead_s - lead0))
        last_win = (n, lead_s)
    return MAX_CROSSOVER_ROWS


def _rows(probe: np.ndarray, n: int) -> np.ndarray:
    return np.ascontiguousarray(np.resize(probe, (n, probe.shape[1])))


def _best_time_s(forest: Forest, matrix: np.ndarray) -> float:
    # The minimum of a few repeats: noise (other threads, other processes) only adds time.
    best = float("inf")
    for _ in range(_CALIBRATION_REPEATS):
        started = time.perf_counter()
        forest.predict_margin(matrix)
        best = min(best, time.perf_counter() - started)
    return best
