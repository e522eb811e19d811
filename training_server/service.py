"""The training service: window, intake, retrain scheduler, persistence and read views.

One instance lives in the app's lifespan (``start`` / ``stop``). The event loop only
validates batches, answers reads and schedules work; inserting runs in the intake thread,
retraining in the scheduler's trainer thread, and saves and age-outs in the default
thread pool. Every accepted batch is journalled before its 202 (``training_server.persistence``);
start-up restores the snapshot plus the journal and, when the store has no usable current
version, publishes the prior; shutdown drains the journal and the intake and saves the window.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import xgboost as xgb

from shared.artifacts import Manifest
from shared.errors import ArtifactError, CorruptArtifact, IngestSaturated, InvalidInput, ServiceError
from shared.logging import log_event, log_task_failure
from shared.metrics import counter_totals
from shared.model_store import CURRENT_FILE, ModelStore
from shared.prior import publish_prior
from shared.schemas import parse_training_entries, require_entries
from shared.wire_fields import Columns
from training_server.config import TrainingSettings
from training_server.drift import DriftEvent
from training_server.idempotency import MAX_KEY_LENGTH
from training_server.intake import Intake
from training_server.live_scoring import LiveScorer
from training_server.metrics import TrainingMetrics
from training_server.persistence import Persistence
from training_server.scheduler import RetrainScheduler
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
        self.persistence = Persistence(settings, self.window, self.intake, metrics)
        self.live = (
            LiveScorer(self.store, settings, metrics, self._on_drift, self._on_calibrated)
            if settings.live_scoring
            else None
        )
        trainer = Trainer(self.store, settings, self.live.offsets_for if self.live is not None else None)
        self.scheduler = RetrainScheduler(settings, self.window, trainer, metrics, self._on_published)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._maintenance: asyncio.Task[None] | None = None
        self._ingesting = 0
        self._manifest: Manifest | None = None
        self._tree_dumps: dict[tuple[str, str], bytes] = {}
        self._published_at_s = time.time()
        metrics.bind(
            lambda: self.window.size, lambda: len(self.window.strata_sizes()), self._pending, self.model_age_s
        )
        metrics.bind_drift(lambda: self.live.seconds_since_drift() if self.live else None)
        metrics.bind_model(lambda: self._manifest, self.store)

    # ---- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        self._loop = asyncio.get_running_loop()
        restored = await asyncio.to_thread(self._restore_window)
        manifest = await asyncio.to_thread(self._ensure_model)
        self._set_current(manifest)
        self.intake.start()
        self.scheduler.start()
        if self.live is not None:
            self.live.start()
        if restored and (manifest.kind == "prior" or not self._matches_settings(manifest)):
            await self.scheduler.request(wait=False)  # a restored window can replace the prior now
        self._maintenance = asyncio.create_task(self._maintenance_loop(), name="window-maintenance")
        self._maintenance.add_done_callback(log_task_failure)
        log_event(log, "training_server_started", window_samples=restored, version=manifest.version)

    async def stop(self) -> None:
        await asyncio.to_thread(self.persistence.close)  # hands on what was journalled
        await asyncio.to_thread(self.intake.close)  # inserts what was already accepted
        if self.live is not None:
            await asyncio.to_thread(self.live.close)
        if self._maintenance is not None:
            self._maintenance.cancel()
            await asyncio.gather(self._maintenance, return_exceptions=True)
        await self.scheduler.stop()
        saved = await self.persistence.save()
        log_event(log, "training_server_stopped", window_samples_saved=saved)

    def _restore_window(self) -> int:
        return self.persistence.restore(time.time())

    def _ensure_model(self) -> Manifest:
        """The current version; if it is damaged or gone, the newest version that verifies
        (damaged ones are quarantined); the ``--seed-bundle`` when the store has no trained
        version yet; the prior only when the store has no usable version (cold start)."""
        seeded = seed_at_start(self.store, self.settings)
        if seeded is not None:
            return seeded
        store = self.store
        try:
            return store.load().manifest
        except CorruptArtifact as exc:
            try:
                store.current_version()
            except CorruptArtifact:
                self._quarantined("current", store.quarantine(store.root / CURRENT_FILE), exc)
            else:
                self._damaged(str(store.current_version()), exc)
        except ArtifactError as exc:
            if store.current_version() is not None:
                log_event(log, "current_version_unusable", logging.ERROR, error=str(exc))
        good = store.newest_verified(self._damaged)
        if good is not None:
            store.point_to(good.manifest.version)
            log_event(log, "current_version_restored", logging.WARNING, version=good.manifest.version)
            return good.manifest
        version = publish_prior(self.store, self.settings.quantile, self.settings.objective)
        log_event(log, "prior_published", version=version)
        return self.store.read_manifest(version)

    def _damaged(self, version: str, exc: CorruptArtifact) -> None:
        self._quarantined("version", self.store.quarantine_version(version), exc)

    def _quarantined(self, kind: str, moved_to: Path, exc: Exception) -> None:
        self.metrics.quarantined.labels(kind).inc()
        log_event(
            log, "store_file_quarantined", logging.ERROR, kind=kind, error=str(exc), moved_to=str(moved_to)
        )

    def _matches_settings(self, manifest: Manifest) -> bool:
        s = self.settings
        return manifest.objective == s.objective and (
            s.objective == "mean" or manifest.quantile == s.quantile
        )

    # ---- ingestion -------------------------------------------------------------------------
    async def ingest(
        self,
        read_body: Callable[[], Awaitable[bytes]],
        authorize: Callable[[], None],
        idempotency_key: str | None = None,
    ) -> tuple[int, int]:
        """Authorize, read, validate and journal one bulk request; returns (samples acknowledged,
        of which discarded as older than ``max_age_s``).

        A batch whose ``idempotency_key`` was already accepted returns that batch's outcome and
        inserts nothing (a resend after a timeout)."""
        started = time.perf_counter()
        entries: list[Any] | None = None
        claim = None
        try:
            authorize()
            if idempotency_key is not None:
                if not 0 < len(idempotency_key) <= MAX_KEY_LENGTH or not idempotency_key.isprintable():
                    msg = f"Idempotency-Key must be 1-{MAX_KEY_LENGTH} printable characters"
                    raise InvalidInput([{"type": "value_error", "loc": ["header", "Idempotency-Key"],
                                         "msg": msg, "input": idempotency_key[:MAX_KEY_LENGTH]}])  # fmt: skip
                # Claimed before the body is read: a resend arriving meanwhile waits for this one.
                known, claim = await self.persistence.claim(idempotency_key)
                if known is not None:
                    # Read (and drop) the body all the same: a sender that closes its connection
                    # after the request must not have it reset under unread bytes.
                    await read_body()
                    self.metrics.duplicates.inc()
                    return known
            if self._ingesting >= self.settings.max_concurrent_ingest_requests:
                raise IngestSaturated("Too many ingest requests in progress; retry later", retry_after_s=1.0)
            self._ingesting += 1
            try:
                body = await read_body()
            finally:
                self._ingesting -= 1
            entries = require_entries(body, max_items=self.settings.max_entries_per_request)
            now_s = time.time()
            columns, timestamps = parse_training_entries(entries, now_s=now_s)
            columns, timestamps = self._keep_fresh(columns, timestamps, now_s)
            outcome = (len(entries), len(entries) - len(timestamps))
            await self.persistence.commit(columns, timestamps, idempotency_key, outcome, now_s, claim)
            if self.live is not None and len(timestamps):
                self.live.submit(columns, timestamps)  # scored off the loop; skipped when behind
        except ServiceError as exc:
            self.metrics.reject(exc.reason, len(entries) if entries is not None else 0)
            raise
        finally:
            if claim is not None and idempotency_key is not None:
                self.persistence.release(idempotency_key, claim)
        n = len(entries)
        self.metrics.samples_accepted.inc(n)
        self.metrics.ingest_rows.observe(n)
        self.metrics.ingest_seconds.observe(time.perf_counter() - started)
        return outcome

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

    def _on_drift(self, event: DriftEvent) -> None:
        """Live-scoring thread: a drift event retrains now."""
        self.scheduler.request_now(f"drift: {event.model} regime {event.regime} {event.reason}")

    def _on_calibrated(self, manifest: Manifest) -> None:
        """Live-scoring thread: a calibration version was published."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._set_current, manifest)

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
        # A calibration version keeps its trees' age: it only moved offsets.
        trained_at = (manifest.metrics.get("online_calibration") or {}).get("trained_created_at")
        self._published_at_s = datetime.fromisoformat(trained_at or manifest.created_at).timestamp()
        if self.live is not None:
            self.live.set_current(manifest)
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
        next_age_out = time.monotonic()
        while True:
            await asyncio.sleep(min(1.0, s.persist_interval_s))
            try:
                if time.monotonic() >= next_age_out:
                    next_age_out = time.monotonic() + 5.0
                    aged = await asyncio.to_thread(self.window.age_out, time.time())
                    if aged:
                        self.metrics.samples_evicted.labels("age").inc(aged)
                if time.monotonic() >= next_save or self.persistence.save_due():
                    next_save = time.monotonic() + s.persist_interval_s
                    mutations = self.window.mutations
                    if mutations != saved_mutations:
                        await self.persistence.save()
                        saved_mutations = mutations
            except Exception as exc:  # a full disk must not stop ingestion; retry next tick
                log_event(log, "window_maintenance_failed", logging.ERROR, error=repr(exc))

    async def flush(self) -> int:
        """Drop every sample (window, intake queue, journal and snapshot); models stay as they are."""
        dropped = await self.persistence.flush()
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
                "accepted_samples": counter_totals(self.metrics.samples_accepted).get("", 0),
                "rejected_requests": counter_totals(self.metrics.requests_rejected, nonzero=True),
                "rejected_samples": counter_totals(self.metrics.samples_rejected, nonzero=True),
                "stale_samples_discarded": counter_totals(self.metrics.samples_evicted).get("stale", 0),
            },
            "journal": self.persistence.status(),
            "training": self.scheduler.status(),
            "live": self.live.status() if self.live is not None else None,
        }
