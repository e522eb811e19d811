"""Keeps the served model version in step with the model store.

Each worker process runs one ``StoreWatcher``. Every ``poll_interval_s`` it asks its source
for the name of the current version: a read of the local store's ``CURRENT`` pointer, or
``GET {url}/models/current`` on the training server. When that name differs from the one
served, it fetches the version, verifies the checksums (``shared.artifacts.verify_model_set``),
builds and self-tests a ``Predictor`` in a worker thread, and only then swaps the reference
that requests read. A version that fails verification or the self-test is refused: logged,
counted, remembered (so it is not fetched again on every poll) and the previous version
keeps serving. Transient trouble (store unreachable, version pruned mid-read) is retried on
the next poll instead.

Until the store yields a usable version the built-in prior answers, so the service is ready
from its first second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol, TypeVar
from urllib.parse import quote

import httpx
import orjson

from prediction_server.config import PredictionSettings
from prediction_server.metrics import PredictionMetrics
from prediction_server.predictor import Predictor, SelfTestFailed, builtin_prior_model_set
from shared.artifacts import (
    CURRENT_FILE,
    MANIFEST_FILE,
    Manifest,
    ModelStore,
    sha256_hex,
    verify_model_set,
)
from shared.errors import ArtifactError
from shared.logging import log_event

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_REMEMBERED_REFUSALS = 64
STARTUP_STORE_BUDGET_S = 2.0
_VERSION_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
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
    if not _VERSION_NAME.match(manifest.version):
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
        if not _VERSION_NAME.match(version):
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
        if not _VERSION_NAME.match(version):
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


def _created_at_s(manifest: Manifest) -> float | None:
    try:
        return datetime.fromisoformat(manifest.created_at).timestamp()
    except (TypeError, ValueError):
        return None


class StoreWatcher:
    """Owns the served ``Predictor`` of one worker process and the task that refreshes it."""

    def __init__(self, settings: PredictionSettings, metrics: PredictionMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.source = make_source(settings)
        self.current: Predictor | None = None
        self.refused: dict[str, str] = {}
        self.store_reachable: bool | None = None
        self.last_store_error: str | None = None
        self.last_check_monotonic: float | None = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Load the store's current version (else the prior) and start polling.

        A store that is slow to answer does not hold up readiness: after ``STARTUP_STORE_BUDGET_S``
        the prior (or the cached version) serves, and the next poll picks the store's version up.
        """
        await self.check(io_budget_s=min(self.settings.store_timeout_s, STARTUP_STORE_BUDGET_S))
        if self.current is None and isinstance(self.source, HttpSource) and not self.store_reachable:
            cached = await self.source.cached_current()
            if cached is not None:
                await self._accept(cached, origin="cache")
        if self.current is None and self.settings.prior_fallback:
            await self._serve_prior()
        if self.source is not None:
            self._task = asyncio.create_task(self._poll_forever(), name="store-watcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.source is not None:
            await self.source.aclose()

    async def reload(self) -> bool:
        """Re-read the store now, retrying refused versions too; ``True`` if the version changed."""
        self.refused.clear()
        return await self.check()

    async def check(self, io_budget_s: float | None = None) -> bool:
        """One poll: switch to the store's current version if it is new and passes the checks.

        ``io_budget_s`` bounds each read from the store (not the model build that may follow).
        """
        if self.source is None:
            return False
        async with self._lock:
            self.last_check_monotonic = time.monotonic()
            version: str | None = None
            try:
                version = await _within(self.source.current_version(), io_budget_s)
                if version is None or version in self.refused:
                    self._reachable(True, None)
                    return False
                if self.current is not None and version == self.current.version:
                    self._reachable(True, None)
                    return False
                fetched = await _within(self.source.fetch(version), io_budget_s)
            except StoreUnavailable as exc:
                self._reachable(False, str(exc))
                return False
            except BadVersion as exc:
                self._reachable(True, None)
                if exc.key not in self.refused:
                    self._refuse(exc.key, "unreadable", exc)
                return False
            except ArtifactError as exc:
                self._reachable(True, None)
                self._refuse(version or "unknown", "unreadable", exc)
                return False
            self._reachable(True, None)
            return await self._accept(fetched, origin=self.source.description)

    async def _accept(self, fetched: Fetched, origin: str) -> bool:
        version = fetched.manifest.version
        started = time.perf_counter()
        try:
            predictor = await asyncio.to_thread(_build_predictor, fetched)
        except ArtifactError as exc:
            self._refuse(version, "self_test" if isinstance(exc, SelfTestFailed) else "verification", exc)
            return False
        self._serve(predictor, origin, time.perf_counter() - started)
        if isinstance(self.source, HttpSource) and origin != "cache":
            await self.source.remember(fetched)
        return True

    async def _serve_prior(self) -> None:
        started = time.perf_counter()
        try:
            predictor = await asyncio.to_thread(
                lambda: Predictor.from_model_set(builtin_prior_model_set(self.settings.quantile))
            )
        except ArtifactError as exc:  # cannot happen with a sane build; then we stay not-ready
            log_event(log, "prior_failed", logging.ERROR, error=str(exc))
            return
        self._serve(predictor, "builtin", time.perf_counter() - started)

    def _serve(self, predictor: Predictor, origin: str, duration_s: float) -> None:
        previous = self.current.version if self.current is not None else None
        self.current = predictor
        self.metrics.model_served(
            predictor.manifest.sequence, predictor.kind, _created_at_s(predictor.manifest)
        )
        log_event(
            log,
            "model_loaded",
            version=predictor.version,
            kind=predictor.kind,
            previous=previous,
            origin=origin,
            evaluator=predictor.evaluator,
            duration_s=round(duration_s, 4),
            pid=os.getpid(),
        )

    def _refuse(self, version: str, reason: str, exc: Exception) -> None:
        if len(self.refused) >= MAX_REMEMBERED_REFUSALS:
            self.refused.pop(next(iter(self.refused)))
        self.refused[version] = f"{reason}: {exc}"
        self.metrics.refused.labels(reason).inc()
        log_event(
            log,
            "model_refused",
            logging.ERROR,
            version=version,
            reason=reason,
            error=str(exc),
            serving=self.current.version if self.current is not None else None,
            pid=os.getpid(),
        )

    def _reachable(self, ok: bool, error: str | None) -> None:
        if not ok:
            self.metrics.store_poll_failures.inc()
        if ok != self.store_reachable:
            log_event(
                log,
                "store_reachable" if ok else "store_unreachable",
                logging.INFO if ok else logging.WARNING,
                store=self.source.description if self.source else None,
                error=error,
            )
            self.metrics.store_reachable.set(1 if ok else 0)
        self.store_reachable = ok
        self.last_store_error = error

    async def _poll_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.poll_interval_s)
            try:
                await self.check()
            except Exception as exc:  # keep polling whatever happens; the old version keeps serving
                log_event(log, "store_poll_error", logging.ERROR, error=repr(exc))
            if self.current is not None:
                self.metrics.refresh_age(_created_at_s(self.current.manifest))


async def _within(awaitable: Awaitable[T], budget_s: float | None) -> T:
    if budget_s is None:
        return await awaitable
    try:
        return await asyncio.wait_for(awaitable, budget_s)
    except TimeoutError:
        raise StoreUnavailable(f"no answer within {budget_s:g} s") from None


def _build_predictor(fetched: Fetched) -> Predictor:
    return Predictor.from_model_set(verify_model_set(fetched.manifest, fetched.files))
