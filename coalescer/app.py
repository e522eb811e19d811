"""``create_app(settings)``: the coalescer's FastAPI app and the lifespan that owns its moving parts.

The lifespan creates the httpx client (probes, status, reload, relay), the replica pool and its
hot-path connections, the batcher, the sample relay, and their background tasks (prober, DNS
refresher, relay sender; the batcher's dispatcher runs inline on events and on its own timer, see
``coalescer.batcher``). It keeps a reference to every task, logs any that dies, and on shutdown
cancels and awaits them, fails what still waits, stops the batch calls in flight, and gives the
relay ``relay_drain_s`` to deliver buffered samples.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI

from coalescer.batcher import SLOW_CALL_SHARE, Batcher
from coalescer.config import CoalescerSettings
from coalescer.metrics import CoalescerMetrics, ReplicaCollector, create_metrics, gauge_from
from coalescer.predict import ASGIApp, PredictionEndpoints
from coalescer.relay import AimdRate, SampleRelay
from coalescer.training_proxy import TrainingProxy
from coalescer.upstreams import ReplicaPool, Resolver, resolve_all
from shared.errors import ServiceError
from shared.http import install_error_handlers
from shared.logging import log_event

log = logging.getLogger(__name__)


@dataclass
class Runtime:
    """What the routes use: settings and metrics from the start, the rest once the lifespan runs."""

    settings: CoalescerSettings
    metrics: CoalescerMetrics
    resolver: Resolver
    http: httpx.AsyncClient | None = None
    pool: ReplicaPool | None = None
    batcher: Batcher | None = None
    relay: SampleRelay | None = None
    training: TrainingProxy | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(_report_exit)
        self.tasks.append(task)


def _report_exit(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log_event(
            log, "background_task_failed", logging.ERROR, task=task.get_name(), error=repr(task.exception())
        )


class CoalescerApp(FastAPI):
    """FastAPI, except that POSTs to the prediction paths go straight to their raw ASGI handlers.

    They skip the middleware stack and the router (see ``coalescer.predict``); everything else,
    lifespan included, is plain FastAPI.
    """

    fast_paths: dict[str, ASGIApp]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.fast_paths.get(scope["path"])
            if handler is not None:
                await handler(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def create_app(settings: CoalescerSettings, *, resolver: Resolver = resolve_all) -> CoalescerApp:
    """Build the app; nothing runs until its lifespan starts (``resolver`` is injectable for tests)."""
    from coalescer.routes import build_routes  # routes import Runtime from here

    metrics = create_metrics()
    rt = Runtime(settings, metrics, resolver)
    app = CoalescerApp(
        title="coalescer",
        description="Batches scheduler prediction calls to prediction replicas; relays training samples.",
        lifespan=lambda _app: _lifespan(rt),
    )
    app.state.runtime = rt

    def count_rejection(exc: ServiceError) -> None:
        metrics.rejections.labels(exc.reason).inc()

    def batcher() -> Batcher:
        assert rt.batcher is not None, "the lifespan has not started"
        return rt.batcher

    app.fast_paths = PredictionEndpoints(
        batcher,
        default_deadline_ms=settings.deadline_ms,
        max_body_bytes=settings.max_body_bytes,
        count_call=lambda name: metrics.callers.labels(name).inc,
        time_call=lambda name, code: metrics.call_seconds.labels(name, str(code)).observe,
        on_error=count_rejection,
    ).handlers()
    app.router.routes.extend(build_routes(rt, app.fast_paths))
    install_error_handlers(app, on_error=count_rejection)
    return app


@asynccontextmanager
async def _lifespan(rt: Runtime) -> AsyncIterator[None]:
    s = rt.settings
    token = s.token
    headers = {"authorization": f"Bearer {token}"} if token else {}
    rt.http = httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(2.0), follow_redirects=False)
    rt.pool = pool = ReplicaPool(
        max_inflight=s.max_inflight_per_replica, eject_cooldown_s=s.eject_cooldown_s, http=rt.http
    )
    if s.prediction_urls:
        pool.set_urls(s.prediction_urls)
    elif s.prediction_dns:
        await pool.refresh_dns(s.prediction_dns, rt.resolver)
    rt.batcher = batcher = Batcher(
        pool,
        rt.metrics,
        window_s=s.batch_window_s,
        max_batch_rows=s.max_batch_rows,
        max_queued_rows=s.max_queued_rows,
        max_wait_share=s.max_queue_wait_share,
        slow_call_s=s.deadline_ms / 1000.0 * SLOW_CALL_SHARE,
        eager_inflight=s.eager_inflight_per_replica,
        max_inflight=s.max_inflight_per_replica,
        upstream_headers=f"Authorization: Bearer {token}\r\n" if token else "",
    )
    if s.training_url:
        rate = AimdRate(
            min_rate=s.relay_min_rate,
            max_rate=s.relay_max_rate,
            initial=s.relay_initial_rate or s.relay_max_rate,
            step=s.relay_aimd_step,
            factor=s.relay_aimd_factor,
        )
        rt.relay = SampleRelay(
            s.training_url,
            rt.http,
            rt.metrics,
            rate,
            capacity=s.relay_buffer_samples,
            batch_samples=s.relay_batch_samples,
            timeout_s=s.relay_timeout_s,
            token=token,
        )
    if s.training_url:
        rt.training = TrainingProxy(
            s.training_url,
            ttl_s=s.training_cache_s,
            max_bytes=s.training_cache_max_bytes,
            timeout_s=s.training_timeout_s,
            token=token,
        )
    _register_gauges(rt)
    rt.spawn(pool.run_prober(s.probe_interval_s), "prober")
    if s.prediction_dns:
        rt.spawn(pool.run_dns(s.prediction_dns, rt.resolver, s.dns_refresh_s), "dns_refresher")
    if rt.relay is not None:
        rt.spawn(rt.relay.run(), "relay")
    log_event(
        log,
        "coalescer_started",
        replicas=[r.url for r in pool.replicas],
        dns=s.prediction_dns,
        training_url=s.training_url,
        window_us=s.batch_window_us,
        max_batch_rows=s.max_batch_rows,
    )
    try:
        yield
    finally:
        for task in rt.tasks:
            task.cancel()
        await asyncio.gather(*rt.tasks, return_exceptions=True)
        rt.tasks.clear()
        await batcher.close()
        if rt.relay is not None:
            await rt.relay.drain(s.relay_drain_s)
        await pool.close()
        if rt.training is not None:
            await rt.training.close()
        await rt.http.aclose()
        log_event(log, "coalescer_stopped")


def _register_gauges(rt: Runtime) -> None:
    registry = rt.metrics.registry
    batcher, pool, relay = rt.batcher, rt.pool, rt.relay
    assert batcher is not None and pool is not None
    gauge_from(
        registry, "coalescer_queue_rows", "Rows waiting for an upstream slot", lambda: batcher.queued_rows
    )
    gauge_from(
        registry,
        "coalescer_queue_callers",
        "Callers waiting for an upstream slot",
        lambda: batcher.queued_callers,
    )
    gauge_from(
        registry, "coalescer_inflight_calls", "Upstream batch calls in flight", lambda: batcher.inflight_calls
    )
    gauge_from(
        registry, "coalescer_inflight_rows", "Rows in upstream calls in flight", lambda: batcher.inflight_rows
    )
    gauge_from(registry, "coalescer_replicas", "Known prediction replicas", lambda: len(pool.replicas))
    gauge_from(
        registry, "coalescer_replicas_healthy", "Replicas receiving traffic", lambda: pool.healthy_count
    )
    registry.register(ReplicaCollector(lambda: pool.replicas))
    if relay is not None:
        gauge_from(
            registry, "coalescer_relay_rate", "Relay send rate, batches per second", lambda: relay.rate.rate
        )
        gauge_from(
            registry,
            "coalescer_relay_buffer_samples",
            "Samples waiting to be relayed",
            lambda: relay.buffered,
        )
