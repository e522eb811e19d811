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
import re
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

import httpx
import orjson

from prediction_server.config import PredictionSettings
from shared.artifacts import CURRENT_FILE, MANIFEST_FILE, Manifest, ModelStore, sha256_hex
from shared.errors import ArtifactError
from shared.logging import log_event

log = logging.getLogger(__name__)

VERSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MANIFEST_FIELDS = frozenset(Manifest.__dataclass_fields__)


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

    async def aclose(self) -> None: ...


def parse_manifest(raw: bytes) -> Manifest:
    """A manifest from JSON, ignoring fields this build does not know (newer writers may add some)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ArtifactError(f"unreadable manifest: {exc}") from exc
    if isinstance(data, dict) and isinstance(data.get("manifest"), dict):
        data = data["manifest"]
    if not isinstance(data, dict):
        raise ArtifactError("unreadable manifest: not a JSON object")
    manifest = Manifest.from_json(orjson.dumps({k: v for k, v in data.items() if k in _MANIFEST_FIELDS}))
    if not VERSION_NAME.match(manifest.version):
        raise ArtifactError(f"bad version name {manifest.version!r}")
    return manifest


class LocalSource:
    """A model store directory (possibly a shared volume)."""

    def __init__(self, root: Path | str) -> None:
        self.store = ModelStore(root)
        self.description = str(self.store.root)

    async def current_version(self) -> str | None:
        try:
            return await asyncio.to_thread(self.store.current_version)
        except OSError as exc:
            raise StoreUnavailable(f"cannot read {self.store.root / CURRENT_FILE}: {exc}") from exc

    async def fetch(self, version: str) -> Fetched:
        return await asyncio.to_thread(self._fetch, version)

    def _fetch(self, version: str) -> Fetched:
        if not VERSION_NAME.match(version):
            raise ArtifactError(f"bad version name {version!r}")
        directory = self.store.versions_dir / version
        try:
            manifest = parse_manifest((directory / MANIFEST_FILE).read_bytes())
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

    async def current_version(self) -> str | None:
        response = await self._get("/models/current")
        if response.status_code == 404:
            return None
        self._check(response, "current manifest")
        try:
            manifest = parse_manifest(response.content)
        except ArtifactError as exc:
            raise BadVersion(f"unreadable-current-{sha256_hex(response.content)[:12]}", str(exc)) from exc
        self._manifests = {manifest.version: manifest}
        return manifest.version

    async def fetch(self, version: str) -> Fetched:
        if not VERSION_NAME.match(version):
            raise ArtifactError(f"bad version name {version!r}")
        manifest = self._manifests.get(version) or parse_manifest(await self._file(version, MANIFEST_FILE))
        cached = await self._from_cache(manifest)
        if cached is not None:
            return cached
        files = {name: await self._file(version, spec.file) for name, spec in manifest.models.items()}
        return Fetched(manifest, files)

    async def remember(self, fetched: Fetched) -> None:
        """Keep a verified version in the cache directory (best effort)."""
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

    async def _get(self, path: str) -> httpx.Response:
        try:
            return await self._client.get(self.base_url + path)
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
            for name, spec in fetched.manifest.models.items():
                (staging / spec.file).write_bytes(fetched.files[name])
            (staging / MANIFEST_FILE).write_bytes(fetched.manifest.to_json())
            os.rename(staging, target)
        except OSError:
            shutil.rmtree(staging, ignore_errors=True)
            if not target.is_dir():
                raise
    pointer = store.root / f".{CURRENT_FILE}.{uuid.uuid4().hex}"
    pointer.write_text(version)
    os.replace(pointer, store.root / CURRENT_FILE)
    store.prune()


def make_source(settings: PredictionSettings) -> ModelSource | None:
    if not settings.store:
        return None
    if settings.store_is_url:
        return HttpSource(settings.store, settings.store_timeout_s, settings.cache_dir)
    return LocalSource(settings.store)
