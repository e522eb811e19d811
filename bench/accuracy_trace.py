"""Replay a real llm-d H200 trace through the real HTTP API, each entry predicted before it is sent.

The traces (``/work/shared/data/llmd-h200-traces``, see its PROVENANCE.md) are JSON lines of
training entries in recording order, without timestamps, recorded while the load generator
stepped through the stages of the trace's ``-spec.yaml`` (1, 2, 4, 8, 16 QPS for 120 s each).

**Stages.** The line order is time, but where a stage ends is not recorded. ``recover_stages``
places each boundary near where the spec's rates put it (a stage's share of entries is its share
of requests, rate x duration) and then moves it, within a bounded search window, to the steepest
drop of the queue load (``num_request_waiting + num_request_running``): the generator lets the
pods drain between stages, which shows as the load collapsing (on the two overloaded traces from
hundreds of requests to a handful at the last two boundaries). At low load the drains are small
and the early boundaries are uncertain; the report gives each stage's entry count and load so a
reader can judge it.

**Pace.** Each stage's entries are spread evenly over the stage's duration, which gives every
entry a trace time (0 to 600 s). The replay runs that clock at ``speed`` trace seconds per wall
second (1 = the recorded pace): entries due are predicted (one ``POST /predict/bulk/strict`` for
all entries due at that moment), buffered, and posted to ``POST /add_training_data_bulk`` once
per ``flush_every_s`` trace seconds (the Go client's flush period), without timestamps. The
harness never waits for the trainer: a retrain that has not finished simply leaves the older
model serving, as in production. An entry is thus predicted before it, or any later entry, is
sent. Each entry carries a TTFT or a TPOT (the other is 0); only the carried one is scored.
With ``send_predictions`` each posted entry also carries the prediction made for it
(``predicted_ttft_ms`` / ``predicted_tpot_ms``, wire-contract section 1), as newer llm-d routers send.
"""

from __future__ import annotations

import lzma
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import yaml

from bench.accuracy_naive import SlidingWindowBaseline
from bench.accuracy_replay import MAX_BATCH, _post_samples, answer_kinds

TRACES = ("sharegpt-h200", "chatbot-synthetic-h200", "bimodal-h200")
DEFAULT_DIR = Path("/work/shared/data/llmd-h200-traces")
_ACTUALS = ("actual_ttft_ms", "actual_tpot_ms")


@dataclass(frozen=True)
class Trace:
    name: str
    entries: list[dict[str, Any]]
    rates_qps: list[float]
    durations_s: list[float]

    def load(self) -> np.ndarray:
        return np.array([e["num_request_waiting"] + e["num_request_running"] for e in self.entries], float)


def load_trace(name: str, directory: Path = DEFAULT_DIR) -> Trace:
    with lzma.open(directory / f"{name}.jsonl.xz", "rt") as f:
        entries = [orjson.loads(line) for line in f if line.strip()]
    spec = yaml.safe_load((directory / f"{name}-spec.yaml").read_text())
    stages = spec["workload"]["load"]["stages"]
    return Trace(
        name, entries, [float(s["rate_qps"]) for s in stages], [float(s["duration_s"]) for s in stages]
    )


def recover_stages(
    load: np.ndarray, rates: list[float], durations: list[float], search: float = 0.4, k: int = 10
) -> list[int]:
    """Index of the first entry of each stage (the first is 0).

    Boundary ``b`` starts where the spec's request shares put it; it moves, within ``search`` times
    the distance to the neighbouring expected boundaries, to the index with the largest relative
    drop (in log(1 + load)) of the mean load over ``k`` entries before it to the mean over ``k``
    entries from it.
    """
    n = len(load)
    weights = np.asarray(rates) * np.asarray(durations)
    expected = np.concatenate([[0.0], np.cumsum(weights) / weights.sum() * n])
    csum = np.concatenate([[0.0], np.cumsum(load)])
    starts = [0]
    for b in range(1, len(rates)):
        lo = int(max(starts[-1] + k, expected[b] - search * (expected[b] - expected[b - 1]), k))
        hi = int(min(expected[b] + search * (expected[b + 1] - expected[b]), n - k))
        if hi <= lo:
            starts.append(round(expected[b]))
            continue
        idx = np.arange(lo, hi + 1)
        drop = np.log1p((csum[idx] - csum[idx - k]) / k) - np.log1p((csum[idx + k] - csum[idx]) / k)
        starts.append(int(idx[int(np.argmax(drop))]))
    return starts


