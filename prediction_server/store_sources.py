"""Where model versions come from: the local store directory or the training server over HTTP.

A source answers two questions: which version is current (cheap, asked on every poll), and what
are its manifest and model files (asked once per new version). ``StoreUnavailable`` means "try
again later" (unreachable, or a version pruned mid-read); ``ArtifactError`` means the version
itself is bad and can be refused. Versions pulled over HTTP can be kept in a local cache laid
out like a store, so workers reuse each other's downloads and a restart can serve the last
model while the training server is down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

import httpx

from prediction_server.config import PredictionSettings
from shared.artifacts import MANIFEST_FILE, VERSION_NAME, Manifest, sha256_hex
from shared.atomic import fsync_dir, write_synced
from shared.errors import ArtifactError, CorruptArtifact
from shared.logging import log_event
from shared.model_store import CURRENT_FILE, ModelStore

log = logging.getLogger(__name__)


class StoreUnavailable(Exception):
    """The store could not be read right now; try again on the next poll."""


class BadVersion(ArtifactError):
    """A version that can never be served; ``key`` names it (or its unreadable manifest)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class Fetched:
    """A version's manifest and model files, not yet verified."""

    manifest: Manifest
    files: dict[str, bytes]


class ModelSource(Protocol):
    """Where versions come from: the local store or the training server's HTTP view of it."""

    description: str

    async def current_version(self) -> str | None:
        """The current version's name (cheap); ``None`` if nothing is published yet."""

    async def fetch(self, version: str) -> Fetched:
        """Read a version; ``StoreUnavailable`` if transient, ``ArtifactError`` if the version is bad."""

    async def versions(self) -> list[str]:
        """Every published version (to fall back on when the current one is unusable)."""

    async def aclose(self) -> None: ...


class LocalSource:
    """A model store directory (possibly a shared volume)."""

    def __init__(self, root: Path | str) -> None:
        self.store = ModelStore(root)
        self.description = str(self.store.root)

    async def current_version(self) -> str | None:
        try:
            return await asyncio.to_thread(self.store.current_version)
        except CorruptArtifact as exc:
            raw = await asyncio.to_thread(_read_or_empty, self.store.root / CURRENT_FILE)
            raise BadVersion(f"unreadable-current-{sha256_hex(raw)[:12]}", str(exc)) from exc
        except OSError as exc:
            raise StoreUnavailable(f"cannot read {self.store.root / CURRENT_FILE}: {exc}") from exc

    async def versions(self) -> list[str]:
        try:
            return await asyncio.to_thread(self.store.versions)
        except OSError as exc:
            raise StoreUnavailable(f"cannot list {self.store.versions_dir}: {exc}") from exc

    async def fetch(self, version: str) -> Fetched:
        return await asyncio.to_thread(self._fetch, version)

    def _fetch(self, version: str) -> Fetched:
        if not VERSION_NAME.match(version):
            raise ArtifactError(f"bad version name {version!r}")
        directory = self.store.versions_dir / version
        try:
            manifest = Manifest.from_json((directory / MANIFEST_FILE).read_bytes())
            files = {name: (directory / spec.file).read_bytes() for name, spec in manifest.models.items()}
        except FileNotFoundError as exc:
            if not directory.is_dir():  # pruned between reading CURRENT and here
                raise StoreUnavailable(f"version {version} vanished from {self.description}") from exc
            raise ArtifactError(f"version {version}: {Path(str(exc.filename)).name} missing") from exc
        except OSError as exc:
            raise StoreUnavailable(f"cannot read version {version}: {exc}") from exc
        if manifest.version != version:
            raise ArtifactError(f"directory {version} holds a manifest for {manifest.version}")
        return Fetched(manifest, files)

    async def aclose(self) -> None:
        return None


