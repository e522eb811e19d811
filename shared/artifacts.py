"""Model artifacts and the model store.

A store is a directory of immutable, versioned model sets::

    <root>/versions/000007-trained/{manifest.json, ttft.ubj, tpot.ubj}
    <root>/versions/000008-calibrated/...   # same model bytes, new per-regime offsets
    <root>/CURRENT            # the name of the current version, switched atomically

A version directory appears by ``rename`` of a fully written and fsynced staging
directory, and ``CURRENT`` is replaced by write + fsync + rename, so a reader never
sees a half-written version. Models are XGBoost's native UBJSON format, verified by
SHA-256 from the manifest before they are loaded. No pickle anywhere.

Damage is told apart from incompatibility: an unreadable ``CURRENT`` or manifest, a truncated
model file or a checksum mismatch raise ``CorruptArtifact``; the store's writer (the training
server) moves such files aside into ``<root>/quarantine/`` (``ModelStore.quarantine``) and
falls back to the newest version that verifies (``ModelStore.newest_verified``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import orjson

from shared.atomic import fsync_dir, write_atomic, write_synced
from shared.baseline import baseline_ms, check_baseline
from shared.errors import ArtifactError, CorruptArtifact
from shared.features import FEATURE_NAMES, FEATURE_VERSION
from shared.regimes import RegimeOffsets

MODEL_NAMES: tuple[str, ...] = ("ttft", "tpot")
# The names the llm-d operator API lists (wire-contract 5); we serve no gated models, so the
# gated ones are always listed as absent.
LISTED_MODEL_NAMES: tuple[str, ...] = (*MODEL_NAMES, *(f"{name}_gated" for name in MODEL_NAMES))
MANIFEST_FILE = "manifest.json"
CURRENT_FILE = "CURRENT"
VERSIONS_DIR = "versions"
QUARANTINE_DIR = "quarantine"
MANIFEST_FORMAT = 1
VERSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
"""What a version (or file) name may look like: no path separators, no NUL, no leading dot."""
KEEP_CALIBRATED_VERSIONS = 2  # calibration versions kept besides the current one

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


class ModelStore:
    """A model store on a local (possibly shared) filesystem."""

    def __init__(self, root: Path | str, keep_versions: int = 5) -> None:
        self.root = Path(root)
        self.keep_versions = max(1, keep_versions)
        # The trainer and online calibration publish from different threads of one process.
        self._publish_lock = threading.Lock()

    @property
    def versions_dir(self) -> Path:
        return self.root / VERSIONS_DIR

    def current_version(self) -> str | None:
        """The version ``CURRENT`` names, or ``None`` if nothing was published yet.

        Raises ``CorruptArtifact`` when ``CURRENT`` is not UTF-8 or names no valid version."""
        path = self.root / CURRENT_FILE
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            name = raw.decode("utf-8").strip()
        except UnicodeDecodeError as exc:
            raise CorruptArtifact(f"{path} is not UTF-8: {exc}") from exc
        if name and not VERSION_NAME.match(name):
            raise CorruptArtifact(f"{path} names no valid version: {name[:80]!r}")
        return name or None

    def versions(self) -> list[str]:
        """Published versions, oldest first."""
        try:
            names = [p.name for p in self.versions_dir.iterdir() if p.is_dir() and VERSION_NAME.match(p.name)]
        except FileNotFoundError:
            return []
        return sorted(names, key=version_order)

    def read_manifest(self, version: str) -> Manifest:
        path = self._version_dir(version) / MANIFEST_FILE
        try:
            manifest = Manifest.from_json(path.read_bytes())
        except FileNotFoundError as exc:
            if self._version_dir(version).is_dir():
                raise CorruptArtifact(f"version {version}: {MANIFEST_FILE} missing") from exc
            raise ArtifactError(f"version {version} not found") from exc
        if manifest.version != version:
            raise CorruptArtifact(f"directory {version} holds a manifest for {manifest.version}")
        return manifest

    def read_file(self, version: str, file: str) -> bytes:
        if not VERSION_NAME.match(file):
            raise ArtifactError(f"bad file name {file!r}")
        try:
            return (self._version_dir(version) / file).read_bytes()
        except FileNotFoundError as exc:
            raise ArtifactError(f"version {version}: file {file} not found") from exc

    def newest_verified(
        self, on_damaged: Callable[[str, CorruptArtifact], None] | None = None
    ) -> ModelSet | None:
        """The newest trained version that verifies, else the newest verifying prior, else ``None``.

        Damaged versions met on the way are passed to ``on_damaged`` (the store's writer
        quarantines them); incompatible ones (another feature schema) are skipped."""
        for version in fallback_order(self.versions()):
            try:
                return self.load(version)
            except CorruptArtifact as exc:
                if on_damaged is not None:
                    on_damaged(version, exc)
            except ArtifactError:
                continue
        return None

    def _quarantined_names(self) -> list[str]:
        try:
            return [p.name for p in (self.root / QUARANTINE_DIR).iterdir()]
        except FileNotFoundError:
            return []

    def quarantine_version(self, version: str) -> Path:
        return self.quarantine(self._version_dir(version))

    def quarantine(self, path: Path) -> Path:
        """Move a damaged file or version directory into ``<root>/quarantine/``; returns where."""
        target_dir = self.root / QUARANTINE_DIR
        target_dir.mkdir(parents=True, exist_ok=True)
        target = target_dir / f"{path.name}.{int(time.time() * 1000)}"
        os.rename(path, target)
        fsync_dir(path.parent)
        return target

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
        regime_offsets: dict[str, RegimeOffsets | None] | None = None,
    ) -> Manifest:
        """Write a new immutable version, switch ``CURRENT`` to it atomically and prune old versions."""
        specs = {
            name: ModelSpec(
                file=f"{name}.ubj",
                sha256=sha256_hex(data),
                size_bytes=len(data),
                target_transform=(target_transforms or {}).get(name, "log1p"),
                calibration_offset=float((calibration_offsets or {}).get(name, 0.0)),
                baseline=(baselines or {}).get(name),
                regime_offsets=(regime_offsets or {}).get(name),
            )
            for name, data in models.items()
        }
        template = Manifest(
            version="",
            sequence=0,
            kind=kind,
            created_at="",
            objective=objective,
            quantile=quantile,
            models=specs,
            training_samples=dict(training_samples or {}),
            metrics=dict(metrics or {}),
            xgboost_version=xgboost_version,
        )
        with self._publish_lock:
            return self._write_version(template, models)

    def publish_calibrated(
        self, based_on: str, regime_offsets: dict[str, RegimeOffsets], metrics: dict[str, Any]
    ) -> Manifest | None:
        """Publish a lightweight version: the model files of ``based_on`` (hard links, same bytes
        and SHA-256) with new ``regime_offsets``; replicas swap offsets without recompiling trees.

        Publishes only if ``based_on`` is still current (a retrain may have just replaced it);
        returns ``None`` otherwise.
        """
        with self._publish_lock:
            if self.current_version() != based_on:
                return None
            base = self.read_manifest(based_on)
            models = {name: self._version_dir(based_on) / spec.file for name, spec in base.models.items()}
            specs = {
                name: replace(spec, regime_offsets=regime_offsets.get(name, spec.regime_offsets))
                for name, spec in base.models.items()
            }
            # A calibrated prior stays a prior: the first retrain replaces it without comparison.
            kind: Literal["prior", "calibrated"] = "prior" if base.kind == "prior" else "calibrated"
            template = replace(base, kind=kind, models=specs, metrics={**base.metrics, **metrics})
            return self._write_version(template, models)

    def _write_version(self, template: Manifest, models: Mapping[str, bytes | Path]) -> Manifest:
        """Under the publish lock: number, write, fsync and rename a version; point CURRENT to it."""
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        # Quarantined names count too: a new version never reuses a name readers refused.
        existing = [*self.versions(), *self._quarantined_names()]
        sequence = 1 + max(
            (int(v.split("-", 1)[0]) for v in existing if v.split("-", 1)[0].isdigit()), default=0
        )
        version = f"{sequence:06d}-{template.kind}"
        manifest = replace(template, version=version, sequence=sequence, created_at=utc_now_iso())
        manifest.check_compatible()
        staging = self.root / f".staging-{os.urandom(16).hex()}"
        staging.mkdir(parents=True)
        try:
            for name, data in models.items():
                target = staging / manifest.models[name].file
                if isinstance(data, Path):
                    _link_or_copy(data, target)
                else:
                    write_synced(target, data)
            write_synced(staging / MANIFEST_FILE, manifest.to_json())
            fsync_dir(staging)
            os.rename(staging, self._version_dir(version))
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        fsync_dir(self.versions_dir)
        self.point_to(version)
        self.prune()
        return manifest

    def prune(self) -> list[str]:
        """Delete all but the newest ``keep_versions`` trained (or prior) versions and the newest
        ``KEEP_CALIBRATED_VERSIONS`` calibration versions; never the current one. Frequent
        calibration versions therefore never push the trained versions kept for rollback out."""
        current = self.current_version()
        versions = self.versions()
        calibrated = [v for v in versions if v.endswith("-calibrated")]
        others = [v for v in versions if not v.endswith("-calibrated")]
        old = others[: -self.keep_versions] + calibrated[:-KEEP_CALIBRATED_VERSIONS]
        doomed = [v for v in old if v != current]
        for version in doomed:
            shutil.rmtree(self._version_dir(version), ignore_errors=True)
        for leftover in self.root.glob(".staging-*"):
            # A crash mid-publish leaves a staging dir; it was never visible to readers.
            if leftover.is_dir():
                shutil.rmtree(leftover, ignore_errors=True)
        return doomed

    def point_to(self, version: str) -> None:
        """Switch ``CURRENT`` to ``version`` atomically and durably."""
        write_atomic(self.root / CURRENT_FILE, version.encode())

    def _version_dir(self, version: str) -> Path:
        if not VERSION_NAME.match(version):
            raise ArtifactError(f"bad version name {version!r}")
        return self.versions_dir / version


def version_order(version: str) -> tuple[int, str]:
    """Sort key of version names, oldest first: their sequence number, then the name. Names are
    ``f"{sequence:06d}-{kind}"``: past 999,999 a name has seven digits, and string order would put
    it before all the older ones (calibration versions, several a second, get there in days)."""
    head = version.split("-", 1)[0]
    return (int(head) if head.isdigit() else -1, version)


def fallback_order(versions: Iterable[str]) -> list[str]:
    """Versions to fall back on, best first: the trained ones newest first, then the others."""
    return sorted(versions, key=lambda v: (v.endswith("-trained"), version_order(v)), reverse=True)


def _link_or_copy(source: Path, target: Path) -> None:
    """Model files are immutable, so a hard link shares them; copy where links are unsupported."""
    try:
        os.link(source, target)
    except OSError:
        write_synced(target, source.read_bytes())
