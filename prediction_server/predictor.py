"""An immutable, self-tested model version: feature matrix in, TTFT/TPOT milliseconds out.

A ``Predictor`` is built once per model version (off the event loop) from a verified
``shared.artifacts.ModelSet`` and then only read, so swapping versions is one reference
assignment and a request never sees a half-loaded model. A calibration version (same model
files, new per-regime offsets) reuses the compiled trees of the version it recalibrates
(``recalibrated``), so it switches in a fraction of a millisecond instead of a recompile.
Before a version is accepted it must answer a fixed probe matrix with finite, non-negative latencies.

How the trees are evaluated is ``prediction_server.evaluators``' business.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import cache, cached_property
from typing import Any

import numpy as np

from prediction_server.evaluators import Forests, compile_forests, load_booster
from prediction_server.jit_forest import JitForests, served_kernel_ready, served_plan
from prediction_server.responses import encode_constants
from shared.artifacts import (
    MODEL_NAMES,
    Manifest,
    ModelSet,
    ModelSpec,
    served_latency_ms,
    sha256_hex,
    utc_now_iso,
    verify_model_set,
)
from shared.errors import ArtifactError
from shared.features import build_features
from shared.identity import MODEL_TYPE
from shared.logging import log_event
from shared.prior import build_prior_models, synthetic_columns
from shared.row_decoder import RowMatrix, from_columns, to_columns
from shared.xgboost_import import import_xgboost

log = logging.getLogger(__name__)

BUILTIN_PRIOR_VERSION = "builtin-prior"
PROBE_SEED = 7
PROBE_ROWS = 256


class SelfTestFailed(ArtifactError):
    """A version loaded but answered the probe matrix with unusable latencies."""


@cache
def probe_rows() -> RowMatrix:
    """Fixed rows covering the input ranges, plus all-zero and large-value rows."""
    columns = synthetic_columns(PROBE_ROWS, np.random.default_rng(PROBE_SEED))
    columns["encoder_input_size"][:8] = 4096.0
    columns["encoder_matched_size"][:4] = 1024.0
    for name, column in columns.items():
        column[-2] = 0.0
        column[-1] = 1.0 if name in ("kv_cache_percentage", "prefix_cache_score") else 1e6
    columns["pod_type"][-1] = 2.0
    return from_columns(columns)


# The probe rows ServedPath checks a version on: the first 24 (random, encoder caches) and the last
# 8 (edges), to keep the check of a calibration version near the cost of its self-test.
SERVED_PROBE = np.r_[0:24, PROBE_ROWS - 8 : PROBE_ROWS]


@cache
def served_probe() -> tuple[RowMatrix, np.ndarray]:
    """The ``SERVED_PROBE`` rows of ``probe_rows`` and their features."""
    rows = probe_rows()
    picked = SERVED_PROBE
    return RowMatrix(rows.numeric[picked], rows.codes[picked]), np.ascontiguousarray(probe_matrix()[picked])


@cache
def probe_matrix() -> np.ndarray:
    """The feature matrix of ``probe_rows``: what every version must answer before it serves."""
    matrix = build_features(to_columns(probe_rows()))
    matrix.setflags(write=False)
    return matrix


@dataclass(frozen=True)
class Predictor:
    """One accepted model version; immutable after construction."""

    manifest: Manifest
    # Every model's trees, evaluated together (MODEL_NAMES order); shared by recalibrated versions.
    forests: Forests
    loaded_at: datetime
    # The fields every prediction of this version shares, built once.
    prediction_constants: dict[str, Any] = field(repr=False)
    # The JIT's served kernel for this version, once checked (``predict_rows``).
    served: ServedPath = field(repr=False)

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
    def evaluator(self) -> str:
        """How the trees are evaluated now (a first version switches to the JIT once it is loaded)."""
        return self.forests.name

    @property
    def last_model_load(self) -> str:
        return self.loaded_at.isoformat()

    @cached_property
    def encoded_constants(self) -> bytes:
        """``prediction_constants`` as the end of a prediction's JSON (``responses.encode_constants``)."""
        return encode_constants(self.prediction_constants)

    def predict(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """TTFT and TPOT in milliseconds (float64, non-negative) for a float32 feature matrix."""
        specs = self.manifest.models
        ttft_margin, tpot_margin = self.forests.margins(features)
        ttft = served_latency_ms(ttft_margin, features, specs["ttft"])
        tpot = served_latency_ms(tpot_margin, features, specs["tpot"])
        return ttft, tpot

    def predict_rows(self, rows: RowMatrix) -> tuple[np.ndarray, np.ndarray]:
        """``predict(build_features(rows))``, bit for bit: through the JIT's served kernel once it
        reproduced that on the probe rows, else exactly so."""
        answer = self.served.predict(self.forests, rows)
        if answer is not None:
            return answer
        return self.predict(build_features(to_columns(rows)))

    def same_trees(self, manifest: Manifest) -> bool:
        """Whether ``manifest``'s model files are byte-identical (by SHA-256) to this version's."""
        mine = self.manifest.models
        return all(
            name in manifest.models and manifest.models[name].sha256 == mine[name].sha256
            for name in MODEL_NAMES
        )

    def recalibrated(self, model_set: ModelSet) -> Predictor:
        """A predictor for a verified version with the same trees: reuses the compiled forests,
        takes the new manifest's offsets, and self-tests."""
        manifest = model_set.manifest
        if not self.same_trees(manifest):
            raise ArtifactError(f"version {manifest.version} does not share the trees of {self.version}")
        loaded_at = datetime.now(UTC)
        constants = _constants(manifest, loaded_at)
        predictor = replace(
            self,
            manifest=manifest,
            loaded_at=loaded_at,
            prediction_constants=constants,
            served=ServedPath(manifest),
        )
        predictor.served.check(predictor.forests, predictor.self_test())
        return predictor

    @classmethod
    def from_model_set(cls, model_set: ModelSet) -> Predictor:
        """Load, compile and self-test a verified model set; raise ``ArtifactError`` if unusable."""
        manifest = model_set.manifest
        if manifest.objective not in ("quantile", "mean") or not 0.0 < float(manifest.quantile) < 1.0:
            raise ArtifactError(
                f"version {manifest.version}: bad objective {manifest.objective!r}/{manifest.quantile!r}"
            )
        boosters = [
            load_booster(model_set.files[name], f"version {manifest.version} model {name}")
            for name in MODEL_NAMES
        ]
        forests = compile_forests(
            boosters, probe_matrix(), [f"{manifest.version}/{name}" for name in MODEL_NAMES]
        )
        loaded_at = datetime.now(UTC)
        predictor = cls(manifest, forests, loaded_at, _constants(manifest, loaded_at), ServedPath(manifest))
        predictor.served.check(forests, predictor.self_test())
        return predictor

    def self_test(self) -> tuple[np.ndarray, np.ndarray]:
        """Refuse a version whose answers on the probe matrix are not finite, non-negative
        latencies; returns those answers (the reference the served kernel is checked against)."""
        with np.errstate(all="ignore"):  # overflow is what we are checking for
            ttft, tpot = self.predict(probe_matrix())
        for name, values in (("ttft", ttft), ("tpot", tpot)):
            if values.shape != (PROBE_ROWS,) or not np.isfinite(values).all() or (values < 0).any():
                raise SelfTestFailed(
                    f"version {self.version}: self-test failed, {name} predictions are not finite "
                    "non-negative milliseconds"
                )
        return ttft, tpot


@cache
def builtin_prior_model_set(quantile: float) -> ModelSet:
    """The analytic prior of ``shared.prior``, fitted in-process, as a verified model set.

    Deterministic, so it is fitted once per process and quantile.
    """
    xgb = import_xgboost()
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


def _constants(manifest: Manifest, loaded_at: datetime) -> dict[str, Any]:
    """The fields every prediction of this version carries besides its latencies."""
    return {
        "model_type": MODEL_TYPE,
        "objective_type": manifest.objective,
        "quantile": float(manifest.quantile),
        "last_model_load": loaded_at.isoformat(),
        "model_version": manifest.version,
        "model_kind": manifest.kind,
        "model_kinds": {name: manifest.model_kind(name) for name in MODEL_NAMES},
    }


class ServedPath:
    """One version's served values through the JIT's fused kernel (``JitForests.served_terms``:
    features, trees, calibration, baseline and regime offsets in one compiled pass), finished
    with numpy's ``log1p``/``expm1`` exactly as ``shared.artifacts.served_latency_ms`` does.

    Used only after it reproduced ``Predictor.predict`` bit for bit on the probe rows with the
    evaluator then serving (checked once per evaluator: a first version switches to the JIT
    while it serves); otherwise ``predict`` answers. Models with the same served form are
    finished together, one numpy call per step for both.
    """

    def __init__(self, manifest: Manifest) -> None:
        self._specs = [manifest.models[name] for name in MODEL_NAMES]
        self._plan = served_plan(self._specs)
        self._runs = _same_form_runs(self._specs)
        self._checked: tuple[Any, bool] | None = None  # (evaluator, reproduces)
        self._lock = threading.Lock()

    @property
    def reproduced(self) -> bool:
        """Whether the kernel reproduced the reference with the evaluator it was last checked with."""
        return self._checked is not None and self._checked[1]

    def predict(self, forests: Forests, rows: RowMatrix) -> tuple[np.ndarray, np.ndarray] | None:
        """Both models' served latencies for ``rows``, or ``None`` if this path cannot serve them."""
        evaluator: Any = getattr(forests, "active", forests)
        checked = self._checked
        if checked is None or checked[0] is not evaluator:
            if not served_kernel_ready():  # not compiled yet: never compile on the hot path
                return None
            checked = self._check(forests, evaluator)
        if not checked[1]:
            return None
        return self._finish(evaluator.served_terms(rows.numeric, rows.codes, self._plan)[1:])

    def check(self, forests: Forests, reference: Sequence[np.ndarray] | None = None) -> bool:
        """Check the kernel with the evaluator serving now; done when a version is loaded (off the
        event loop, against the self-test's answers on the probe matrix, ``reference``), else by
        the first call after the evaluator changed or the kernel was loaded."""
        if not served_kernel_ready():
            return False
        return self._check(forests, getattr(forests, "active", forests), reference)[1]

    def _check(
        self, forests: Forests, evaluator: Any, reference: Sequence[np.ndarray] | None = None
    ) -> tuple[Any, bool]:
        with self._lock:
            ok = isinstance(evaluator, JitForests) and self._reproduces(forests, evaluator, reference)
            self._checked = (evaluator, ok)
            return self._checked

    def _reproduces(
        self, forests: Forests, evaluator: JitForests, reference: Sequence[np.ndarray] | None
    ) -> bool:
        rows, matrix = served_probe()
        try:
            features, *terms = evaluator.served_terms(*rows, self._plan)
        except ValueError:  # e.g. trees over other features
            return False
        with np.errstate(all="ignore"):
            if reference is None:
                expected = _served_values(forests, matrix, self._specs)
            else:
                expected = [values[SERVED_PROBE] for values in reference]
            got = self._finish(terms)
        ok = np.array_equal(features, matrix) and _same_bits(got, expected)
        if not ok:
            log_event(log, "served_kernel_mismatch", logging.WARNING, evaluator=evaluator.name)
        return ok

    def _finish(self, terms: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        margins, baselines, regimes = terms
        for run, (has_baseline, log1p, has_regimes) in self._runs:
            margin = margins[run]
            if has_baseline:
                margin += np.log1p(baselines[run]) if log1p else baselines[run]
            if has_regimes:
                margin += regimes[run]
            if log1p:
                np.expm1(margin, out=margin)
            np.maximum(margin, 0.0, out=margin)
        ttft, tpot = margins
        return ttft, tpot


def _served_values(forests: Forests, features: np.ndarray, specs: Sequence[ModelSpec]) -> list[np.ndarray]:
    return [
        served_latency_ms(margin, features, spec)
        for margin, spec in zip(forests.margins(features), specs, strict=True)
    ]


def _same_bits(got: Sequence[np.ndarray], expected: Sequence[np.ndarray]) -> bool:
    return all(
        g.shape == e.shape and np.array_equal(g.view(np.uint64), e.view(np.uint64))
        for g, e in zip(got, expected, strict=True)
    )


def _same_form_runs(specs: Sequence[ModelSpec]) -> list[tuple[slice, tuple[bool, bool, bool]]]:
    """Consecutive models with the same served form (baseline, log1p, regime offsets), as slices."""
    runs: list[tuple[slice, tuple[bool, bool, bool]]] = []
    for k, spec in enumerate(specs):
        form = (spec.baseline is not None, spec.target_transform == "log1p", spec.regime_offsets is not None)
        if runs and runs[-1][1] == form:
            runs[-1] = (slice(runs[-1][0].start, k + 1), form)
        else:
            runs.append((slice(k, k + 1), form))
    return runs
