"""Replay a simulated workload through the real HTTP API, predicting every request before it runs.

The built-in simulator (``stack.simulator``) is driven arrival by arrival, as a scheduler would
see it. At each arrival the pods' routing-time rows go to ``POST /predict/bulk/strict`` (one row
per pod, as a scheduler sends them) and the request is routed independently of the answer
(randomly or round-robin, so the pod states, and hence the strata, vary). Completed requests are
buffered and posted to ``POST /add_training_data_bulk`` every simulated second (the Go client's
flush period) in completion order, without timestamps (the client's zero time: "now"), so the
training server retrains and publishes exactly as in production. A request's prediction is thus
made before its own sample, or any sample completed after its routing, was sent. With
``feedback="first-token"`` a request's TTFT goes out as a TTFT-only sample (``actual_tpot_ms``
0) at the flush after its first token, and its TPOT as a TPOT-only sample after it completed: the
way llm-d's EPP reports while it streams the response, so a TTFT is learned one request duration
sooner. ``feedback="epp"`` is that, with the rest of what today's EPP (llm-d-router's
predicted-latency plugin) puts in its samples: each carries the prediction the request was routed
on (``predicted_ttft_ms`` or ``predicted_tpot_ms``), and the TPOT sample the pod's load *when the
request finished* (the EPP refreshes its metrics at every token), with a prefix-cache score and a
generated-token count of 0, so TPOT is learned from rows that are not the ones it is asked about
at routing. With ``feedback="arrival"`` the workload is simulated first (the routing does not depend
on the answers) and then replayed in arrival order, each request's sample posted at the first
flush after its prediction, with its actual latencies: the protocol of a replay of recorded
requests (and of ``bench.accuracy_trace``'s), where the outcome of every request is known as soon
as it was predicted.

``speed`` caps simulated seconds per wall second, which fixes how stale a model is (in simulated
time) while a retrain runs; the training server's retrain triggers are set by the caller.

``replay_stream`` is the same loop over any request stream and cluster, with optional events
(callbacks run once the simulated clock reaches their time, e.g. slowing the pods down) and an
optional in-process baseline (``bench.accuracy_naive``) that learns from exactly the batches the
training server is sent, after they are sent, and predicts each routed pod's row with the model it
had at routing time (batched per flush: its model only changes when it learns).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, get_args

import httpx
import numpy as np
import orjson

from shared.artifacts import MODEL_NAMES
from shared.schemas import parse_rows
from stack.simulator import Cluster, Completion, FirstToken, PodConfig, SimRequest, Workload, WorkloadConfig

if TYPE_CHECKING:  # annotations only: --code may run a checkout from before shared.wire_fields
    from bench.accuracy_naive import SlidingWindowBaseline
    from shared.wire_fields import Columns

Routing = Literal["random", "round-robin"]
# When a request's samples are posted: both targets once it completed, or (as llm-d's EPP does
# while it streams the response) a TTFT-only sample at its first token and a TPOT-only one at the end;
# "epp" also as today's EPP fills them (see the module docstring). Or, replaying a simulated record
# in arrival order, both at once right after the prediction.
Feedback = Literal["completion", "first-token", "epp", "arrival"]
FEEDBACKS: tuple[Feedback, ...] = get_args(Feedback)
STREAMING: tuple[Feedback, ...] = ("first-token", "epp")  # a TTFT sample at the first token
MAX_BATCH = 1000  # the training API's per-call flush size


@dataclass(frozen=True)
class ReplayConfig:
    pods: int = 8
    rate_rps: float = 40.0
    duration_s: float = 300.0  # simulated
    seed: int = 0
    routing: Routing = "random"
    speed: float = 10.0  # simulated seconds per wall second; 0 = as fast as the calls allow
    flush_every_s: float = 1.0  # simulated
    call_timeout_s: float = 10.0
    send_predictions: bool = False  # add predicted_ttft_ms / predicted_tpot_ms to each sample (wire 1)
    feedback: Feedback = "completion"

    @property
    def sends_predictions(self) -> bool:
        """Whether samples carry the prediction they were routed on (today's EPP always sends it)."""
        return self.send_predictions or self.feedback == "epp"


@dataclass
class ReplayResult:
    """Per routed request (in completion order): its prediction, its outcome and its routing-time row."""

    config: ReplayConfig
    rows: list[dict[str, Any]] = field(default_factory=list)
    predicted_ttft_ms: list[float] = field(default_factory=list)
    predicted_tpot_ms: list[float] = field(default_factory=list)
    actual_ttft_ms: list[float] = field(default_factory=list)
    actual_tpot_ms: list[float] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)
    # per model: "prior" if the prior's trees answered (the version's other model may be trained)
    kinds: dict[str, list[str]] = field(default_factory=lambda: {m: [] for m in MODEL_NAMES})
    routed_at_s: list[float] = field(default_factory=list)
    naive_ttft_ms: list[float] = field(default_factory=list)  # NaN: no baseline (or none fitted yet)
    naive_tpot_ms: list[float] = field(default_factory=list)
    samples_sent: int = 0
    throttled: int = 0
    prediction_calls: int = 0
    wall_s: float = 0.0
    sim_s: float = 0.0

    def columns(self) -> Columns:
        return parse_rows(self.rows)

    def set_naive(self, naive: dict[int, tuple[float, float]], completed: Sequence[int]) -> None:
        """The naive baseline's (TTFT, TPOT) answers, by request id, in the order of ``rows``
        (``completed``: the request ids in that order); NaN where it had none."""
        missing = (math.nan, math.nan)
        self.naive_ttft_ms = [naive.get(rid, missing)[0] for rid in completed]
        self.naive_tpot_ms = [naive.get(rid, missing)[1] for rid in completed]

    def array(self, name: str) -> np.ndarray:
        values: list[Any] = getattr(self, name)
        return np.asarray(values, dtype=object if name == "versions" else np.float64)

    def trained(self, model: str) -> np.ndarray:
        """Per request: whether trained trees of ``model`` answered it (not the prior's)."""
        return np.asarray(self.kinds[model], dtype=object) != "prior"