def trace_times(n: int, starts: list[int], durations: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """(trace seconds, stage index) per entry: each stage's entries spread evenly over its duration."""
    times = np.empty(n)
    stage = np.empty(n, dtype=np.int64)
    bounds = [*starts, n]
    offset = 0.0
    for s, duration in enumerate(durations):
        a, b = bounds[s], bounds[s + 1]
        times[a:b] = offset + duration * (np.arange(b - a) / max(b - a, 1))
        stage[a:b] = s
        offset += duration
    return times, stage


@dataclass
class TraceResult:
    name: str
    speed: float
    times_s: np.ndarray
    stage: np.ndarray
    starts: list[int]
    entries: list[dict[str, Any]]
    predicted_ttft_ms: np.ndarray = field(default_factory=lambda: np.empty(0))
    predicted_tpot_ms: np.ndarray = field(default_factory=lambda: np.empty(0))
    naive_ttft_ms: np.ndarray = field(default_factory=lambda: np.empty(0))
    naive_tpot_ms: np.ndarray = field(default_factory=lambda: np.empty(0))
    versions: list[str] = field(default_factory=list)
    kinds: dict[str, list[str]] = field(default_factory=dict)  # per model, as ReplayResult's
    prediction_calls: int = 0
    samples_sent: int = 0
    throttled: int = 0
    wall_s: float = 0.0


def replay_trace(
    trace: Trace,
    prediction_url: str,
    training_url: str,
    *,
    speed: float = 1.0,
    flush_every_s: float = 1.0,
    send_predictions: bool = False,
    baseline: SlidingWindowBaseline | None = None,
    timeout_s: float = 30.0,
) -> TraceResult:
    """Replay the whole trace (see the module docstring); raises on a failed call."""
    n = len(trace.entries)
    starts = recover_stages(trace.load(), trace.rates_qps, trace.durations_s)
    times, stage = trace_times(n, starts, trace.durations_s)
    result = TraceResult(trace.name, speed, times, stage, starts, trace.entries)
    pred = {m: np.full(n, np.nan) for m in ("ttft", "tpot", "naive_ttft", "naive_tpot")}
    versions = [""] * n
    kinds: dict[str, list[str]] = {"ttft": [""] * n, "tpot": [""] * n}
    buffer: list[dict[str, Any]] = []
    with httpx.Client(timeout=timeout_s) as client:
        predict_url = prediction_url.rstrip("/") + "/predict/bulk/strict"
        ingest_url = training_url.rstrip("/") + "/add_training_data_bulk"

        def flush() -> None:
            for a in range(0, len(buffer), MAX_BATCH):
                result.throttled += _post_samples(client, ingest_url, buffer[a : a + MAX_BATCH])
            result.samples_sent += len(buffer)
            if baseline is not None:
                baseline.learn(buffer)
            buffer.clear()

        started = time.monotonic()
        next_flush = flush_every_s
        i = 0
        while i < n:
            clock = (time.monotonic() - started) * speed
            if times[i] >= next_flush and clock >= next_flush:
                flush()
                next_flush = (math.floor(clock / flush_every_s) + 1) * flush_every_s
                continue
            if times[i] > clock:
                time.sleep(max(min(times[i], next_flush) - clock, 0.0) / speed)
                continue
            j = i
            while j < n and times[j] <= clock and times[j] < next_flush:
                j += 1
            rows = [{k: v for k, v in e.items() if k not in _ACTUALS} for e in trace.entries[i:j]]
            response = client.post(predict_url, content=orjson.dumps({"requests": rows}), headers=_JSON)
            if response.status_code != 200:
                raise RuntimeError(f"prediction failed: HTTP {response.status_code}: {response.text[:300]}")
            result.prediction_calls += 1
            for offset, p in enumerate(orjson.loads(response.content)["predictions"]):
                pred["ttft"][i + offset] = p["ttft_ms"]
                pred["tpot"][i + offset] = p["tpot_ms"]
                versions[i + offset] = str(p["model_version"])
                for model, kind in answer_kinds(p).items():
                    kinds[model][i + offset] = kind
            if baseline is not None:
                guess = baseline.predict(rows)
                pred["naive_ttft"][i:j] = guess["ttft"]
                pred["naive_tpot"][i:j] = guess["tpot"]
            if send_predictions:
                buffer.extend(
                    {
                        **e,
                        "predicted_ttft_ms": float(pred["ttft"][i + k]),
                        "predicted_tpot_ms": float(pred["tpot"][i + k]),
                    }
                    for k, e in enumerate(trace.entries[i:j])
                )
            else:
                buffer.extend(trace.entries[i:j])
            i = j
        flush()
        result.wall_s = time.monotonic() - started
    result.predicted_ttft_ms, result.predicted_tpot_ms = pred["ttft"], pred["tpot"]
    result.naive_ttft_ms, result.naive_tpot_ms = pred["naive_ttft"], pred["naive_tpot"]
    result.versions, result.kinds = versions, kinds
    return result


_JSON = {"content-type": "application/json"}
