"""Deterministic discrete-event simulator of a pool of vLLM-like serving pods.

A ``Cluster`` owns one ``SimPod`` per pod and a simulated clock. The caller drives it in
arrival order: ``advance_to(arrival)`` runs every pod up to that instant and returns what
completed; ``candidate_rows(req)`` gives the wire feature row of each pod for the request;
``route(req, pod)`` enqueues it. ``simulate`` is that loop with a routing callback.

Nothing here reads the wall clock, and every random draw comes from seeded generators, so the
same workload, pods, seed and (deterministic) routing give identical completions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from stack.sim_pod import Completion, FirstToken, PodConfig, SimPod
from stack.workload import SimRequest, Workload, WorkloadConfig

__all__ = [
    "Cluster",
    "Completion",
    "FirstToken",
    "PodConfig",
    "SimRequest",
    "Workload",
    "WorkloadConfig",
    "round_robin",
    "simulate",
]

Chooser = Callable[[SimRequest, list[dict[str, Any]]], int]


class Cluster:
    """A pool of simulated pods sharing one simulated clock (``now_s``, seconds)."""

    def __init__(self, pods: list[PodConfig] | int, seed: int = 0) -> None:
        configs = [PodConfig() for _ in range(pods)] if isinstance(pods, int) else list(pods)
        if not configs:
            raise ValueError("a cluster needs at least one pod")
        # Distinct, reproducible per-pod streams for step jitter.
        self.pods = [SimPod(i, cfg, seed * 1_000_003 + i) for i, cfg in enumerate(configs)]
        self.now_s = 0.0
        self._rows_for: tuple[int, list[dict[str, Any]]] | None = None

    def __len__(self) -> int:
        return len(self.pods)

    def advance_to(self, t_s: float) -> list[Completion]:
        """Run all pods up to ``t_s``; return the requests that completed, in completion order."""
        if t_s < self.now_s:
            raise ValueError(f"cannot go back in time: {t_s} < now_s={self.now_s}")
        done: list[Completion] = []
        for pod in self.pods:
            pod.advance_to(t_s, done)
        self.now_s = t_s
        if len(self.pods) > 1:
            done.sort(key=_finished_s)
        self._rows_for = None
        return done

    def record_first_tokens(self) -> None:
        """From now on, remember each request's first token for ``take_first_tokens``."""
        for pod in self.pods:
            if pod.first_tokens is None:
                pod.first_tokens = []

    def take_first_tokens(self) -> list[FirstToken]:
        """The first tokens since the last call, in time order (needs ``record_first_tokens``)."""
        out: list[FirstToken] = []
        for pod in self.pods:
            if pod.first_tokens:
                out.extend(pod.first_tokens)
                pod.first_tokens.clear()
        out.sort(key=lambda f: f.at_s)
        return out

    def candidate_rows(self, req: SimRequest) -> list[dict[str, Any]]:
        """One wire feature row per pod (in pod order) for routing ``req`` at ``now_s``."""
        rows = [pod.feature_row(req) for pod in self.pods]
        self._rows_for = (req.request_id, rows)
        return [dict(row) for row in rows]  # callers may mutate theirs

    def route(self, req: SimRequest, pod: int) -> None:
        """Enqueue ``req`` on ``pod`` at ``now_s``; its Completion will carry this pod's row."""
        if not 0 <= pod < len(self.pods):
            raise ValueError(f"pod index {pod} out of range 0..{len(self.pods) - 1}")
        # Rows are unchanged until the clock moves or a request is routed, so reuse them.
        if self._rows_for is not None and self._rows_for[0] == req.request_id:
            row = self._rows_for[1][pod]
        else:
            row = self.pods[pod].feature_row(req)
        self._rows_for = None
        self.pods[pod].enqueue(req, self.now_s, row)

    def drain(self) -> list[Completion]:
        """Run until every routed request has completed; ``now_s`` moves to the last event."""
        done: list[Completion] = []
        for pod in self.pods:
            pod.advance_to(math.inf, done)
        done.sort(key=_finished_s)
        self.now_s = max([self.now_s, *(pod.clock_s for pod in self.pods)])
        self._rows_for = None
        return done


def simulate(workload: Iterable[SimRequest], cluster: Cluster, choose: Chooser) -> list[Completion]:
    """Route every arrival with ``choose(req, rows) -> pod index``, then drain the cluster."""
    done: list[Completion] = []
    for req in workload:
        done.extend(cluster.advance_to(req.arrival_s))
        cluster.route(req, choose(req, cluster.candidate_rows(req)))
    done.extend(cluster.drain())
    return done


def round_robin() -> Chooser:
    """A chooser cycling over the pods, ignoring their state (the cheapest baseline)."""
    counter = 0

    def choose(req: SimRequest, rows: list[dict[str, Any]]) -> int:
        nonlocal counter
        counter += 1
        return (counter - 1) % len(rows)

    return choose


def _finished_s(c: Completion) -> float:
    return c.finished_s
