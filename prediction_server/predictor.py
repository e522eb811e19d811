"""An immutable, self-tested model version: feature matrix in, TTFT/TPOT milliseconds out.

A ``Predictor`` is built once per model version (off the event loop) from a verified
``shared.artifacts.ModelSet`` and then only read, so swapping versions is one reference
assignment and a request never sees a half-loaded model. Before a version is accepted
it must answer a fixed probe matrix with finite, non-negative latencies.

Tree evaluation sits behind ``Forest`` so the evaluator can change without touching callers:
``compile_forest`` is the single place that chooses it.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from shared.artifacts import (
    MODEL_NAMES,
    Manifest,
    ModelSet,
    ModelSpec,
    sha256_hex,
    to_latency_ms,
    utc_now_iso,
    verify_model_set,
)
from shared.errors import ArtifactError
from shared.features import NUM_FEATURES, build_features
from shared.logging import log_event
from shared.prior import build_prior_models, synthetic_columns

log = logging.getLogger(__name__)

BUILTIN_PRIOR_VERSION = "builtin-prior"
MODEL_TYPE = "xgboost"
PROBE_SEED = 7
PROBE_ROWS = 256


class SelfTestFailed(ArtifactError):
    """A version loaded but answered the probe matrix with unusable latencies."""


class Forest(Protocol):
    """Anything that turns a float32 ``(n, NUM_FEATURES)`` matrix into float32 XGBoost margins."""

    def predict_margin(self, features: np.ndarray) -> np.ndarray: ...


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


class BoosterForest:
    """XGBoost's own single-threaded in-place prediction."""

    name = "xgboost"

    def __init__(self, booster: Any) -> None:
        self._booster = booster

    def predict_margin(self, features: np.ndarray) -> np.ndarray:
        return np.asarray(self._booster.inplace_predict(features, predict_type="margin"), dtype=np.float32)


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


def compile_forest(booster: Any) -> Forest:
    """The evaluator used to serve ``booster``'s trees (the one place that chooses it)."""
    return BoosterForest(booster)


@cache
def probe_matrix() -> np.ndarray:
    """A fixed feature matrix covering the input ranges, plus all-zero and large-value rows."""
    columns = synthetic_columns(PROBE_ROWS, np.random.default_rng(PROBE_SEED))
    columns["encoder_input_size"][:8] = 4096.0
    columns["encoder_matched_size"][:4] = 1024.0
    for name, column in columns.items():
        column[-2] = 0.0
        column[-1] = 1.0 if name in ("kv_cache_percentage", "prefix_cache_score") else 1e6
    columns["pod_type"][-1] = 2.0
    matrix = build_features(columns)
    matrix.setflags(write=False)
    return matrix


@dataclass(frozen=True)
class Predictor:
    """One accepted model version; immutable after construction."""

    manifest: Manifest
    forests: dict[str, Forest]
    loaded_at: datetime
    evaluator: str
    # The fields every prediction of this version shares, built once.
    prediction_constants: dict[str, Any] = field(repr=False)

    @property
    def version(self) -> str:
        return self.manifest.version

    @property
    def kind(self) -> str:
        return self.manifest.kind

    @property
    def objective_type(self) -> str:
        return self.manifest.objective

    @property
    def quantile(self) -> float:
        return float(self.manifest.quantile)

    @property
    def last_model_load(self) -> str:
        return self.loaded_at.isoformat()

    def predict(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """TTFT and TPOT in milliseconds (float64, non-negative) for a float32 feature matrix."""
        specs = self.manifest.models
        ttft = to_latency_ms(self.forests["ttft"].predict_margin(features), specs["ttft"])
        tpot = to_latency_ms(self.forests["tpot"].predict_margin(features), specs["tpot"])
        return ttft, tpot

    @classmethod
    def from_model_set(cls, model_set: ModelSet) -> Predictor:
        """Load, compile and self-test a verified model set; raise ``ArtifactError`` if unusable."""
        manifest = model_set.manifest
        if manifest.objective not in ("quantile", "mean") or not 0.0 < float(manifest.quantile) < 1.0:
            raise ArtifactError(
                f"version {manifest.version}: bad objective {manifest.objective!r}/{manifest.quantile!r}"
            )
        forests: dict[str, Forest] = {}
        evaluators = set()
        for name in MODEL_NAMES:
            booster = load_booster(model_set.files[name], f"version {manifest.version} model {name}")
            forest = _checked_forest(booster, f"{manifest.version}/{name}")
            forests[name] = forest
            evaluators.add(getattr(forest, "name", type(forest).__name__))
        loaded_at = datetime.now(UTC)
        constants = {
            "model_type": MODEL_TYPE,
            "objective_type": manifest.objective,
            "quantile": float(manifest.quantile),
            "last_model_load": loaded_at.isoformat(),
            "model_version": manifest.version,
            "model_kind": manifest.kind,
        }
        predictor = cls(manifest, forests, loaded_at, "+".join(sorted(evaluators)), constants)
        predictor.self_test()
        return predictor

    def self_test(self) -> None:
        """Refuse a version whose answers on the probe matrix are not finite, non-negative latencies."""
        with np.errstate(all="ignore"):  # overflow is what we are checking for
            ttft, tpot = self.predict(probe_matrix())
        for name, values in (("ttft", ttft), ("tpot", tpot)):
            if values.shape != (PROBE_ROWS,) or not np.isfinite(values).all() or (values < 0).any():
                raise SelfTestFailed(
                    f"version {self.version}: self-test failed, {name} predictions are not finite "
                    "non-negative milliseconds"
                )


def _checked_forest(booster: Any, what: str) -> Forest:
    """``compile_forest(booster)``, unless it disagrees with XGBoost on the probe matrix."""
    forest = compile_forest(booster)
    if isinstance(forest, BoosterForest):
        return forest
    probe = probe_matrix()
    expected = BoosterForest(booster).predict_margin(probe)
    got = forest.predict_margin(probe)
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-5, atol=1e-5):
        worst = (
            float(np.max(np.abs(got.astype(np.float64) - expected))) if got.shape == expected.shape else None
        )
        log_event(log, "compiled_forest_mismatch", logging.WARNING, model=what, max_abs_diff=worst)
        return BoosterForest(booster)
    return forest


@cache
def builtin_prior_model_set(quantile: float) -> ModelSet:
    """The analytic prior of ``shared.prior``, fitted in-process, as a verified model set.

    Deterministic, so it is fitted once per process and quantile.
    """
    xgb = import_xgboost()  # first, so that build_prior_models' own import finds it loaded
    models, transforms = build_prior_models(quantile)
    manifest = Manifest(
        version=BUILTIN_PRIOR_VERSION,
        sequence=0,
        kind="prior",
        created_at=utc_now_iso(),
        objective="quantile",
        quantile=quantile,
        models={
            name: ModelSpec(
                file=f"{name}.ubj",
                sha256=sha256_hex(data),
                size_bytes=len(data),
                target_transform=transforms[name],
            )
            for name, data in models.items()
        },
        training_samples={"ttft": 0, "tpot": 0},
        metrics={"note": "built-in analytic prior; no samples seen yet"},
        xgboost_version=xgb.__version__,
    )
    return verify_model_set(manifest, models)
