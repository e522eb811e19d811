"""Accuracy evidence for issue #9: real H200 traces and simulator step changes, through real servers.

One command runs every replay against fresh, real servers (a training server and a prediction
server reading its store, started as processes on loopback, at default settings unless
``--training-flag`` says otherwise), with the naive sliding-window baseline
(``bench.accuracy_naive``) fed the same stream in-process, and regenerates the generated block
of ``docs/benchmarks-accuracy.md``, the figures and a PASS/FAIL table against the "Done means"
targets (``bench.accuracy_targets``):

- the three real traces (``bench.accuracy_trace``), at ``--trace-speed`` trace seconds per wall
  second, run concurrently (they are paced, mostly idle, and each has its own servers);
- the simulator scenarios with step changes (``bench.accuracy_steps``) for each ``--seeds``,
  one after the other, at ``--sim-speed`` simulated seconds per wall second, while the traces run;
  with ``--history``, each from history instead of cold (``import_history``).

    .venv/bin/python bench/accuracy_evidence.py            # full run (~15 min)
    .venv/bin/python bench/accuracy_evidence.py --quick    # a few minutes, for development
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.accuracy_doc import markdown, markers, write_block  # noqa: E402
from bench.accuracy_metrics import dimension_bins  # noqa: E402
from bench.accuracy_naive import SlidingWindowBaseline  # noqa: E402
from bench.accuracy_plot import reliability_grid, step_timelines  # noqa: E402
from bench.accuracy_replay import FEEDBACKS, ReplayResult, replay_stream  # noqa: E402
from bench.accuracy_steps import Scenario, selected  # noqa: E402
from bench.accuracy_targets import Stream, judge, summarise_stream  # noqa: E402
from bench.accuracy_trace import DEFAULT_DIR, TRACES, TraceResult, load_trace, replay_trace  # noqa: E402
from shared.schemas import parse_rows  # noqa: E402
from tests.procs import start_service  # noqa: E402
from training_server.import_trace import rfc3339  # noqa: E402

MODELS = ("ttft", "tpot")


class Servers:
    """A fresh training server and a prediction server on its store, stopped on exit."""

    def __init__(self, workdir: Path, root: Path, training_flags: Sequence[str]) -> None:
        self.workdir, self.root, self.flags = workdir, root, list(training_flags)

    def __enter__(self) -> Servers:
        logs = self.workdir / "logs"
        self.training = start_service(
            "training_server",
            ["--data-dir", str(self.workdir), *self.flags],
            log_dir=logs,
            root=self.root,
            timeout_s=90.0,
        )
        try:
            self.prediction = start_service(
                "prediction_server",
                ["--store", str(self.workdir / "models")],
                log_dir=logs,
                ready_path="/readyz",
                root=self.root,
                timeout_s=90.0,
            )
        except Exception:
            self.training.stop()
            raise
        return self

    def status(self) -> dict[str, Any]:
        data: dict[str, Any] = httpx.get(self.training.url + "/status", timeout=10).json()
        return data

    def __exit__(self, *exc: object) -> None:
        self.prediction.stop()
        self.training.stop()


def _bins(rows: list[dict[str, Any]]) -> np.ndarray:
    return dimension_bins(parse_rows(rows))["waiting"]


def trace_streams(r: TraceResult, rates: list[float]) -> dict[str, Stream]:
    rows = [{k: v for k, v in e.items() if not k.startswith("actual_")} for e in r.entries]
    waiting = np.array([e["num_request_waiting"] for e in r.entries], float)
    labels = np.array([f"{s + 1}: {rates[s]:g} QPS" for s in r.stage], dtype=object)
    bins = _bins(rows)
    out = {}
    for m in MODELS:
        trained = np.asarray(r.kinds[m], dtype=object) != "prior"
        actual = np.array([float(e[f"actual_{m}_ms"]) for e in r.entries])
        keep = actual > 0
        pred, naive = getattr(r, f"predicted_{m}_ms"), getattr(r, f"naive_{m}_ms")
        out[m] = Stream(
            r.times_s[keep],
            labels[keep],
            waiting[keep],
            bins[keep],
            pred[keep],
            naive[keep],
            actual[keep],
            trained[keep],
        )
    return out


def sim_streams(r: ReplayResult, scenario: Scenario) -> dict[str, Stream]:
    t = r.array("routed_at_s")
    waiting = np.array([row["num_request_waiting"] for row in r.rows], float)
    labels = np.array([scenario.phase(x) for x in t.tolist()], dtype=object)
    bins = _bins(r.rows)
    out = {}
    for m in MODELS:
        trained = r.trained(m)
        actual = r.array(f"actual_{m}_ms")
        keep = actual > 0
        out[m] = Stream(
            t[keep],
            labels[keep],
            waiting[keep],
            bins[keep],
            r.array(f"predicted_{m}_ms")[keep],
            r.array(f"naive_{m}_ms")[keep],
            actual[keep],
            np.asarray(trained)[keep],
        )
    return out


def run_trace(name: str, args: argparse.Namespace, workdir: Path, out: dict[str, Any]) -> None:
    trace = load_trace(name, args.traces_dir)
    with Servers(workdir / name, args.services_root, args.training_flag) as servers:
        baseline = SlidingWindowBaseline(args.quantile)
        result = replay_trace(
            trace,
            servers.prediction.url,
            servers.training.url,
            speed=args.trace_speed,
            baseline=baseline,
            send_predictions=args.send_predictions,
        )
        status = servers.status()
    out[name] = {
        "result": result,
        "rates": trace.rates_qps,
        "retrains": status["training"]["runs"],
        "naive_fits": baseline.fits,
    }
    print(
        f"trace {name}: {len(trace.entries)} entries in {result.wall_s:.0f} s wall, "
        f"{status['training']['runs']} retrains",
        flush=True,
    )


def import_history(
    scenario: Scenario, seed: int, args: argparse.Namespace, data_dir: Path
) -> list[dict[str, Any]]:
    """``--history``: ``scenario``'s replay with ``seed`` as a recorded trace (JSON lines, timed at the
    replay's pace up to now: ``Scenario.recorded``), loaded into ``data_dir`` by the training server's
    own ``import-trace`` command before the server starts there. Its entries."""
    entries, stamps = scenario.recorded(seed, time.time(), args.sim_speed)
    path = data_dir / "history.jsonl"
    data_dir.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        for entry, at in zip(entries, stamps.tolist(), strict=True):
            f.write(orjson.dumps({**entry, "timestamp": rfc3339(at)}) + b"\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(args.services_root)}
    command = [
        sys.executable,
        "-m",
        "training_server",
        "import-trace",
        str(path),
        "--data-dir",
        str(data_dir),
    ]
    done = subprocess.run(
        command, cwd=args.services_root, env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"import-trace exited with {done.returncode}: {done.stderr[-2000:]}")
    return entries


def run_scenario(scenario: Scenario, seed: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    cfg = scenario.replay_config(seed, args.feedback, args.send_predictions, args.sim_speed)
    data_dir = workdir / f"{scenario.name}-{seed}"
    history = import_history(scenario, seed + 1, args, data_dir) if args.history else []
    with Servers(data_dir, args.services_root, args.training_flag) as servers:
        baseline = SlidingWindowBaseline(args.quantile)
        baseline.learn_history(history)
        result = replay_stream(
            scenario.requests(seed),
            scenario.cluster(seed),
            cfg,
            servers.prediction.url,
            servers.training.url,
            events=scenario.events(),
            baseline=baseline,
        )
        status = servers.status()
    print(
        f"sim {scenario.name} seed {seed}: {len(result.rows)} requests, {result.sim_s:.0f} sim s in "
        f"{result.wall_s:.0f} s wall, {status['training']['runs']} retrains",
        flush=True,
    )
    return {"result": result, "retrains": status["training"]["runs"], "naive_fits": baseline.fits}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="faster pace, one seed, shorter scenarios")
    parser.add_argument("--traces", nargs="*", default=list(TRACES), help="trace names ('' for none)")
    parser.add_argument("--traces-dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--trace-speed", type=float, help="trace s per wall s (default 1; --quick 10)")
    parser.add_argument("--sim-speed", type=float, help="simulated s per wall s (default 5; --quick 10)")
    parser.add_argument("--seeds", type=int, nargs="*", help="simulator seeds (default 0 1; --quick 0)")
    parser.add_argument(
        "--scenarios", nargs="*", help="scenario names (default: #9's three; the others by name)"
    )
    parser.add_argument("--quantile", type=float, default=0.9, help="the servers' default quantile")
    parser.add_argument("--training-flag", action="append", default=[], help="extra training-server flag")
    parser.add_argument("--services-root", type=Path, default=REPO, help="checkout whose services run")
    parser.add_argument(
        "--send-predictions", action="store_true", help="samples carry predicted_ttft_ms / predicted_tpot_ms"
    )
    parser.add_argument(
        "--feedback",
        choices=FEEDBACKS,
        default="completion",
        help="simulator: post both targets at completion, or TTFT at the first token (llm-d's EPP), "
        "or (epp) that with what today's EPP puts in its samples (the prediction routed on; TPOT with "
        "the pod's load at the last token), or (arrival) simulate first and post each request's "
        "samples right after its prediction (bench.accuracy_replay)",
    )
    parser.add_argument(
        "--history",
        action="store_true",
        help="simulator: start each replay's servers (and the naive baseline) from history: the same "
        "scenario's replay with the next seed, loaded with 'python -m training_server import-trace'",
    )
    parser.add_argument("--label", default="", help="what was measured (e.g. 'main at abc123')")
    parser.add_argument("--block", default="", help="name of the generated block and figure suffix")
    parser.add_argument("--out", type=Path, help="Markdown file whose generated block is (re)written")
    parser.add_argument("--figures-dir", type=Path, help="where the PNGs go (default: next to --out)")
    parser.add_argument("--json", type=Path, help="also write every summary and check as JSON")
    args = parser.parse_args(argv)
    args.trace_speed = args.trace_speed or (10.0 if args.quick else 1.0)
    args.sim_speed = args.sim_speed or (10.0 if args.quick else 5.0)
    args.seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1])
    args.traces = [t for t in args.traces if t]
    chosen = selected(args.scenarios, 120.0, 90.0) if args.quick else selected(args.scenarios)
    command = ".venv/bin/python bench/accuracy_evidence.py " + shlex.join(
        sys.argv[1:] if argv is None else argv
    )
    started = time.monotonic()
    traces: dict[str, Any] = {}
    sims: list[tuple[Scenario, int, dict[str, Any]]] = []
    errors: list[BaseException] = []
    with tempfile.TemporaryDirectory(prefix="evidence-") as tmp:
        workdir = Path(tmp)

        def guarded(name: str) -> None:
            try:
                run_trace(name, args, workdir, traces)
            except BaseException as e:  # reported after the join
                errors.append(e)

        threads = [threading.Thread(target=guarded, args=(n,), daemon=True) for n in args.traces]
        for t in threads:
            t.start()
        for scenario in chosen:
            for seed in args.seeds:
                sims.append((scenario, seed, run_scenario(scenario, seed, args, workdir)))
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    wall_s = time.monotonic() - started
    replays: list[dict[str, Any]] = []
    for name in args.traces:
        info = traces[name]
        streams = trace_streams(info["result"], info["rates"])
        replays.append(_replay(f"trace {name}", "trace", streams, [], info, args.quantile))
    for scenario, seed, info in sims:
        streams = sim_streams(info["result"], scenario)
        replays.append(
            _replay(
                f"sim {scenario.name} seed {seed}",
                "sim",
                streams,
                scenario.steps(),
                info,
                args.quantile,
                scenario.name,
                seed == args.seeds[0],
            )
        )
    figures = args.figures_dir or (args.out.parent if args.out else Path("."))
    suffix = f"-{args.block}" if args.block else ""
    pngs = {
        "traces": figures / f"accuracy-reliability-traces{suffix}.png",
        "sim": figures / f"accuracy-reliability-sim{suffix}.png",
        "steps": figures / f"accuracy-steps{suffix}.png",
    }
    if [r for r in replays if r["kind"] == "trace"]:
        reliability_grid([r for r in replays if r["kind"] == "trace"], args.quantile, pngs["traces"])
    else:
        pngs.pop("traces")
    sim_replays = [r for r in replays if r["kind"] == "sim"]
    if sim_replays:
        reliability_grid(_pool_by_scenario(sim_replays), args.quantile, pngs["sim"])
        step_timelines([r for r in sim_replays if r["seed_first"]], args.quantile, pngs["steps"])
    else:
        pngs.pop("sim")
        pngs.pop("steps")
    block = markdown(command, args, replays, pngs, wall_s)
    print(block)
    if args.out is not None:
        write_block(args.out, block, *markers(args.block))
    if args.json is not None:
        slim = [{k: v for k, v in r.items() if k not in ("streams",)} for r in replays]
        args.json.write_bytes(
            orjson.dumps(slim, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY, default=str)
        )
    return 0


def _replay(
    name: str,
    kind: str,
    streams: dict[str, Stream],
    steps: list[tuple[str, float, float]],
    info: dict[str, Any],
    quantile: float,
    scenario: str = "",
    first_seed: bool = False,
) -> dict[str, Any]:
    result = info["result"]
    summaries = {m: summarise_stream(streams[m], quantile, steps) for m in MODELS}
    return {
        "name": name,
        "kind": kind,
        "scenario": scenario,
        "streams": streams,
        "summaries": summaries,
        "checks": {m: judge(summaries[m], quantile) for m in MODELS},
        "checks_slack": {m: judge(summaries[m], quantile, slack=True) for m in MODELS},
        "retrains": info["retrains"],
        "naive_fits": info["naive_fits"],
        "wall_s": result.wall_s,
        "seed_first": first_seed,
        "sim_s": getattr(result, "sim_s", 0.0),
        "steps": steps,
        "starts": getattr(result, "starts", None),
    }


def _pool_by_scenario(replays: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per scenario with its seeds' streams concatenated (for the reliability figure)."""
    pooled: dict[str, dict[str, Any]] = {}
    for r in replays:
        entry = pooled.setdefault(r["scenario"], {"name": f"sim {r['scenario']} (all seeds)", "parts": []})
        entry["parts"].append(r["streams"])
    out = []
    for entry in pooled.values():
        streams = {
            m: Stream(
                **{
                    f: np.concatenate([getattr(p[m], f) for p in entry["parts"]])
                    for f in Stream.__dataclass_fields__
                }
            )
            for m in MODELS
        }
        out.append({"name": entry["name"], "streams": streams})
    return out


if __name__ == "__main__":
    sys.exit(main())
