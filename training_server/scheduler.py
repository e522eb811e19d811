"""When to retrain, and running each retrain off the event loop.

A retrain starts as soon as the trainer is free and enough new samples arrived to matter:
``min_new_samples`` and ``min_new_fraction`` of the window since the last one (at most once per
``retrain_min_gap_s``; the gap does not delay the first run); also when ``retrain_interval_s``
passed with at least one new sample, and at once when requested (``POST /retrain``, or
``request_now`` from the drift detector). Runs happen
one at a time in a dedicated thread whose niceness is raised by ``trainer_nice``, so
ingestion on the event loop keeps priority; XGBoost uses ``training_threads`` threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from shared.logging import log_event, log_task_failure
from training_server.boosting import TrainingCancelled
from training_server.config import TrainingSettings
from training_server.metrics import TrainingMetrics
from training_server.trainer import Trainer, TrainingOutcome
from training_server.window import StratifiedWindow

log = logging.getLogger(__name__)


def lower_priority(nice: int) -> None:
    """Raise the calling thread's niceness (trainer and live-scoring threads; per thread on Linux)."""
    if nice <= 0:
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + nice)
    except (OSError, AttributeError) as exc:
        log_event(log, "trainer_nice_failed", logging.WARNING, error=repr(exc))


class RetrainScheduler:
    """Counts new samples, decides when to retrain, runs the trainer and records outcomes."""

    def __init__(
        self,
        settings: TrainingSettings,
        window: StratifiedWindow,
        trainer: Trainer,
        metrics: TrainingMetrics,
        on_published: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self.window = window
        self.trainer = trainer
        self.metrics = metrics
        self._on_published = on_published
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._inserted_total = 0  # written by the intake thread only
        self._trained_upto = 0  # _inserted_total when the last run took its snapshot
        self._requested = False
        self._request_reason: str | None = None
        self._last_reason: str | None = None
        self._waiters: list[asyncio.Future[TrainingOutcome]] = []
        self._last_started_mono = -float("inf")  # the min gap does not delay the first run
        self._interval_anchor = time.monotonic()  # the interval counts from start, then from each run
        self._last_started_at: str | None = None
        self._running = False
        self._runs = 0
        self.last: TrainingOutcome | None = None

    @property
    def new_samples(self) -> int:
        return self._inserted_total - self._trained_upto

    @property
    def due_new_samples(self) -> int:
        """New samples that make a retrain due: the absolute minimum or the share of the window."""
        s = self.settings
        return max(s.min_new_samples, math.ceil(s.min_new_fraction * self.window.size))

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._interval_anchor = time.monotonic()
        self._executor = ThreadPoolExecutor(
            1, "trainer", initializer=lower_priority, initargs=(self.settings.trainer_nice,)
        )
        self._task = asyncio.create_task(self._run_forever(), name="retrain-scheduler")
        self._task.add_done_callback(log_task_failure)

    async def stop(self) -> None:
        self.trainer.stop.set()  # a running fit ends after its current boosting round
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._executor is not None:
            await asyncio.to_thread(self._executor.shutdown, True, cancel_futures=True)
        for waiter in self._waiters:
            waiter.cancel()

    def on_inserted(self, inserted: int) -> None:
        """Intake-thread callback: count, and wake the loop once enough samples arrived."""
        self._inserted_total += inserted
        due = self.new_samples >= self.due_new_samples
        if due and self._loop is not None and not self._wake.is_set():
            self._loop.call_soon_threadsafe(self._wake.set)

    def forget_new_samples(self) -> None:
        """After a flush: samples counted as new are gone."""
        self._trained_upto = self._inserted_total

    def request_now(self, reason: str) -> None:
        """Retrain as soon as the trainer is free, ignoring the sample and gap triggers (drift).

        Callable from any thread; a request while a run is in progress starts the next run
        right after it. ``reason`` is logged and shown in ``/status`` as the run's trigger.
        """
        if self._loop is None:
            self._request(reason)
            return
        self._loop.call_soon_threadsafe(self._request, reason)

    def _request(self, reason: str) -> None:
        if not self._requested:
            log_event(log, "retrain_requested", reason=reason)
        self._requested = True
        self._request_reason = self._request_reason or reason
        self._wake.set()

    async def request(self, wait: bool) -> TrainingOutcome | None:
        """Retrain as soon as the trainer is free; with ``wait``, return that run's outcome."""
        self._request("requested")
        if not wait:
            return None
        waiter: asyncio.Future[TrainingOutcome] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return await waiter

    async def _run_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wait_until_due()
            waiters, self._waiters = self._waiters, []
            self._last_reason = self._request_reason or "new samples"
            self._requested, self._request_reason = False, None
            self._last_started_mono = self._interval_anchor = time.monotonic()
            self._last_started_at = datetime.now(UTC).isoformat()
            self._running = True
            try:
                outcome = await loop.run_in_executor(self._executor, self._train_once)
            except TrainingCancelled:
                outcome = TrainingOutcome("cancelled", "shutting down")
            except Exception as exc:
                log_event(log, "training_failed", logging.ERROR, error=repr(exc), exc_info=True)
                outcome = TrainingOutcome("failed", repr(exc))
            finally:
                self._running = False
            self._record(outcome)
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(outcome)

    async def _wait_until_due(self) -> None:
        s = self.settings
        while True:
            now = time.monotonic()
            since_run = now - self._last_started_mono
            since_anchor = now - self._interval_anchor
            new = self.new_samples
            due = new >= self.due_new_samples
            if self._requested:
                return
            if due and since_run >= s.retrain_min_gap_s:
                return
            if new > 0 and since_anchor >= s.retrain_interval_s:
                self._request_reason = "interval"
                return
            # The wake-up only shortens the wait; polling at least every second keeps this correct.
            timeout = 1.0
            if due:
                timeout = min(timeout, s.retrain_min_gap_s - since_run)
            elif new > 0:
                timeout = min(timeout, s.retrain_interval_s - since_anchor)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(timeout, 0.001))

    def _train_once(self) -> TrainingOutcome:
        """Trainer thread: age out, snapshot, train."""
        self._trained_upto = self._inserted_total
        outcome, aged = self.trainer.run_window(self.window, time.time())
        if aged:
            self.metrics.samples_evicted.labels("age").inc(aged)
        return outcome

    def _record(self, outcome: TrainingOutcome) -> None:
        self._runs += 1
        self.last = outcome
        m = self.metrics
        m.training_runs.labels(outcome.outcome).inc()
        m.last_run.set(time.time())
        if outcome.outcome in ("published", "rejected"):
            m.training_seconds.observe(outcome.duration_s)
        for name, summary in outcome.models.items():
            m.set_model_metrics(name, "candidate", summary.get("candidate"))
            if summary.get("candidate") is not None and not summary.get("accepted"):
                m.candidates_rejected.labels(name).inc()
        if outcome.outcome == "published" and outcome.version is not None:
            m.publishes.inc()
            self._on_published(outcome.version)
        level = logging.ERROR if outcome.outcome == "failed" else logging.INFO
        log_event(
            log,
            "training_run",
            level,
            outcome=outcome.outcome,
            trigger=self._last_reason,
            detail=outcome.detail,
            version=outcome.version,
            duration_s=round(outcome.duration_s, 3),
            window_samples=outcome.window_samples,
            models={name: {k: s[k] for k in ("accepted", "reason")} for name, s in outcome.models.items()},
        )

    def status(self) -> dict[str, Any]:
        last = self.last
        return {
            "running": self._running,
            "runs": self._runs,
            "new_samples": self.new_samples,
            "due_new_samples": self.due_new_samples,
            "last_started_at": self._last_started_at,
            "last_trigger": self._last_reason,
            "last_outcome": last.outcome if last else None,
            "last_detail": last.detail if last else None,
            "last_duration_s": last.duration_s if last else None,
            "last_version": last.version if last else None,
            "last_models": last.models if last else {},
        }