Event = tuple[float, Callable[[Cluster], None]]  # (simulated time, action on the cluster)


def replay(cfg: ReplayConfig, prediction_url: str, training_url: str) -> ReplayResult:
    """Run the whole workload; raises on any failed prediction call or rejected sample batch."""
    workload = Workload(
        WorkloadConfig(rate_rps=cfg.rate_rps, num_requests=None, duration_s=cfg.duration_s, seed=cfg.seed)
    )
    cluster = Cluster([PodConfig() for _ in range(cfg.pods)], seed=cfg.seed)
    return replay_stream(workload, cluster, cfg, prediction_url, training_url)


def replay_stream(
    requests: Iterable[SimRequest],
    cluster: Cluster,
    cfg: ReplayConfig,
    prediction_url: str,
    training_url: str,
    *,
    events: Sequence[Event] = (),
    baseline: SlidingWindowBaseline | None = None,
) -> ReplayResult:
    """Replay ``requests`` (time-ordered) on ``cluster``; ``cfg`` gives the pace, flush period and routing."""
    choose = chooser(cfg.routing, cfg.seed)
    result = ReplayResult(cfg)
    asked: dict[int, tuple[float, float, str, dict[str, str]]] = {}
    routed: list[tuple[int, dict[str, Any]]] = []  # routed since the last flush (for the baseline)
    naive: dict[int, tuple[float, float]] = {}
    completed: list[int] = []  # request ids in the order of result.rows
    buffer: list[dict[str, Any]] = []
    pending = sorted(events, key=lambda e: e[0])
    with httpx.Client(timeout=cfg.call_timeout_s) as client:
        predict_url = prediction_url.rstrip("/") + "/predict/bulk/strict"
        ingest_url = training_url.rstrip("/") + "/add_training_data_bulk"

        def flush() -> None:
            for start in range(0, len(buffer), MAX_BATCH):
                result.throttled += _post_samples(client, ingest_url, buffer[start : start + MAX_BATCH])
            result.samples_sent += len(buffer)
            if baseline is not None:
                # The baseline's model only changes in learn(), so the rows routed since the last
                # flush are predicted now, in one call, by the model that served their routing.
                baseline.answer(routed, naive)
                routed.clear()
                baseline.learn(buffer)
            buffer.clear()

        streaming = cfg.feedback in STREAMING
        if streaming:
            cluster.record_first_tokens()

        def complete(done: list[Completion]) -> None:
            if streaming:  # first tokens come before their own completions
                for f in cluster.take_first_tokens():
                    buffer.append(first_token_sample(f, asked[f.request.request_id], cfg))
            for c in done:
                rid = c.request.request_id
                prediction = asked.pop(rid)
                record(result, c, prediction)
                completed.append(rid)
                buffer.extend(completion_samples(c, prediction, cfg))

        started = time.monotonic()
        next_flush_s = cfg.flush_every_s
        if cfg.feedback == "arrival":
            for c, rows in simulate_first(requests, cluster, choose, pending):
                if cfg.speed > 0:
                    delay = started + c.routed_at_s / cfg.speed - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                if c.routed_at_s >= next_flush_s:
                    flush()
                    next_flush_s = (c.routed_at_s // cfg.flush_every_s + 1) * cfg.flush_every_s
                rid = c.request.request_id
                if baseline is not None:
                    routed.append((rid, c.features))
                prediction = _predict(client, predict_url, rows, c.pod)
                result.prediction_calls += 1
                record(result, c, prediction)
                completed.append(rid)
                buffer.extend(completion_samples(c, prediction, cfg))
            result.sim_s = cluster.now_s
            requests = ()
        for req in requests:
            if cfg.speed > 0:
                delay = started + req.arrival_s / cfg.speed - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            while pending and pending[0][0] <= req.arrival_s:
                at_s, action = pending.pop(0)
                complete(cluster.advance_to(at_s))
                action(cluster)
            complete(cluster.advance_to(req.arrival_s))
            if req.arrival_s >= next_flush_s:
                flush()
                next_flush_s = (req.arrival_s // cfg.flush_every_s + 1) * cfg.flush_every_s
            rows = cluster.candidate_rows(req)
            pod = choose(req, rows)
            if baseline is not None:
                routed.append((req.request_id, rows[pod]))
            asked[req.request_id] = _predict(client, predict_url, rows, pod)
            result.prediction_calls += 1
            cluster.route(req, pod)
        if cfg.feedback != "arrival":
            result.sim_s = cluster.now_s
            complete(cluster.drain())
        flush()
        result.wall_s = time.monotonic() - started
    result.set_naive(naive, completed)
    return result


def first_token_sample(f: FirstToken, prediction: tuple[float, ...], cfg: ReplayConfig) -> dict[str, Any]:
    """The TTFT-only sample a streaming scheduler posts at ``f``'s first token (``cfg.feedback`` in
    ``STREAMING``); ``prediction`` is the request's (TTFT, TPOT, ...) as it was routed."""
    return _entry(f.features, f.ttft_ms, 0.0, prediction[0] if cfg.sends_predictions else None, None)


def completion_samples(
    c: Completion, prediction: tuple[float, ...], cfg: ReplayConfig
) -> list[dict[str, Any]]:
    """What the scheduler posts once ``c`` completed, under ``cfg.feedback`` (see ``Feedback``)."""
    ttft, tpot = prediction[:2] if cfg.sends_predictions else (None, None)
    if cfg.feedback not in STREAMING:
        return [_entry(c.features, c.ttft_ms, c.tpot_ms, ttft, tpot)]
    if c.tpot_ms <= 0:
        return []
    row = c.features
    if cfg.feedback == "epp":  # the EPP's TPOT sample: the pod's load at the last token, no prefix score
        row = {**row, **(c.finished_load or {}), "prefix_cache_score": 0.0, "num_tokens_generated": 0}
    return [_entry(row, 0.0, c.tpot_ms, None, tpot)]


def _entry(
    row: dict[str, Any], ttft_ms: float, tpot_ms: float, sent_ttft: float | None, sent_tpot: float | None
) -> dict[str, Any]:
    entry = {**row, "actual_ttft_ms": ttft_ms, "actual_tpot_ms": tpot_ms}
    if sent_ttft is not None:
        entry["predicted_ttft_ms"] = sent_ttft
    if sent_tpot is not None:
        entry["predicted_tpot_ms"] = sent_tpot
    return entry


def simulate_first(
    requests: Iterable[SimRequest],
    cluster: Cluster,
    choose: Callable[[SimRequest, list[dict[str, Any]]], int],
    events: list[Event],
) -> list[tuple[Completion, list[dict[str, Any]]]]:
    """Every request routed and run to completion (``events`` applied on the way), then in arrival
    order, each with every pod's routing-time row."""
    candidates: dict[int, list[dict[str, Any]]] = {}
    done: list[Completion] = []
    for req in requests:
        while events and events[0][0] <= req.arrival_s:
            at_s, action = events.pop(0)
            done += cluster.advance_to(at_s)
            action(cluster)
        done += cluster.advance_to(req.arrival_s)
        rows = candidates[req.request_id] = cluster.candidate_rows(req)
        cluster.route(req, choose(req, rows))
    done += cluster.drain()
    done.sort(key=lambda c: (c.routed_at_s, c.request.request_id))
    return [(c, candidates.pop(c.request.request_id)) for c in done]


def chooser(routing: Routing, seed: int) -> Callable[[SimRequest, list[dict[str, Any]]], int]:
    """The pod index a request goes to, from its candidate rows: seeded at random (the evidence's
    routing, which does not depend on the predictions), or round-robin by request id."""
    if routing == "round-robin":
        return lambda req, rows: req.request_id % len(rows)
    rng = random.Random(seed)
    return lambda req, rows: rng.randrange(len(rows))


def _predict(
    client: httpx.Client, url: str, rows: list[dict[str, Any]], pod: int
) -> tuple[float, float, str, dict[str, str]]:
    response = client.post(url, content=orjson.dumps({"requests": rows}), headers=_JSON)
    if response.status_code != 200:
        raise RuntimeError(f"prediction call failed: HTTP {response.status_code}: {response.text[:300]}")
    p = orjson.loads(response.content)["predictions"][pod]
    return float(p["ttft_ms"]), float(p["tpot_ms"]), str(p["model_version"]), answer_kinds(p)


def answer_kinds(prediction: dict[str, Any]) -> dict[str, str]:
    """Per model, the kind of trees that answered a prediction: its ``model_kinds`` (or, from a
    server that predates them, the version's ``model_kind`` for both)."""
    kind = str(prediction.get("model_kind", ""))
    per_model = prediction.get("model_kinds") or {}
    return {m: str(per_model.get(m, kind)) for m in MODEL_NAMES}


def _post_samples(client: httpx.Client, url: str, entries: list[dict[str, Any]]) -> int:
    """Post one batch, waiting out 429s (nothing is dropped); returns how many 429s it met."""
    throttled = 0
    body = orjson.dumps({"entries": entries})
    while True:
        response = client.post(url, content=body, headers=_JSON)
        if response.status_code == 202:
            return throttled
        if response.status_code != 429:
            raise RuntimeError(f"samples refused: HTTP {response.status_code}: {response.text[:300]}")
        throttled += 1
        time.sleep(min(float(response.headers.get("retry-after", "1")), 5.0))


def record(result: ReplayResult, c: Completion, asked: tuple[float, float, str, dict[str, str]]) -> None:
    """Append one completed request with ``asked``: its (TTFT, TPOT, version, kinds per model) prediction."""
    ttft, tpot, version, kinds = asked
    result.rows.append(c.features)
    result.predicted_ttft_ms.append(ttft)
    result.predicted_tpot_ms.append(tpot)
    result.actual_ttft_ms.append(c.ttft_ms)
    result.actual_tpot_ms.append(c.tpot_ms)
    result.versions.append(version)
    for model, kind in kinds.items():
        result.kinds[model].append(kind)
    result.routed_at_s.append(c.routed_at_s)


_JSON = {"content-type": "application/json"}
