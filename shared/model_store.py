"""The model store: versioned, immutable model sets on a filesystem.

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

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from shared.artifacts import (
    MANIFEST_FILE,
    VERSION_NAME,
    Kind,
    Manifest,
    ModelSet,
    ModelSpec,
    Objective,
    TargetTransform,
    sha256_hex,
    utc_now_iso,
    verify_model_set,
)
from shared.atomic import fsync_dir, write_atomic, write_synced
from shared.errors import ArtifactError, CorruptArtifact
from shared.regimes import RegimeOffsets

CURRENT_FILE = "CURRENT"
VERSIONS_DIR = "versions"
QUARANTINE_DIR = "quarantine"
KEEP_CALIBRATED_VERSIONS = 2  # calibration versions kept besides the current one


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
