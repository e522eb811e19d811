"""Model artifacts and the model store.

A store is a directory of immutable, versioned model sets::

    <root>/versions/000007-trained/{manifest.json, ttft.ubj, tpot.ubj}
    <root>/CURRENT            # the name of the current version, switched atomically

A version directory appears by ``rename`` of a fully written and fsynced staging
directory, and ``CURRENT`` is replaced by write + fsync + rename, so a reader never
sees a half-written version. Models are XGBoost's native UBJSON format, verified by
SHA-256 from the manifest before they are loaded. No pickle anywhere.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson

from shared.baseline import baseline_ms, check_baseline
from shared.errors import ArtifactError
from shared.features import FEATURE_NAMES, FEATURE_VERSION

MODEL_NAMES: tuple[str, ...] = ("ttft", "tpot")
# The names the llm-d operator API lists (wire-contract 5); we serve no gated models, so the
# gated ones are always listed as absent.
LISTED_MODEL_NAMES: tuple[str, ...] = (*MODEL_NAMES, *(f"{name}_gated" for name in MODEL_NAMES))
MANIFEST_FILE = "manifest.json"
CURRENT_FILE = "CURRENT"
VERSIONS_DIR = "versions"
MANIFEST_FORMAT = 1

TargetTransform = Literal["log1p", "identity"]
Objective = Literal["quantile", "mean"]
Kind = Literal["prior", "trained"]


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

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)

    @classmethod
    def from_json(cls, raw: bytes) -> Manifest:
        try:
            data = orjson.loads(raw)
            data["models"] = {name: ModelSpec(**spec) for name, spec in data["models"].items()}
            data["feature_names"] = tuple(data["feature_names"])
            return cls(**data)
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            raise ArtifactError(f"unreadable manifest: {exc}") from exc

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


def served_latency_ms(tree_margin: np.ndarray, features: np.ndarray, spec: ModelSpec) -> np.ndarray:
    """The served latency (ms, float64, >= 0): the trees' raw margin (XGBoost, no base margin) plus
    the baseline's margin for these feature rows plus the calibration offset, inverse-transformed.

    The one place a margin becomes a served value: training, evaluation and serving all call it.
    """
    margin = tree_margin.astype(np.float64) + spec.calibration_offset
    if spec.baseline is not None:
        margin += base_margin(features, spec)
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
            raise ArtifactError(f"version {manifest.version}: file {spec.file} missing")
        if len(data) != spec.size_bytes or sha256_hex(data) != spec.sha256:
            raise ArtifactError(f"version {manifest.version}: checksum mismatch for {spec.file}")
    return ModelSet(manifest, files)


class ModelStore:
    """A model store on a local (possibly shared) filesystem."""

    def __init__(self, root: Path | str, keep_versions: int = 5) -> None:
        self.root = Path(root)
        self.keep_versions = max(1, keep_versions)

    @property
    def versions_dir(self) -> Path:
        return self.root / VERSIONS_DIR

    def current_version(self) -> str | None:
        """The version ``CURRENT`` names, or ``None`` if nothing was published yet."""
        try:
            name = (self.root / CURRENT_FILE).read_text().strip()
        except FileNotFoundError:
            return None
        return name or None

    def versions(self) -> list[str]:
        """Published versions, oldest first."""
        try:
            names = [p.name for p in self.versions_dir.iterdir() if p.is_dir()]
        except FileNotFoundError:
            return []
        return sorted(names)

    def read_manifest(self, version: str) -> Manifest:
        path = self._version_dir(version) / MANIFEST_FILE
        try:
            return Manifest.from_json(path.read_bytes())
        except FileNotFoundError as exc:
            raise ArtifactError(f"version {version} not found") from exc

    def read_file(self, version: str, file: str) -> bytes:
        if "/" in file or file.startswith("."):
            raise ArtifactError(f"bad file name {file!r}")
        try:
            return (self._version_dir(version) / file).read_bytes()
        except FileNotFoundError as exc:
            raise ArtifactError(f"version {version}: file {file} not found") from exc

    def load(self, version: str | None = None) -> ModelSet:
        """Read and verify a version (default: the current one)."""
        version = version or self.current_version()
        if version is None:
            raise ArtifactError("the store has no current version")
        manifest = self.read_manifest(version)
        files = {name: self.read_file(version, spec.file) for name, spec in manifest.models.items()}
        return verify_model_set(manifest, files)

    def publish(
        self,
        kind: Kind,
        models: dict[str, bytes],
        *,
        objective: Objective,
        quantile: float,
        target_transforms: dict[str, TargetTransform] | None = None,
        calibration_offsets: dict[str, float] | None = None,
        baselines: dict[str, dict[str, Any] | None] | None = None,
        training_samples: dict[str, int] | None = None,
        metrics: dict[str, Any] | None = None,
        xgboost_version: str = "",
    ) -> Manifest:
        """Write a new immutable version, switch ``CURRENT`` to it atomically and prune old versions."""
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        existing = self.versions()
        sequence = 1 + max(
            (int(v.split("-", 1)[0]) for v in existing if v.split("-", 1)[0].isdigit()), default=0
        )
        version = f"{sequence:06d}-{kind}"
        specs = {
            name: ModelSpec(
                file=f"{name}.ubj",
                sha256=sha256_hex(data),
                size_bytes=len(data),
                target_transform=(target_transforms or {}).get(name, "log1p"),
                calibration_offset=float((calibration_offsets or {}).get(name, 0.0)),
                baseline=(baselines or {}).get(name),
            )
            for name, data in models.items()
        }
        manifest = Manifest(
            version=version,
            sequence=sequence,
            kind=kind,
            created_at=utc_now_iso(),
            objective=objective,
            quantile=quantile,
            models=specs,
            training_samples=dict(training_samples or {}),
            metrics=dict(metrics or {}),
            xgboost_version=xgboost_version,
        )
        manifest.check_compatible()
        staging = self.root / f".staging-{uuid.uuid4().hex}"
        staging.mkdir(parents=True)
        try:
            for name, data in models.items():
                _write_synced(staging / specs[name].file, data)
            _write_synced(staging / MANIFEST_FILE, manifest.to_json())
            _fsync_dir(staging)
            os.rename(staging, self._version_dir(version))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        _fsync_dir(self.versions_dir)
        self._point_to(version)
        self.prune()
        return manifest

    def prune(self) -> list[str]:
        """Delete all but the newest ``keep_versions`` versions (never the current one)."""
        current = self.current_version()
        versions = self.versions()
        doomed = [v for v in versions[: -self.keep_versions] if v != current]
        for version in doomed:
            shutil.rmtree(self._version_dir(version), ignore_errors=True)
        for leftover in self.root.glob(".staging-*"):
            # A crash mid-publish leaves a staging dir; it was never visible to readers.
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
        return doomed

    def _point_to(self, version: str) -> None:
        tmp = self.root / f".{CURRENT_FILE}.{uuid.uuid4().hex}"
        _write_synced(tmp, version.encode())
        os.replace(tmp, self.root / CURRENT_FILE)
        _fsync_dir(self.root)

    def _version_dir(self, version: str) -> Path:
        if "/" in version or version.startswith("."):
            raise ArtifactError(f"bad version name {version!r}")
        return self.versions_dir / version


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
