"""How the trees of a model version are evaluated on the hot path, one thread per process.

``compile_forests(boosters, probe, what)`` is the one place that chooses the evaluator of a
loaded version (its TTFT and TPOT boosters together). Every evaluator returns XGBoost's own
float32 margins, and a candidate is trusted only after it reproduced ``Booster.inplace_predict``
on the probe matrix; otherwise the next one serves:

1. ``jit_forest.JitForests``: every model's trees in one numba-compiled pass, bit-identical to
   XGBoost, fastest at every batch size (bench/tree_eval.py). Needs numba; its machine code is
   cached on disk, and the probe check compiles or loads it before the version is served.
2. Without numba (or for a model it does not support, e.g. deeper than ``jit_forest.MAX_DEPTH``),
   each model alone: the vectorised numpy walk (``trees.CompiledForest``) up to
   ``NUMPY_MAX_ROWS`` rows, XGBoost's C predictor called directly above, XGBoost's public API
   if neither reproduces it.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from prediction_server.jit_forest import JitForests, jit_available
from prediction_server.trees import CompiledForest
from shared.errors import ArtifactError
from shared.features import NUM_FEATURES
from shared.logging import log_event
from shared.xgboost_import import import_xgboost

log = logging.getLogger(__name__)

# Batches up to this many rows go to the numpy walk, larger ones to XGBoost's C predictor, when
# the JIT evaluator is unavailable. A constant: the per-model measurement this replaces found
# 104-142 rows for the same 150-200-tree, depth-6 models from one load to the next (noise), and
# the two cost about the same over that range.
NUMPY_MAX_ROWS = 112


class Forest(Protocol):
    """Anything that turns a float32 ``(n, NUM_FEATURES)`` matrix into one model's float32 margins."""

    def predict_margin(self, features: np.ndarray) -> np.ndarray: ...


class Forests(Protocol):
    """A version's models together: one float32 margin array per model, in the boosters' order."""

    name: str

    def margins(self, features: np.ndarray) -> tuple[np.ndarray, ...]: ...


def evaluator_name(forest: Forest) -> str:
    """A short description of an evaluator, for /status and logs."""
    return str(getattr(forest, "name", type(forest).__name__))


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


class SeparateForests:
    """One evaluator per model, called one after the other."""

    def __init__(self, forests: Sequence[Forest]) -> None:
        self.forests = tuple(forests)
        self.name = "+".join(sorted({evaluator_name(forest) for forest in self.forests}))

    def margins(self, features: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(forest.predict_margin(features) for forest in self.forests)


def compile_forests(
    boosters: Sequence[Any], probe: np.ndarray, what: Sequence[str], *, jit: bool = True
) -> Forests:
    """The evaluator used to serve a version's ``boosters`` (the one place that chooses it).

    ``what`` names each booster for logs. ``jit=False`` skips the JIT evaluator (tests of the
    fallback). Every candidate must reproduce ``Booster.inplace_predict`` on ``probe`` (a feature
    matrix covering the input ranges); XGBoost's public API is the fallback for everything.
    """
    expected = [BoosterForest(booster).predict_margin(probe) for booster in boosters]
    if jit and jit_available():
        joint = _candidate(JitForests.from_boosters, boosters, "+".join(what))
        if joint is not None and _reproduces(joint, expected, probe, "+".join(what)):
            return joint
    return SeparateForests(
        [compile_forest(b, probe, name, e) for b, name, e in zip(boosters, what, expected, strict=True)]
    )


def compile_forest(booster: Any, probe: np.ndarray, what: str, expected: np.ndarray | None = None) -> Forest:
    """One model's evaluator without the JIT: the numpy walk for small batches, XGBoost's C
    predictor for large ones, each only if it reproduces ``Booster.inplace_predict`` on ``probe``."""
    reference = BoosterForest(booster)
    if expected is None:
        expected = reference.predict_margin(probe)
    large = verified(_candidate(NativeBoosterForest, booster, what), expected, probe, what) or reference
    small = verified(_candidate(CompiledForest.from_booster, booster, what), expected, probe, what)
    if small is None:
        return large
    return AdaptiveForest(small, large, NUMPY_MAX_ROWS)


def verified(candidate: Forest | None, expected: np.ndarray, probe: np.ndarray, what: str) -> Forest | None:
    """``candidate`` if its margins on ``probe`` equal ``expected`` (XGBoost's), else ``None``."""
    if candidate is None:
        return None
    ok = _reproduces(_Single(candidate), [expected], probe, what, name=evaluator_name(candidate), exact=False)
    return candidate if ok else None


class _Single:
    def __init__(self, forest: Forest) -> None:
        self._forest = forest

    def margins(self, features: np.ndarray) -> tuple[np.ndarray, ...]:
        return (self._forest.predict_margin(features),)


def _reproduces(
    candidate: Any,
    expected: Sequence[np.ndarray],
    probe: np.ndarray,
    what: str,
    *,
    name: str | None = None,
    exact: bool = True,
) -> bool:
    """Whether ``candidate.margins(probe)`` equals ``expected``: bit for bit when ``exact`` (the
    JIT evaluator's promise), else within 1e-6 (the numpy walk's documented tolerance)."""
    name = name or str(getattr(candidate, "name", type(candidate).__name__))
    try:
        got = candidate.margins(probe)
    except Exception as exc:  # a compile or load failure of the evaluator, whatever its kind
        log_event(log, "evaluator_failed", logging.WARNING, model=what, evaluator=name, error=repr(exc))
        return False
    same = len(got) == len(expected) and all(
        g.shape == e.shape and (np.array_equal(g, e) if exact else np.allclose(g, e, rtol=1e-6, atol=1e-6))
        for g, e in zip(got, expected, strict=False)
    )
    if not same:
        worst = [
            float(np.max(np.abs(g - e))) if g.shape == e.shape else None
            for g, e in zip(got, expected, strict=False)
        ]
        log_event(log, "evaluator_mismatch", logging.WARNING, model=what, evaluator=name, max_abs_diff=worst)
    return same


def _candidate(build: Callable[[Any], Any], source: Any, what: str) -> Any:
    try:
        return build(source)
    except (ValueError, AttributeError, OSError) as exc:  # e.g. a model form it does not support
        log_event(
            log, "evaluator_unsupported", logging.INFO, model=what, builder=repr(build), reason=str(exc)
        )
        return None
