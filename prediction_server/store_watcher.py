"""Keeps the served model version in step with the model store.

Each worker process runs one ``StoreWatcher``. Every ``poll_interval_s`` it asks its source
(``prediction_server.store_sources``) for the name of the current version: a read of the local
store's ``CURRENT`` pointer, or ``GET {url}/models/current`` on the training server. When that
name differs from the one served, it fetches the version, verifies the checksums
(``shared.artifacts.verify_model_set``), builds and self-tests a ``Predictor`` in a worker
thread, and only then swaps the reference that requests read. A version whose model files have
the checksums of the served one (a calibration version: new offsets only) reuses the compiled
trees (``Predictor.recalibrated``) and switches within the poll interval. A version that fails
verification or the self-test is refused: logged, counted, remembered (so it is not fetched
again on every poll) and the previous version keeps serving. Transient trouble (store
unreachable, version pruned mid-read) is retried on the next poll instead.

Until the store yields a usable version the built-in prior answers, so the service is ready
from its first second. When the current version is unusable (``CURRENT`` unreadable, a damaged
manifest or model file) while nothing trained is served yet, the watcher falls back to the
newest version of the store that verifies (then to its cache), never to the prior while a good
trained version exists; ``current_readable`` says whether ``CURRENT`` itself could be read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable
from datetime import datetime
from typing import TypeVar

from prediction_server.config import PredictionSettings
from prediction_server.metrics import PredictionMetrics
from prediction_server.predictor import Predictor, SelfTestFailed, builtin_prior_model_set
from prediction_server.store_sources import (
    BadVersion,
    Fetched,
    HttpSource,
    StoreUnavailable,
    make_source,
)
from shared.artifacts import Manifest, verify_model_set
from shared.errors import ArtifactError
from shared.logging import log_event, log_task_failure
from shared.model_store import fallback_order

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_REMEMBERED_REFUSALS = 64
STARTUP_STORE_BUDGET_S = 2.0


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
        self.current_readable: bool | None = None
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
        if self.current is None and isinstance(self.source, HttpSource):
            cached = await self.source.cached_current()
            if cached is not None:
                await self._accept(cached, origin="cache")
        if self.current is None and self.settings.prior_fallback:
            await self._serve_prior()
        if self.source is not None:
            self._task = asyncio.create_task(self._poll_forever(), name="store-watcher")
            self._task.add_done_callback(log_task_failure)

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
                self.current_readable = True
                if version is None:
                    self._reachable(True, None)
                    return False
                if version in self.refused:
                    self._reachable(True, None)
                    return await self._fall_back(io_budget_s)
                if self.current is not None and version == self.current.version:
                    self._reachable(True, None)
                    return False
                fetched = await _within(self.source.fetch(version), io_budget_s)
            except StoreUnavailable as exc:
                self._reachable(False, str(exc))
                return False
            except BadVersion as exc:  # CURRENT (or the current manifest) is unreadable
                self._reachable(True, None)
                self.current_readable = False
                if exc.key not in self.refused:
                    self._refuse(exc.key, "unreadable", exc)
                return await self._fall_back(io_budget_s)
            except ArtifactError as exc:
                self._reachable(True, None)
                self._refuse(version or "unknown", "unreadable", exc)
                return await self._fall_back(io_budget_s)
            self._reachable(True, None)
            if await self._accept(fetched, origin=self.source.description):
                return True
            return await self._fall_back(io_budget_s)

    async def _fall_back(self, io_budget_s: float | None) -> bool:
        """The current version is unusable: unless a trained version already serves, serve the
        newest one in the store that verifies (trained first); ``True`` if one was taken."""
        if self.source is None or (self.current is not None and self.current.kind != "prior"):
            return False
        try:
            versions = await _within(self.source.versions(), io_budget_s)
        except StoreUnavailable:
            return False
        for version in fallback_order(versions):
            if version in self.refused:
                continue
            if self.current is not None and version == self.current.version:
                return False
            try:
                fetched = await _within(self.source.fetch(version), io_budget_s)
            except StoreUnavailable:
                continue
            except ArtifactError as exc:
                self._refuse(version, "unreadable", exc)
                continue
            if await self._accept(fetched, origin=f"{self.source.description} (fallback)"):
                return True
        return False

    async def _accept(self, fetched: Fetched, origin: str) -> bool:
        version = fetched.manifest.version
        started = time.perf_counter()
        current = self.current
        try:
            predictor = await asyncio.to_thread(_build_predictor, fetched, current)
        except ArtifactError as exc:
            self._refuse(version, "self_test" if isinstance(exc, SelfTestFailed) else "verification", exc)
            return False
        reused = current is not None and predictor.forests is current.forests
        self._serve(predictor, origin, time.perf_counter() - started, reused_trees=reused)
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

    def _serve(
        self, predictor: Predictor, origin: str, duration_s: float, reused_trees: bool = False
    ) -> None:
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
            reused_trees=reused_trees,
            duration_s=round(duration_s, 6),
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


def _build_predictor(fetched: Fetched, current: Predictor | None) -> Predictor:
    model_set = verify_model_set(fetched.manifest, fetched.files)
    if current is not None and current.same_trees(fetched.manifest):
        return current.recalibrated(model_set)  # offsets only: no recompile
    return Predictor.from_model_set(model_set)
