"""In-process replay of the simulator's step-change scenarios through the real Trainer and LiveScorer.

A development check for the online calibration and the models, minutes cheaper than
``bench/accuracy_evidence.py`` (which replays the same scenarios through real servers over HTTP
at 5 simulated s per wall s): the scenarios of ``bench.accuracy_steps`` are run on the simulator
as fast as the CPU allows, on a *simulated* clock. At each arrival the routed pod's row is
predicted by the serving path (``prediction_server.predictor.Predictor`` on the version the
replicas would serve then, regime offsets included); the request is routed at random; completions
are flushed every simulated second (both targets at completion, or with ``--feedback first-token``
a TTFT-only sample at the first token, or ``epp`` as today's llm-d EPP fills its samples:
``bench.accuracy_replay``), into the window and the training server's own live scorer.

What the services do in wall time is mapped onto the simulated clock with ``--speed`` (simulated s
per wall s, the evidence run's pace): the live scorer's clock (its publish interval, the version
history it scores each sample against, drift) runs at simulated time / speed; a retrain starts as
the service's scheduler would start it (enough new samples and the 1 s gap, or 10 s with any new
sample, both in wall time), on the window as it is then, and its version reaches the predictor its
measured duration x speed later (plus ``--pickup-s`` wall seconds, the replicas' store watch); the
live scorer takes it as current at once (a simplification: samples routed during the run are
scored against it). ``--setting KEY=VALUE`` changes a ``TrainingSettings`` field. The trainer's
run is measured here, on an otherwise idle process: a busier machine would make every model
staler than this. Its measured time is the one thing a replay's figures depend on besides the
code and the seeds; ``--train-s SECONDS`` fixes it (0.4 is about the measured mean), so two runs
give the same figures and a variant's difference from main is its own, not the machine's.

Reported per scenario, seed and model, from the same summaries and checks as the evidence
(``bench.accuracy_targets``): coverage overall, queued coverage, coverage per queue depth (waiting
bins), coverage per stage, recovery after each step, pinball, targets met. The pinball ratios are
judged only with ``--naive``, which runs the evidence's naive sliding-window baseline
(``bench.accuracy_naive``) on the same stream: each request predicted by the fit that served when it
was routed, each flush learnt after the services got it. ``--timeline`` adds coverage per 10 s;
``--decompose SECONDS`` adds, per that many simulated seconds, where the served margin came from:
the medians of log1p(actual), of the work-ahead baseline, the trees, the trainer's calibration
offset and the regime offset, and of what is left, with the pods' state (a miss at a burst's onset
shows as a positive residual). ``--history`` starts both predictors from history instead of cold:
a whole replay of the same scenario with the next seed is loaded into the window first (as
``python -m training_server import-trace --data-dir`` loads a recorded trace: not scored), ending
``bench.accuracy_steps.HISTORY_GAP_S`` (60) simulated s before the replay, the service's first
retrain runs on it, and the naive baseline gets its newest 10,000 samples: what each reaches once
it has seen the workload's regimes.

    OMP_NUM_THREADS=1 .venv/bin/python bench/sim_calibration_replay.py [--code CHECKOUT]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import numpy as np
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.code_path import add_arguments, use_services  # noqa: E402 (no service imported)

EPOCH = 1.7e9  # the simulated clock's epoch (s): samples' timestamps are EPOCH + simulated time


class SimClock:
    """``time``-like clock for the live scorer: epoch seconds and a monotonic clock, both simulated."""

    def __init__(self, speed: float) -> None:
        self.now_s, self.speed = 0.0, speed

    def time(self) -> float:
        return EPOCH + self.now_s

    def monotonic(self) -> float:
        return self.now_s / self.speed  # the live scorer's intervals are wall seconds


def replay(scenario: Any, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    import training_server.live_scoring as live_scoring
    from bench.accuracy_evidence import sim_streams
    from bench.accuracy_naive import SlidingWindowBaseline
    from bench.accuracy_replay import (
        STREAMING,
        ReplayResult,
        chooser,
        completion_samples,
        first_token_sample,
        record,
        simulate_first,
    )
    from bench.accuracy_targets import judge, summarise_stream
    from bench.inprocess_training import InProcessTraining, ServiceSchedule
    from shared.artifacts import MODEL_NAMES, base_margin
    from shared.features import build_features
    from shared.schemas import parse_rows, parse_training_entries

    clock = SimClock(args.speed)
    live_scoring.time = types.SimpleNamespace(time=clock.time, monotonic=clock.monotonic)  # type: ignore[attr-defined]
    cluster = scenario.cluster(seed)
    streaming = args.feedback in STREAMING
    if streaming:
        cluster.record_first_tokens()
    choose = chooser("random", seed)
    cfg = scenario.replay_config(seed, args.feedback, args.send_predictions, args.speed)
    result = ReplayResult(cfg)
    pending_events = sorted(scenario.events(), key=lambda e: e[0])
    with tempfile.TemporaryDirectory() as tmp:
        training = InProcessTraining(Path(tmp), args.quantile, **args.overrides)
        schedule = ServiceSchedule(training, args.speed, args.pickup_s, args.train_s)
        predictor = training.predictor()
        arrivals: list[tuple[int, dict[str, Any]]] = []  # routed since the last flush
        asked: dict[int, tuple[float, float, str, dict[str, str]]] = {}
        # --decompose: per request, each model's (trees, baseline, calibration, regime offset) margins
        parts: dict[int, dict[str, tuple[float, ...]]] = {}
        decomposed: list[dict[str, tuple[float, ...]]] = []  # in completion order, as result's rows
        buffer: list[dict[str, Any]] = []
        baseline = SlidingWindowBaseline(args.quantile) if args.naive else None
        naive: dict[int, tuple[float, float]] = {}  # --naive: the baseline's answer per request
        completed: list[int] = []  # request ids in the order of result.rows

        def swap_due(t: float) -> None:
            nonlocal predictor
            version = schedule.switch(t)
            if version is not None:
                predictor = training.predictor(version)

        def predict_routed() -> None:
            if not arrivals:
                return
            features = build_features(parse_rows([row for _, row in arrivals]))
            ttft, tpot = predictor.predict(features)
            kinds = {m: predictor.manifest.model_kind(m) for m in MODEL_NAMES}
            for k, (rid, _) in enumerate(arrivals):
                asked[rid] = (float(ttft[k]), float(tpot[k]), predictor.manifest.version, kinds)
            if baseline is not None:  # its model changes only in learn(), at the flush after this
                baseline.answer(arrivals, naive)
            if args.decompose:
                for rid, row_parts in zip([rid for rid, _ in arrivals], margin_parts(features), strict=True):
                    parts[rid] = row_parts
            arrivals.clear()

        def margin_parts(features: np.ndarray) -> list[dict[str, tuple[float, ...]]]:
            """Each row's served margin per model, in its parts (``served_latency_ms``'s terms)."""
            trees = predictor.forests.margins(features)
            columns = []
            for k, m in enumerate(MODEL_NAMES):
                spec = predictor.manifest.models[m]
                regime = np.zeros(len(features))
                if spec.regime_offsets is not None:
                    regime = spec.regime_offsets.for_rows(features)
                calibration = np.full(len(features), spec.calibration_offset)
                columns.append((m, np.stack([trees[k], base_margin(features, spec), calibration, regime], 1)))
            return [{m: tuple(table[i].tolist()) for m, table in columns} for i in range(len(features))]

        def complete(done: list[Any]) -> None:
            firsts = cluster.take_first_tokens() if streaming else []
            if any(x.request.request_id not in asked for x in [*firsts, *done]):
                predict_routed()  # routed since the last flush, by the version serving then
            for f in firsts:  # first tokens come before their own completions
                buffer.append(first_token_sample(f, asked[f.request.request_id], cfg))
            for c in done:
                prediction = asked.pop(c.request.request_id)
                record(result, c, prediction)
                completed.append(c.request.request_id)
                if args.decompose:
                    decomposed.append(parts.pop(c.request.request_id))
                buffer.extend(completion_samples(c, prediction, cfg))

        def flush(t: float) -> None:
            clock.now_s = t
            predict_routed()
            if held:  # arrival feedback: this second's requests, predicted above, go out now
                complete(held)
                held.clear()
            swap_due(t)
            new = len(buffer)
            if buffer:
                columns, _ = parse_training_entries(buffer, now_s=clock.time())
                stamps = np.full(len(buffer), clock.time())
                training.ingest(columns, stamps)
                if baseline is not None:
                    baseline.learn(buffer)
                buffer.clear()
            schedule.after_flush(t, new, clock.time())

        if args.history:
            history(scenario, seed + 1, training, schedule, baseline, clock.time())
        held: list[Any] = []
        next_flush = 1.0
        if args.feedback == "arrival":
            # Simulated first (the routing is random, so it does not depend on the predictions),
            # then replayed in arrival order, each request's sample sent at the flush after it was
            # predicted: the protocol of a replay of recorded requests (and of the trace replays).
            done = simulate_first(scenario.requests(seed), cluster, choose, pending_events)
            for c, _ in done:
                while next_flush <= c.routed_at_s:
                    flush(next_flush)
                    next_flush += 1.0
                arrivals.append((c.request.request_id, c.features))
                held.append(c)
            flush(next_flush)
            result.sim_s = next_flush
        for req in scenario.requests(seed) if args.feedback != "arrival" else ():
            while pending_events and pending_events[0][0] <= req.arrival_s:
                at_s, action = pending_events.pop(0)
                complete(cluster.advance_to(at_s))
                action(cluster)
            while next_flush <= req.arrival_s:
                complete(cluster.advance_to(next_flush))
                flush(next_flush)
                next_flush += 1.0
            complete(cluster.advance_to(req.arrival_s))
            rows = cluster.candidate_rows(req)
            pod = choose(req, rows)
            arrivals.append((req.request_id, rows[pod]))
            cluster.route(req, pod)
        if args.feedback != "arrival":
            result.sim_s = cluster.now_s
            complete(cluster.drain())
    result.set_naive(naive, completed)  # NaN without --naive, or before its first fit
    streams = sim_streams(result, scenario)
    steps = scenario.steps()
    out: dict[str, Any] = {"retrains": schedule.runs}
    for m in MODEL_NAMES:
        summary = summarise_stream(streams[m], args.quantile, steps)
        checks = judge(summary, args.quantile)  # the ratio checks only where the baseline answered
        checks_slack = judge(summary, args.quantile, slack=True)  # a what-if, not #9's targets
        queued = streams[m].subset(streams[m].waiting > 0)
        out[m] = {
            "summary": summary,
            "checks": checks,
            "checks_slack": checks_slack,
            "timeline": timeline(streams[m]),
            "timeline_queued": timeline(queued),
        }
        if args.decompose:
            out[m]["decomposition"] = decomposition(result, decomposed, m, args.decompose)
    return out


def history(
    scenario: Any, seed: int, training: Any, schedule: Any, baseline: Any, start_epoch_s: float
) -> None:
    """``--history``: a whole replay of ``scenario`` with ``seed``, its completed requests in the window
    (as ``python -m training_server import-trace --data-dir`` loads a recorded trace: into the window
    only, not scored), timed up to ``start_epoch_s`` (``Scenario.recorded``); then the retrain the
    service starts with a restored window; the naive baseline gets the same samples (it keeps its
    window's newest)."""
    from shared.schemas import parse_training_entries

    entries, stamps = scenario.recorded(seed, start_epoch_s)  # this clock's stamps are simulated s
    columns, _ = parse_training_entries(entries, now_s=start_epoch_s)
    training.window.insert(columns, stamps)
    schedule.after_flush(0.0, len(entries), start_epoch_s)
    if baseline is not None:
        baseline.learn_history(entries)


def decomposition(
    result: Any, parts: list[dict[str, tuple[float, ...]]], model: str, width_s: float
) -> list[dict[str, float]]:
    """Per ``width_s`` of routing time (trained-model requests only): coverage, and the medians of
    log1p(actual) and of the served margin's parts (``shared.artifacts.served_latency_ms``): the
    baseline, the trees, the trainer's calibration offset and the regime offset, with what is left
    (``residual``: log1p(actual) minus all of them; > 0 is a miss at the median) and the pods' state
    (waiting, KV use, running): where a miss comes from."""
    t = result.array("routed_at_s")
    actual = result.array(f"actual_{model}_ms")
    keep = (actual > 0) & np.asarray(result.trained(model))
    table = np.array([p[model] for p in parts]).reshape(len(parts), 4)
    trees, base, calibration, regime = table.T
    target = np.log1p(actual)
    served = trees + base + calibration + regime
    state = {
        k: np.array([row[k] for row in result.rows], float)
        for k in ("num_request_waiting", "kv_cache_percentage", "num_request_running")
    }
    med = {
        "log_actual": target,
        "baseline": base,
        "trees": trees,
        "calibration": calibration,
        "regime": regime,
        "residual": target - served,
        "waiting": state["num_request_waiting"],
        "kv": state["kv_cache_percentage"],
        "running": state["num_request_running"],
    }
    out = []
    for lo in np.arange(0.0, float(t.max(initial=0.0)) + width_s, width_s):
        m = keep & (t >= lo) & (t < lo + width_s)
        if m.sum() < 10:
            continue
        cell = {"t": float(lo), "n": int(m.sum()), "coverage": float(np.mean(target[m] <= served[m]))}
        cell.update({k: float(np.median(v[m])) for k, v in med.items()})
        out.append(cell)
    return out


def timeline(s: Any, width_s: float = 10.0) -> list[dict[str, float]]:
    """Coverage and median log(predicted / actual) of the trained-model requests per ``width_s``
    of routing time."""
    t = s.time_s[s.trained]
    covered = (s.actual <= s.predicted)[s.trained]
    ratio = np.log(np.maximum(s.predicted, 1e-9) / s.actual)[s.trained]
    out = []
    for lo in np.arange(0.0, float(t.max(initial=0.0)) + width_s, width_s):
        m = (t >= lo) & (t < lo + width_s)
        if m.sum() >= 10:
            out.append(
                {
                    "t": float(lo),
                    "n": int(m.sum()),
                    "coverage": float(covered[m].mean()),
                    "log_ratio": float(np.median(ratio[m])),
                }
            )
    return out


def describe(name: str, model: str, r: dict[str, Any]) -> str:
    from bench.accuracy_targets import SLACK

    s, checks = r["summary"], r["checks"]
    queued = s["regime"].get("waiting>0", {})
    stages = " ".join(f"{k.split(':')[0]}:{v['coverage']:.3f}" for k, v in sorted(s["stage"].items()))
    depths = " ".join(
        f"{k.removeprefix('waiting=')}:{v['coverage']:.2f}"
        for k, v in s["depth"].items()
        if k != "waiting=0-0"
    )
    recovery = " ".join(str(step["recovery_s"]) for step in s["steps"])
    recovery += f" (steady stage: {s['steady_recovery_s']})"
    met = sum(bool(c["pass"]) for c in checks)
    ratios = ""
    if "ratio" in s["overall"]:
        ratios = f"/ naive {s['overall']['ratio']:.2f} queued {queued.get('ratio', float('nan')):.2f} "
    return (
        f"{name} {model.upper()} coverage {s['overall']['coverage']:.3f} "
        f"pinball {s['overall']['pinball_ms']:.3g} ms {ratios}queued "
        f"{queued.get('coverage', float('nan')):.3f} (n={queued.get('samples', 0)}) by waiting {depths} "
        f"stages {stages} recovery {recovery} met {met}/{len(checks)}"
        f" (within {SLACK:.0%} of the prediction: {sum(bool(c['pass']) for c in r['checks_slack'])})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenarios", nargs="+", help="default: #9's three of bench.accuracy_steps (the others by name)"
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--speed", type=float, default=5.0, help="simulated s per wall s of the services")
    parser.add_argument("--pickup-s", type=float, default=0.2, help="wall s until replicas serve a version")
    parser.add_argument(
        "--train-s",
        type=float,
        help="wall s every retrain takes (default: as measured; fixed, two runs give the same figures)",
    )
    # bench.accuracy_replay.FEEDBACKS, not imported: it would load this checkout's services before --code's
    parser.add_argument(
        "--feedback", choices=("completion", "first-token", "epp", "arrival"), default="completion"
    )
    parser.add_argument(
        "--send-predictions",
        action="store_true",
        help="samples carry predicted_ttft_ms / predicted_tpot_ms (--feedback epp: always)",
    )
    parser.add_argument("--timeline", action="store_true", help="also print coverage per 10 s")
    parser.add_argument(
        "--naive",
        action="store_true",
        help="also run the evidence's naive baseline (bench.accuracy_naive) on the same stream, and judge "
        "the pinball ratios",
    )
    parser.add_argument(
        "--decompose",
        type=float,
        metavar="SECONDS",
        help="also print, per this many simulated s, the medians of the served margin's parts "
        "(baseline, trees, calibration, regime offset) against log1p(actual), and the pods' state",
    )
    parser.add_argument(
        "--history",
        action="store_true",
        help="start from history: a whole replay of the same scenario with the next seed in the window "
        "(as import-trace loads a recorded trace) and in the naive baseline's, ending 60 s before the replay",
    )
    parser.add_argument("--json", type=Path)
    add_arguments(parser, "calibration_step_ttft=0.1")
    args = parser.parse_args(argv)
    args.overrides = use_services(args)  # nothing of the services is imported before this
    from bench.accuracy_steps import selected

    report: dict[str, Any] = {}
    for scenario in selected(args.scenarios):
        for seed in args.seeds:
            name = f"{scenario.name} seed {seed}"
            r = report[name] = replay(scenario, seed, args)
            for model in ("ttft", "tpot"):
                print(describe(name, model, r[model]), flush=True)
                if args.timeline:
                    for key in ("timeline", "timeline_queued"):
                        windows = r[model][key]
                        cells = " ".join(
                            f"{w['t']:g}:{w['coverage']:.2f}/{w['log_ratio']:+.2f}" for w in windows
                        )
                        print(f"  {key.replace('timeline', 'all').replace('all_', '')}: {cells}", flush=True)
                for w in r[model].get("decomposition", []):
                    print(
                        f"  {w['t']:g} s n={w['n']} coverage {w['coverage']:.2f}: log1p(actual) "
                        f"{w['log_actual']:.2f} = baseline {w['baseline']:.2f} trees {w['trees']:+.2f} "
                        f"calibration {w['calibration']:+.2f} regime {w['regime']:+.2f} "
                        f"residual {w['residual']:+.2f} | waiting {w['waiting']:.0f} "
                        f"kv {w['kv']:.2f} running {w['running']:.0f}",
                        flush=True,
                    )
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
