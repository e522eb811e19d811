"""``Runtime``: what the coalescer's routes use, created by ``create_app`` and filled by its lifespan."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import httpx

from coalescer.batcher import Batcher
from coalescer.config import CoalescerSettings
from coalescer.loop_lag import LoopLagMonitor
from coalescer.metrics import CoalescerMetrics
from coalescer.relay import SampleRelay
from coalescer.training_proxy import TrainingProxy
from coalescer.upstreams import ReplicaPool, Resolver
from shared.logging import log_task_failure


@dataclass
class Runtime:
    """Settings and metrics from the start, the rest once the lifespan runs."""

    settings: CoalescerSettings
    metrics: CoalescerMetrics
    resolver: Resolver
    lag: LoopLagMonitor
    http: httpx.AsyncClient | None = None
    pool: ReplicaPool | None = None
    batcher: Batcher | None = None
    relay: SampleRelay | None = None
    training: TrainingProxy | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        task.add_done_callback(log_task_failure)
        self.tasks.append(task)
