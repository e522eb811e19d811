"""The training service: window, intake, retrain scheduler, persistence and read views.

One instance lives in the app's lifespan (``start`` / ``stop``). The event loop only
validates batches, answers reads and schedules work; inserting runs in the intake thread,
retraining in the scheduler's trainer thread, and saves and age-outs in the default
thread pool. Start-up restores the persisted window and, when the store has no usable
current version, publishes the prior; shutdown drains the intake and saves the window.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import numpy as np
import orjson
import xgboost as xgb

from shared.artifacts import Manifest, ModelStore
from shared.errors import ArtifactError, IngestSaturated, ServiceError
from shared.logging import log_event
from shared.prior import publish_prior
from shared.schemas import Columns, loads, parse_training_entries, require_list
from training_server.config import TrainingSettings
from training_server.intake import Intake
from training_server.metrics import TrainingMetrics
from training_server.scheduler import RetrainScheduler, log_task_failure
from training_server.seeding import seed_at_start
from training_server.trainer import Trainer, TrainingOutcome
from training_server.window import StratifiedWindow, stratum_label

log = logging.getLogger(__name__)


def _dump_trees(store: ModelStore, version: str, name: str) -> bytes:
    model_set = store.load(version)
    booster = xgb.Booster(params={"nthread": 1})
    booster.load_model(bytearray(model_set.files[name]))
    trees = [orjson.loads(tree) for tree in booster.get_dump(dump_format="json")]
    return orjson.dumps(trees)


class TrainingService:
    """Owns every moving part of the training server (see the module docstring)."""

    def __init__(self, settings: TrainingSettings, metrics: TrainingMetrics) -> None:
        self.settings = settings
        self.metrics = metrics
        self.store = ModelStore(settings.store_dir, settings.keep_versions)
        self.window = StratifiedWindow(settings.stratum_cap, settings.max_age_s)
        self.intake = Intake(self.window, settings.max_pending_samples, self._on_inserted)
        self.scheduler = RetrainScheduler(
            settings, self.window, Trainer(self.store, settings), metrics, self._on_published
        )
        self._maintenance: asyncio.Task[None] | None = None
        self._persist_lock = asyncio.Lock()
        self._ingesting = 0
        self._manifest: Manifest | None = None
        self._tree_dumps: dict[tuple[str, str], bytes] = {}
        self.samples_accepted = 0
        self.rejected_requests: dict[str, int] = {}
        self.rejected_samples: dict[str, int] = {}
        self._published_at_s = time.time()
        metrics.bind(
            lambda: self.window.size, lambda: len(self.window.strata_sizes()), self._pending, self.model_age_s
        )
        metrics.bind_model(lambda: self._manifest, self.store)

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        restored = await asyncio.to_thread(self._restore_window)
        manifest = await asyncio.to_thread(self._ensure_model)
        self._set_current(manifest)
        self.intake.start()
        self.scheduler.start()
        if restored and (manifest.kind == "prior" or not self._matches_settings(manifest)):
            await self.scheduler.request(wait=False)  # a restored window can replace the prior now
        self._maintenance = asyncio.create_task(self._maintenance_loop(), name="window-maintenance")
        self._maintenance.add_done_callback(log_task_failure)
        log_event(log, "training_server_started", window_samples=restored, version=manifest.version)

    async def stop(self) -> None:
        await asyncio.to_thread(self.intake.close)  # inserts what was already accepted
        if self._maintenance is not None:
            self._maintenance.cancel()
            await asyncio.gather(self._maintenance, return_exceptions=True)
        await self.scheduler.stop()
        async with self._persist_lock:
            saved = await asyncio.to_thread(self.window.save, self.settings.window_path)
        log_event(log, "training_server_stopped", window_samples_saved=saved)

    def _restore_window(self) -> int:
        path = self.settings.window_path
        try:
            return self.window.load(path, time.time())
        except ValueError as exc:
            corrupt = path.with_name(path.name + f".corrupt-{int(time.time())}")
            path.rename(corrupt)
            log_event(log, "window_restore_failed", logging.ERROR, error=str(exc), moved_to=str(corrupt))
            return 0

    def _ensure_model(self) -> Manifest:
        """Publish the prior when the store has no usable current version (cold start), or the
        ``--seed-bundle`` when the store has no trained version yet."""
        seeded = seed_at_start(self.store, self.settings)
        if seeded is not None:
            return seeded
        try:
            return self.store.load().manifest
        except ArtifactError as exc:
            if self.store.current_version() is not None:
                log_event(log, "current_version_unusable", logging.ERROR, error=str(exc))
        version = publish_prior(self.store, self.settings.quantile, self.settings.objective)
        log_event(log, "prior_published", version=version)
        return self.store.read_manifest(version)

    def _matches_settings(self, manifest: Manifest) -> bool:
        s = self.settings
        return manifest.objective == s.objective and (
            s.objective == "mean" or manifest.quantile == s.quantile
        )

    # ---- ingestion -------------------------------------------------------------------------
    async def ingest(self, read_body: Callable[[], Awaitable[bytes]], authorize: Callable[[], None]) -> int:
        """Authorize, read, validate and queue one bulk request; returns the samples accepted."""
        started = time.perf_counter()
        entries: list[Any] | None = None
        try:
            authorize()
            if self._ingesting >= self.settings.max_concurrent_ingest_requests:
                raise IngestSaturated("Too many ingest requests in progress; retry later", retry_after_s=1.0)
            self._ingesting += 1
            try:
                body = await read_body()
            finally:
                self._ingesting -= 1
            entries = require_list(loads(body), "entries", max_items=self.settings.max_entries_per_request)
            now_s = time.time()
            columns, timestamps = parse_training_entries(entries, now_s=now_s)
            columns, timestamps = self._keep_fresh(columns, timestamps, now_s)
            if len(timestamps):
                self.intake.submit(columns, timestamps)
        except ServiceError as exc:
            self.metrics.reject(exc.reason, len(entries) if entries is not None else 0)
            self.rejected_requests[exc.reason] = self.rejected_requests.get(exc.reason, 0) + 1
            samples = len(entries) if entries is not None else 0
            self.rejected_samples[exc.reason] = self.rejected_samples.get(exc.reason, 0) + samples
            raise
        n = len(entries)
        self.samples_accepted += n
        self.metrics.samples_accepted.inc(n)
        self.metrics.ingest_rows.observe(n)
        self.metrics.ingest_seconds.observe(time.perf_counter() - started)
        return n

    def _keep_fresh(
        self, columns: Columns, timestamps: np.ndarray, now_s: float
    ) -> tuple[Columns, np.ndarray]:
        """Accepted samples older than ``max_age_s`` are dropped at once (they must not evict
        fresh ones); timestamps ahead of our clock (sender clock skew) count as now."""
        timestamps = np.minimum(timestamps, now_s)
        fresh = timestamps >= now_s - self.settings.max_age_s
        if fresh.all():
            return columns, timestamps
        self.metrics.samples_evicted.labels("stale").inc(int(len(fresh) - fresh.sum()))
        return {name: column[fresh] for name, column in columns.items()}, timestamps[fresh]

    def _on_inserted(self, inserted: int, evicted: int) -> None:
        """Intake-thread callback."""
        if evicted:
            self.metrics.samples_evicted.labels("cap").inc(evicted)
        self.scheduler.on_inserted(inserted)

    async def retrain(self, wait: bool) -> TrainingOutcome | None:
        return await self.scheduler.request(wait)

    def _on_published(self, version: str) -> None:
        self._set_current(self.store.read_manifest(version))

    def adopt(self, manifest: Manifest) -> None:
        """Serve a version published outside the trainer (``POST /model/import``)."""
        self._set_current(manifest)

    def _pending(self) -> int:
        return self.intake.pending_samples

    def model_age_s(self) -> float:
        """Seconds since the serving version was published (0 before there is one)."""
        return max(0.0, time.time() - self._published_at_s) if self._manifest is not None else 0.0

    def _set_current(self, manifest: Manifest) -> None:
        self._manifest = manifest
        self._published_at_s = datetime.fromisoformat(manifest.created_at).timestamp()
        self.metrics.set_version(manifest.version, manifest.kind)
        for name in manifest.models:
            entry = manifest.metrics.get(name)
            overall = entry.get("overall") if isinstance(entry, dict) else None
            self.metrics.set_model_metrics(name, "current", overall)

    # ---- persistence -----------------------------------------------------------------------
    async def _maintenance_loop(self) -> None:
        s = self.settings
        saved_mutations = self.window.mutations
        next_save = time.monotonic() + s.persist_interval_s
        while True:
            await asyncio.sleep(min(5.0, s.persist_interval_s))
            try:
                aged = await asyncio.to_thread(self.window.age_out, time.time())
                if aged:
                    self.metrics.samples_evicted.labels("age").inc(aged)
                if time.monotonic() >= next_save:
                    next_save = time.monotonic() + s.persist_interval_s
                    mutations = self.window.mutations
                    if mutations != saved_mutations:
                        async with self._persist_lock:
                            await asyncio.to_thread(self.window.save, s.window_path)
                        saved_mutations = mutations
            except Exception as exc:  # a full disk must not stop ingestion; retry next tick
                log_event(log, "window_maintenance_failed", logging.ERROR, error=repr(exc))

    async def flush(self) -> int:
        """Drop every sample (window, intake queue and the persisted copy); models stay as they are."""
        async with self._persist_lock:
            dropped = self.intake.discard_pending() + self.window.clear()
            self.settings.window_path.unlink(missing_ok=True)
        self.scheduler.forget_new_samples()
        self.metrics.samples_evicted.labels("flush").inc(dropped)
        log_event(log, "window_flushed", samples=dropped)
        return dropped

    # ---- views -----------------------------------------------------------------------------
    @property
    def current(self) -> Manifest | None:
        return self._manifest

    async def tree_dump(self, name: str) -> bytes:
        """The current ``name`` booster as a JSON array of trees (cached per version); ``[]`` if none."""
        manifest = self._manifest
        if manifest is None or name not in manifest.models:
            return b"[]"
        key = (manifest.version, name)
        cached = self._tree_dumps.get(key)
        if cached is None:
            cached = await asyncio.to_thread(_dump_trees, self.store, manifest.version, name)
            self._tree_dumps = {k: v for k, v in self._tree_dumps.items() if k[0] == manifest.version}
            self._tree_dumps[key] = cached
        return cached

    def status(self) -> dict[str, Any]:
        s = self.settings
        m = self._manifest
        strata = self.window.strata_sizes()
        return {
            "is_ready": m is not None,
            "model_type": "xgboost",
            "objective_type": s.objective,
            "quantile": s.quantile,
            "current_version": m.version if m else None,
            "is_prior": m.kind == "prior" if m else None,
            "current_created_at": m.created_at if m else None,
            "current_age_s": round(self.model_age_s(), 3) if m else None,
            "current_training_samples": m.training_samples if m else {},
            "current_metrics": {name: (m.metrics.get(name) or {}).get("overall") for name in m.models}
            if m
            else {},
            "window": {
                "samples": self.window.size,
                "strata": {stratum_label(k): v for k, v in strata.items()},
                "stratum_cap": s.stratum_cap,
                "max_age_s": s.max_age_s,
            },
            "intake": {
                "pending_samples": self.intake.pending_samples,
                "max_pending_samples": s.max_pending_samples,
                "accepted_samples": self.samples_accepted,
                "rejected_requests": dict(self.rejected_requests),
                "rejected_samples": dict(self.rejected_samples),
            },
            "training": self.scheduler.status(),
        }
