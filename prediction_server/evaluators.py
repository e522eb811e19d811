"""How the trees of a model version are evaluated on the hot path, one thread per process.

``compile_forests(boosters, probe, what)`` is the one place that chooses the evaluator of a
loaded version (its TTFT and TPOT boosters together). Every evaluator returns XGBoost's own
float32 margins, and a candidate is trusted only after it reproduced ``Booster.inplace_predict``
on the probe matrix; otherwise the next one serves:

1. ``jit_forest.JitForests``: every model's trees in one numba-compiled pass, bit-identical to
   XGBoost, fastest at every batch size (bench/tree_eval.py). Needs numba; its machine code is
   cached on disk. Until a process has loaded it (``jit_forest.warm_kernel``, in the background
   after the process's first version is accepted) a version is served by ``WarmingForests``:
   XGBoost's C predictor, switched to the JIT once the kernel is loaded and checked.
2. Without numba (or for a model it does not support, e.g. deeper than ``jit_forest.MAX_DEPTH``),
   each model alone: the vectorised numpy walk (``trees.CompiledForest``) up to
   ``NUMPY_MAX_ROWS`` rows, XGBoost's C predictor called directly above, XGBoost's public API
   if neither reproduces it.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import orjson

from prediction_server.jit_forest import (
    JitForests,
    kernel_ready,
    numba_installed,
    warm_kernel,
    warm_served_kernel,
)
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

    @property
    def name(self) -> str: ...

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
    Each booster's JSON dump is taken once, here (the JIT and the numpy walk lay it out).
    """
    expected = [BoosterForest(booster).predict_margin(probe) for booster in boosters]
    models = _models(boosters)
    joint_what = "+".join(what)
    if jit and kernel_ready():
        joint = _jit_forests(models, expected, probe, joint_what)
        if joint is not None:
            return joint
    large = [_large_forest(b, e, probe, name) for b, e, name in zip(boosters, expected, what, strict=True)]
    if jit and not kernel_ready() and numba_installed():
        return WarmingForests(SeparateForests(large), models, expected, probe, what)
    return _fallback_forests(models, large, expected, probe, what)


def compile_forest(booster: Any, probe: np.ndarray, what: str, expected: np.ndarray | None = None) -> Forest:
    """One model's evaluator without the JIT: the numpy walk for small batches, XGBoost's C
    predictor for large ones, each only if it reproduces ``Booster.inplace_predict`` on ``probe``."""
    if expected is None:
        expected = BoosterForest(booster).predict_margin(probe)
    models = _models([booster])
    return _small_then_large(
        models[0] if models else None, _large_forest(booster, expected, probe, what), expected, probe, what
    )


def _large_forest(booster: Any, expected: np.ndarray, probe: np.ndarray, what: str) -> Forest:
    """XGBoost's C predictor called directly if it reproduces ``expected``, else its public API."""
    return verified(_candidate(NativeBoosterForest, booster, what), expected, probe, what) or BoosterForest(
        booster
    )


def _small_then_large(
    model: Any, large: Forest, expected: np.ndarray, probe: np.ndarray, what: str
) -> Forest:
    """The numpy walk of ``model`` (its JSON) up to ``NUMPY_MAX_ROWS`` rows, if it reproduces
    ``expected``, and ``large`` above; ``large`` alone otherwise."""
    small = None if model is None else _candidate(CompiledForest.from_model, model, what)
    small = verified(small, expected, probe, what)
    return large if small is None else AdaptiveForest(small, large, NUMPY_MAX_ROWS)


def _fallback_forests(
    models: list[Any] | None,
    large: Sequence[Forest],
    expected: Sequence[np.ndarray],
    probe: np.ndarray,
    what: Sequence[str],
) -> SeparateForests:
    """Each model alone: the numpy walk for small batches, ``large`` (its C predictor) above."""
    each = models if models is not None else [None] * len(large)
    return SeparateForests(
        [
            _small_then_large(m, lf, e, probe, name)
            for m, lf, e, name in zip(each, large, expected, what, strict=True)
        ]
    )


def _models(boosters: Sequence[Any]) -> list[Any] | None:
    """The boosters' JSON models (what the JIT and the numpy walk lay out), or ``None``."""
    try:
        return [orjson.loads(booster.save_raw("json")) for booster in boosters]
    except Exception as exc:  # an XGBoost error, whatever its kind: XGBoost's predictor serves
        log_event(log, "evaluator_unsupported", logging.INFO, evaluator="json-dump", reason=repr(exc))
        return None


def _jit_forests(
    models: list[Any] | None, expected: Sequence[np.ndarray], probe: np.ndarray, what: str
) -> JitForests | None:
    """The JIT evaluator of ``models`` if it supports them and reproduces ``expected`` exactly."""
    if models is None:
        return None
    joint = _candidate(JitForests.from_models, models, what)
    if joint is not None and _reproduces(joint, expected, probe, what):
        return joint
    return None


class WarmingForests:
    """A version served through XGBoost's C predictor until the JIT kernel is loaded, then
    through the JIT (or, if the JIT cannot serve it, through the numpy/XGBoost fallback).

    A process's first version would otherwise wait ~0.5-0.7 s for numba's import and the kernel's
    cache load (``jit_forest.warm_kernel``), or ~2 s to compile it on a new machine. Here that runs
    in a background thread after the version is accepted, from the JSON models taken on the load
    path (the thread never touches the boosters but to predict, which XGBoost allows from any
    thread); the thread lays the trees out, checks the new evaluator's margins on the probe matrix
    against XGBoost's (bit for bit for the JIT), and only then swaps it in: one reference
    assignment, read once per call. The C predictor is XGBoost's own computation, so answers do not
    move when the evaluator changes.
    """

    def __init__(
        self,
        interim: SeparateForests,
        models: list[Any] | None,
        expected: Sequence[np.ndarray],
        probe: np.ndarray,
        what: Sequence[str],
    ) -> None:
        self._active: Forests = interim
        self._done = threading.Event()
        threading.Thread(
            target=self._upgrade,
            args=(interim, models, expected, probe, what),
            name="jit-warm-up",
            daemon=True,
        ).start()

    @property
    def name(self) -> str:
        return self._active.name

    @property
    def active(self) -> Forests:
        """The evaluator serving now."""
        return self._active

    def margins(self, features: np.ndarray) -> tuple[np.ndarray, ...]:
        return self._active.margins(features)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Whether the switch has been made (to whichever evaluator) within ``timeout_s``."""
        return self._done.wait(timeout_s)

    def _upgrade(
        self,
        interim: SeparateForests,
        models: list[Any] | None,
        expected: Sequence[np.ndarray],
        probe: np.ndarray,
        what: Sequence[str],
    ) -> None:
        started = time.perf_counter()
        joint_what = "+".join(what)
        joint = None
        try:
            joint = _jit_forests(models, expected, probe, joint_what) if warm_kernel() else None
            self._active = joint or _fallback_forests(models, interim.forests, expected, probe, what)
            log_event(
                log,
                "evaluator_switched",
                model=joint_what,
                evaluator=self._active.name,
                after_s=round(time.perf_counter() - started, 3),
            )
        except Exception as exc:  # never let the thread die silently: the C predictor goes on serving
            log_event(log, "jit_warm_up_failed", logging.WARNING, model=joint_what, error=repr(exc))
        finally:
            self._done.set()
        if joint is not None:  # then the served kernel (predictor.ServedPath), while the JIT serves
            try:
                warm_served_kernel()
            except Exception as exc:  # the trees' JIT and the reference path go on serving
                log_event(log, "served_kernel_warm_up_failed", logging.WARNING, error=repr(exc))


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
