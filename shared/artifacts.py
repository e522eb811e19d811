"""Model artifacts: the manifest of a model set, each model's spec, and how a served prediction is
made from a model's margin.

A version of the model store (``shared.model_store``) holds a manifest (``Manifest``: version,
created time, feature-schema version, objective and quantile, training sample counts, evaluation
metrics, and per model a ``ModelSpec`` with its file name, size and SHA-256) and the models in
XGBoost's native UBJSON format, verified by SHA-256 before they are loaded
(``verify_model_set``). No pickle anywhere. ``served_latency_ms`` is the one place where a
model's margin becomes the latency a client is served: the baseline, the calibration offset and
the online regime offsets, inverse-transformed (the prediction server's fused kernel repeats it in
compiled form, checked bit for bit against it).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
import orjson

from shared.baseline import baseline_ms, check_baseline
from shared.errors import ArtifactError, CorruptArtifact
from shared.features import FEATURE_NAMES, FEATURE_VERSION
from shared.regimes import RegimeOffsets

MODEL_NAMES: tuple[str, ...] = ("ttft", "tpot")
# The names the llm-d operator API lists (wire-contract 5); we serve no gated models, so the
# gated ones are always listed as absent.
LISTED_MODEL_NAMES: tuple[str, ...] = (*MODEL_NAMES, *(f"{name}_gated" for name in MODEL_NAMES))
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1
VERSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""What a version (or file) name may look like: no path separators, no NUL, no leading dot."""

TargetTransform = Literal["log1p", "identity"]
Objective = Literal["quantile", "mean"]
# "calibrated": the model files of the version before it (same bytes), new regime offsets.
Kind = Literal["prior", "trained", "calibrated"]


@dataclass(frozen=True)
class ModelSpec:
    """One model of a set: its file, checksum and how a raw margin becomes milliseconds."""

    file: str
    sha256: str
    size_bytes: int
    target_transform: TargetTransform = "log1p"
    # Added to the margin before the inverse transform; set by calibration so that the
    # measured coverage of held-out data matches the target quantile.
    calibration_offset: float = 0.0
    # The work-ahead baseline the trees were trained around (``shared.baseline``), or None:
    # the served margin is then the trees' margin alone (prior and older versions).
    baseline: dict[str, Any] | None = None
    # Per-regime corrections on top of calibration_offset, set by online calibration between
    # retrains (None: none). Carries its regime scheme so that every reader bins alike.
    regime_offsets: RegimeOffsets | None = None

    def __post_init__(self) -> None:
        if isinstance(self.regime_offsets, dict):  # as read from a manifest's JSON
            object.__setattr__(self, "regime_offsets", RegimeOffsets(**self.regime_offsets))


@dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to trust and use a model set."""

    version: str
    sequence: int
    kind: Kind
    created_at: str
    objective: Objective
    quantile: float
    models: dict[str, ModelSpec]
    feature_version: int = FEATURE_VERSION
    feature_names: tuple[str, ...] = FEATURE_NAMES
    training_samples: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    xgboost_version: str = ""
    format: int = MANIFEST_FORMAT

    def model_kind(self, name: str) -> Kind:
        """``"prior"`` if model ``name``'s trees are the prior's: in a prior version, or in a trained
        (or calibrated) one that carried them because that model had too few samples of its own
        yet (its ``metrics[name]["source"]`` is ``"prior"``; a scheduler that reports each TTFT at
        the first token trains TTFT well before TPOT). Otherwise the version's kind."""
        entry = self.metrics.get(name)
        if self.kind == "prior" or (isinstance(entry, dict) and entry.get("source") == "prior"):
            return "prior"
        return self.kind

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        """The one manifest parser: strict about what it needs (types, required fields, a valid
        version name), tolerant of fields it does not know (newer writers may add some), and of
        the ``{"manifest": {...}}`` envelope. Raises ``CorruptArtifact``."""
        try:
            data = orjson.loads(raw)
            if isinstance(data, dict) and isinstance(data.get("manifest"), dict):
                data = data["manifest"]
            if not isinstance(data, dict):
                raise TypeError("not a JSON object")
            data = {k: v for k, v in data.items() if k in _MANIFEST_FIELDS}
            data["models"] = {
                name: ModelSpec(**{k: v for k, v in spec.items() if k in _SPEC_FIELDS})
                for name, spec in data["models"].items()
            }
            data["feature_names"] = tuple(data["feature_names"])
            manifest = cls(**data)
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as exc:
            raise CorruptArtifact(f"unreadable manifest: {exc}") from exc
        if not isinstance(manifest.version, str) or not VERSION_NAME.match(manifest.version):
            raise CorruptArtifact(f"bad version name {manifest.version!r}")
        return manifest

    def check_compatible(self) -> None:
        """Refuse a set built for other features or with a missing model."""
        if self.feature_version != FEATURE_VERSION or tuple(self.feature_names) != FEATURE_NAMES:
            raise ArtifactError(
                f"version {self.version} uses feature schema {self.feature_version}, "
                f"this build uses {FEATURE_VERSION}"
            )
        missing = [name for name in MODEL_NAMES if name not in self.models]
        if missing:
            raise ArtifactError(f"version {self.version} lacks models {missing}")
        for name, spec in self.models.items():
            if spec.baseline is not None:
                try:
                    check_baseline(spec.baseline)
                except ArtifactError as exc:
                    raise ArtifactError(f"version {self.version} model {name}: {exc}") from exc


_MANIFEST_FIELDS = frozenset(Manifest.__dataclass_fields__)
_SPEC_FIELDS = frozenset(ModelSpec.__dataclass_fields__)


def served_latency_ms(tree_margin: np.ndarray, features: np.ndarray, spec: ModelSpec) -> np.ndarray:
    """The served latency (ms, float64, >= 0): the trees' raw margin (XGBoost, no base margin) plus
    the baseline's margin for these feature rows plus the calibration offset plus, when the spec
    has them, the online offset of each row's regime, inverse-transformed.

    The one place a margin becomes a served value: training, evaluation and serving all call it.
    The prediction server's fused kernel (``prediction_server.predictor.ServedPath``) repeats it in
    compiled form and serves a version only after reproducing this function's bits on probe rows.
    """
    margin = tree_margin.astype(np.float64) + spec.calibration_offset
    if spec.baseline is not None:
        margin += base_margin(features, spec)
    if spec.regime_offsets is not None:
        margin += spec.regime_offsets.for_rows(features)
    values = np.expm1(margin) if spec.target_transform == "log1p" else margin
    return np.maximum(values, 0.0)


def base_margin(features: np.ndarray, spec: ModelSpec) -> np.ndarray:
    """The margin the trees were trained around (XGBoost ``base_margin``): zeros without a baseline."""
    if spec.baseline is None:
        return np.zeros(len(features))
    return to_margin_target(baseline_ms(features, spec.baseline), spec.target_transform)


def to_margin_target(latency_ms: np.ndarray, transform: TargetTransform) -> np.ndarray:
    """The training target for a model whose margin ``served_latency_ms`` inverts."""
    return np.log1p(latency_ms) if transform == "log1p" else latency_ms


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def utc_now_iso() -> str:
    return datetime.now(UTC).isoformat()


@dataclass(frozen=True)
class ModelSet:
    """A verified manifest and the raw bytes of each model file."""

    manifest: Manifest
    files: dict[str, bytes]


def verify_model_set(manifest: Manifest, files: dict[str, bytes]) -> ModelSet:
    """Check compatibility, sizes and SHA-256 of every model; raise ``ArtifactError`` on any mismatch."""
    manifest.check_compatible()
    for name in MODEL_NAMES:
        spec = manifest.models[name]
        data = files.get(name)
        if data is None:
            raise CorruptArtifact(f"version {manifest.version}: file {spec.file} missing")
        if len(data) != spec.size_bytes or sha256_hex(data) != spec.sha256:
            raise CorruptArtifact(f"version {manifest.version}: checksum mismatch for {spec.file}")
    return ModelSet(manifest, files)
