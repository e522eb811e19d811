"""Seed bundles: one model version as a gzipped tar, to start a new cluster from another's model.

A bundle holds exactly the version's ``manifest.json``, its native XGBoost model files (the
names the manifest gives) and ``metadata.json`` (``model_type``, ``quantile_alpha``,
``exported_at``, sample counts, ...). Every member is a regular file at the top level with a
real mtime. Reading is strict: a bundle is refused (``BundleError``) unless its size is within
bounds, every member is one of the expected names (no directories, links, devices, path
traversal or duplicates), the manifest is compatible with this build's features and every model
file matches the manifest's size and SHA-256. No pickle, in either direction.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from shared.artifacts import MANIFEST_FILE, Manifest, ModelSet, verify_model_set
from shared.errors import ArtifactError
from shared.identity import MODEL_TYPE

METADATA_FILE = "metadata.json"
BUNDLE_FORMAT = 1
BUNDLE_MEDIA_TYPE = "application/gzip"
# Bounds: compressed size is bounded by the caller's body limit; these bound what it unpacks to.
MAX_MEMBER_BYTES = 64 * 1024 * 1024
MAX_BUNDLE_BYTES = 128 * 1024 * 1024
MAX_MEMBERS = 16


class BundleError(ValueError):
    """The bundle is malformed, unsafe or does not match this build."""


@dataclass(frozen=True)
class Bundle:
    """A verified model set and the bundle's metadata."""

    model_set: ModelSet
    metadata: dict[str, Any]

    @property
    def manifest(self) -> Manifest:
        return self.model_set.manifest


def write_bundle(model_set: ModelSet, sample_counts: dict[str, Any], *, now_s: float | None = None) -> bytes:
    """The gzipped tar of ``model_set`` (already verified), with ``metadata.json``."""
    manifest = model_set.manifest
    mtime = time.time() if now_s is None else now_s
    metadata = {
        "bundle_format": BUNDLE_FORMAT,
        "model_type": MODEL_TYPE,
        "objective_type": manifest.objective,
        "quantile_alpha": manifest.quantile,
        "exported_at": _iso(mtime),
        "source_version": manifest.version,
        "source_kind": manifest.kind,
        "feature_version": manifest.feature_version,
        "xgboost_version": manifest.xgboost_version,
        "model_files": {name: spec.file for name, spec in manifest.models.items()},
        "training_samples": dict(manifest.training_samples),
        "sample_counts": sample_counts,
    }
    members = [
        (MANIFEST_FILE, manifest.to_json()),
        *((spec.file, model_set.files[name]) for name, spec in manifest.models.items()),
        (METADATA_FILE, orjson.dumps(metadata, option=orjson.OPT_INDENT_2)),
    ]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = int(mtime)
            info.mode = 0o644
            info.type = tarfile.REGTYPE
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=int(mtime))


def read_bundle(data: bytes, *, max_bytes: int = MAX_BUNDLE_BYTES) -> Bundle:
    """Unpack and verify a bundle (see the module docstring); raise ``BundleError`` on any problem.

    ``max_bytes`` bounds what the bundle unpacks to (and each member).
    """
    files = _members(data, max_bytes)
    manifest_raw = files.pop(MANIFEST_FILE, None)
    metadata_raw = files.pop(METADATA_FILE, None)
    if manifest_raw is None or metadata_raw is None:
        raise BundleError(f"a bundle needs {MANIFEST_FILE} and {METADATA_FILE}")
    try:
        manifest = Manifest.from_json(manifest_raw)
        metadata = orjson.loads(metadata_raw)
    except (ArtifactError, orjson.JSONDecodeError) as exc:
        raise BundleError(str(exc)) from None
    if not isinstance(metadata, dict) or metadata.get("model_type") != MODEL_TYPE:
        raise BundleError(f"{METADATA_FILE} must say model_type {MODEL_TYPE!r}")
    by_file = {spec.file: name for name, spec in manifest.models.items()}
    unexpected = sorted(set(files) - set(by_file))
    if unexpected:
        raise BundleError(f"unexpected members {unexpected}")
    try:
        model_set = verify_model_set(manifest, {by_file[f]: content for f, content in files.items()})
    except ArtifactError as exc:
        raise BundleError(str(exc)) from None
    return Bundle(model_set, metadata)


def _members(data: bytes, max_bytes: int) -> dict[str, bytes]:
    """Name -> content of every member, refusing anything but a few small top-level regular files."""
    files: dict[str, bytes] = {}
    total = 0
    try:
        with tarfile.open(fileobj=io.BytesIO(_gunzip(data, max_bytes)), mode="r:") as tar:
            while (member := tar.next()) is not None:
                name = member.name
                if len(files) >= MAX_MEMBERS:
                    raise BundleError(f"more than {MAX_MEMBERS} members")
                if not member.isreg():
                    raise BundleError(f"member {name!r} is not a regular file")
                if "/" in name or "\\" in name or name.startswith(".") or not name:
                    raise BundleError(f"member name {name!r} is not a plain file name")
                if name in files:
                    raise BundleError(f"member {name!r} appears twice")
                total += member.size
                if member.size > min(MAX_MEMBER_BYTES, max_bytes) or total > max_bytes:
                    raise BundleError("bundle unpacks to more than the size limit")
                extracted = tar.extractfile(member)
                assert extracted is not None  # a regular file
                files[name] = extracted.read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BundleError(f"not a gzipped tar: {exc}") from None
    return files


def _gunzip(data: bytes, max_bytes: int) -> bytes:
    """Decompress, refusing (before it is all in memory) anything that unpacks beyond the bound."""
    limit = max_bytes + 64 * 1024  # room for the tar headers
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
            raw = stream.read(limit + 1)
    except (OSError, EOFError) as exc:
        raise BundleError(f"not gzip data: {exc}") from None
    if len(raw) > limit:
        raise BundleError("bundle unpacks to more than the size limit")
    return raw


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat()
