"""``create_app(settings)``: the coalescer's Starlette app and the lifespan that owns its moving parts.

The lifespan creates the httpx client (probes, status, reload, relay), the replica pool and its
hot-path connections, the batcher, the sample relay, and their background tasks (prober, DNS
refresher, loop-lag monitor; the batcher's dispatcher runs inline on events and on its own timer,
see ``coalescer.batcher``). It keeps a reference to every task, logs any that dies, and on
shutdown refuses new samples, cancels and awaits the tasks, fails what still waits and stops the
batch calls in flight. The relay holds nothing acknowledged, so there is nothing to drain.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

from coalescer.batcher import SLOW_CALL_SHARE, Batcher
from coalescer.config import CoalescerSettings
from coalescer.loop_lag import LoopLagMonitor
from coalescer.metrics import ReplicaCollector, create_metrics, gauge_from
from coalescer.predict import PredictionEndpoints
from coalescer.relay import AimdRate, SampleRelay
from coalescer.routes import build_routes
from coalescer.runtime import Runtime
from coalescer.training_proxy import TrainingProxy
from coalescer.upstreams import ReplicaPool, Resolver, resolve_all
from shared.client import bearer_header_lines, bearer_headers
from shared.errors import ServiceError
from shared.http import FastPathApp, install_error_handlers
from shared.logging import log_event

log = logging.getLogger(__name__)


def create_app(settings: CoalescerSettings, *, resolver: Resolver = resolve_all) -> FastPathApp:
    """Build the app; nothing runs until its lifespan starts (``resolver`` is injectable for tests)."""
    metrics = create_metrics()
    rt = Runtime(settings, metrics, resolver, LoopLagMonitor())
    # POSTs to the prediction paths go straight to their raw ASGI handlers (``coalescer.predict``);
    # no OpenAPI schema or ``/docs``: wire-contract.md documents the API.
    app = FastPathApp(lifespan=lambda _app: _lifespan(rt))
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
        loop_lag=rt.lag.lag_s,
        max_lag_share=settings.max_loop_lag_share,
    ).handlers()
    app.router.routes.extend(build_routes(rt, app.fast_paths))
    install_error_handlers(app, on_error=count_rejection)
    return app


@asynccontextmanager
async def _lifespan(rt: Runtime) -> AsyncIterator[None]:
    s = rt.settings
    token = s.token
    rt.http = httpx.AsyncClient(
        headers=bearer_headers(token), timeout=httpx.Timeout(2.0), follow_redirects=False
    )
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
        upstream_headers=bearer_header_lines(token),
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
            max_inflight_bytes=s.relay_max_inflight_bytes,
            timeout_s=s.relay_timeout_s,
            wait_budget_s=s.relay_wait_budget_s,
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
    rt.spawn(rt.lag.run(), "loop_lag_monitor")
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
        # uvicorn has waited (up to relay_wait_budget_s) for the requests in flight; a relay still
        # running now is cancelled with its connection, so its sender gets an error, never a 202.
        if rt.relay is not None:
            rt.relay.close()
        for task in rt.tasks:
            task.cancel()
        await asyncio.gather(*rt.tasks, return_exceptions=True)
        rt.tasks.clear()
        await batcher.close()
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
            registry,
            "coalescer_relay_rate",
            "Relay admission rate (AIMD), sample requests per second",
            lambda: relay.rate.rate,
        )
        gauge_from(
            registry,
            "coalescer_relay_inflight_bytes",
            "Bytes of sample bodies being read or forwarded to the training server",
            lambda: relay.inflight_bytes,
        )
        gauge_from(
            registry,
            "coalescer_relay_inflight_requests",
            "Sample requests being read or forwarded to the training server",
            lambda: relay.inflight_requests,
        )