class HttpSource:
    """The training server's HTTP view of its store, optionally cached on local disk."""

    def __init__(self, base_url: str, timeout_s: float, cache_dir: Path | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.description = self.base_url
        self._client = httpx.AsyncClient(timeout=timeout_s)
        self._cache = LocalSource(cache_dir) if cache_dir is not None else None
        self._manifests: dict[str, Manifest] = {}
        self._etag: tuple[str, str] | None = None  # (ETag of the current manifest, its version)
        # The model files of the last version that passed verification, by SHA-256: a calibration
        # version (new offsets, the same files) is then fetched as its manifest alone. Only a
        # calibration version: any other one is downloaded whole, so a damaged copy of a served
        # version (a truncated file under a new name) is refused, not rebuilt from our own bytes.
        self._verified: dict[str, bytes] = {}

    async def current_version(self) -> str | None:
        # A cheap check: with If-None-Match the training server answers 304 without a body while
        # the current manifest is the one we already have.
        headers = {"If-None-Match": self._etag[0]} if self._etag is not None else None
        response = await self._get("/models/current", headers)
        if response.status_code == 304 and self._etag is not None:
            return self._etag[1]
        self._etag = None
        if response.status_code == 404:
            return None
        if response.status_code == 503 and b"store_unreadable" in response.content:
            # The training server is up but its CURRENT is damaged: fall back, do not wait.
            raise BadVersion(
                "unreadable-current-remote", f"the store's CURRENT is unreadable: {response.text[:200]}"
            )
        self._check(response, "current manifest")
        try:
            manifest = Manifest.from_json(response.content)
        except ArtifactError as exc:
            raise BadVersion(f"unreadable-current-{sha256_hex(response.content)[:12]}", str(exc)) from exc
        self._manifests = {manifest.version: manifest}
        etag = response.headers.get("etag")
        self._etag = (etag, manifest.version) if etag else None
        return manifest.version

    async def versions(self) -> list[str]:
        response = await self._get("/models")
        self._check(response, "version list")
        try:
            names = response.json()["versions"]
        except (ValueError, KeyError, TypeError) as exc:
            raise StoreUnavailable(f"unreadable version list: {exc}") from exc
        return [n for n in names if isinstance(n, str) and VERSION_NAME.match(n)]

    async def fetch(self, version: str) -> Fetched:
        if not VERSION_NAME.match(version):
            raise ArtifactError(f"bad version name {version!r}")
        manifest = self._manifests.get(version) or Manifest.from_json(
            await self._file(version, MANIFEST_FILE)
        )
        cached = await self._from_cache(manifest)
        if cached is not None:
            return cached
        reusable = self._verified if manifest.kind == "calibrated" else {}
        files = {
            name: reusable[spec.sha256] if spec.sha256 in reusable else await self._file(version, spec.file)
            for name, spec in manifest.models.items()
        }
        return Fetched(manifest, files)

    async def remember(self, fetched: Fetched) -> None:
        """Keep a verified version's files for the next fetch, and in the cache directory (best effort)."""
        self._verified = {spec.sha256: fetched.files[name] for name, spec in fetched.manifest.models.items()}
        if self._cache is None:
            return
        try:
            await asyncio.to_thread(_write_cached_version, self._cache.store, fetched)
        except OSError as exc:
            log_event(log, "model_cache_write_failed", logging.WARNING, error=str(exc))

    async def cached_current(self) -> Fetched | None:
        """The version the cache last pointed to (used when the training server is unreachable)."""
        if self._cache is None:
            return None
        with contextlib.suppress(StoreUnavailable, ArtifactError):
            version = await self._cache.current_version()
            if version is not None:
                return await self._cache.fetch(version)
        return None

    async def _from_cache(self, manifest: Manifest) -> Fetched | None:
        if self._cache is None:
            return None
        try:
            cached = await self._cache.fetch(manifest.version)
        except (StoreUnavailable, ArtifactError):
            return None
        # Same version name is not enough: trust the cache only if it matches the remote checksums.
        same = all(
            cached.manifest.models.get(name) == spec for name, spec in manifest.models.items()
        ) and len(cached.manifest.models) == len(manifest.models)
        return Fetched(manifest, cached.files) if same else None

    async def _file(self, version: str, file: str) -> bytes:
        response = await self._get(f"/models/versions/{quote(version, safe='')}/{quote(file, safe='')}")
        self._check(response, f"{version}/{file}")
        return response.content

    async def _get(self, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
        try:
            return await self._client.get(self.base_url + path, headers=headers)
        except httpx.HTTPError as exc:
            raise StoreUnavailable(f"GET {self.base_url}{path}: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _check(response: httpx.Response, what: str) -> None:
        # A 404 for a file means the version was pruned after we saw it: transient, like a 5xx.
        if response.status_code != 200:
            raise StoreUnavailable(f"{what}: HTTP {response.status_code}")

    async def aclose(self) -> None:
        await self._client.aclose()


def _write_cached_version(store: ModelStore, fetched: Fetched) -> None:
    """Write a verified version in the store layout (atomic rename) and point ``CURRENT`` at it.

    Several workers may do this at once: the first rename wins and the others drop their copy.
    """
    version = fetched.manifest.version
    target = store.versions_dir / version
    if not target.is_dir():
        store.versions_dir.mkdir(parents=True, exist_ok=True)
        # Not ".staging-*": ModelStore.prune deletes those, which would race another worker.
        staging = store.root / f".incoming-{uuid.uuid4().hex}"
        staging.mkdir(parents=True)
        try:
            shared = _cached_files(store)
            for name, spec in fetched.manifest.models.items():
                try:  # a calibration version's files are those of the version it recalibrates
                    os.link(shared[spec.sha256], staging / spec.file)
                except (KeyError, OSError):
                    write_synced(staging / spec.file, fetched.files[name])
            write_synced(staging / MANIFEST_FILE, fetched.manifest.to_json())
            fsync_dir(staging)
            os.rename(staging, target)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not target.is_dir():
                raise
    store.point_to(version)
    store.prune()


def _cached_files(store: ModelStore) -> dict[str, Path]:
    """The model files of the cache's current version, by SHA-256 (none if it has none or is unreadable)."""
    try:
        version = store.current_version()
        if version is None:
            return {}
        manifest = store.read_manifest(version)
    except (OSError, ArtifactError):
        return {}
    directory = store.versions_dir / version
    return {spec.sha256: directory / spec.file for spec in manifest.models.values()}


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def make_source(settings: PredictionSettings) -> ModelSource | None:
    if not settings.store:
        return None
    if settings.store_is_url:
        return HttpSource(settings.store, settings.store_timeout_s, settings.cache_dir)
    return LocalSource(settings.store)
