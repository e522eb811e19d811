"""Benchmark: training-server ingestion throughput, time to a first model, retrain time.

Starts real ``python -m training_server`` processes pinned to one core (``taskset -c 0``)
while this load generator runs on another core (core 1), and measures, as medians over
repeated runs:

1. ingestion throughput in bulk requests of 1,000 samples (distinct RFC 3339 timestamps,
   JSON as the Go client sends it), with the trainer idle, and its server CPU cost per sample;
2. the same while retrains run back to back (default trainer niceness, and niceness 0);
3. the time from sending 5,000 fresh samples to a fresh server until a trained model is
   published (the cold-start path: prior -> first model);
4. the wall time of one retrain of a 50,000-sample window on one core (in process, see
   ``bench/training_retrain.py``).

Baseline measured in the same run: validating the same bodies in process (orjson + the
shared vectorised validation) on the server's core, without HTTP.
Not a test: the machine may be shared, so read medians. Results go to stdout and, with
``--out``, to a Markdown file.

    OMP_NUM_THREADS=1 .venv/bin/python bench/training_ingest.py --out docs/benchmarks-training.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.training_retrain import retrain_times  # noqa: E402
from shared.schemas import loads, parse_training_entries, require_list  # noqa: E402
from tests.procs import free_port  # noqa: E402
from training_server import synthetic  # noqa: E402

BATCH = 1000
NOTES = """Notes:
- Throughput counts samples answered 202; every request carries 1,000 entries with distinct
  RFC 3339 timestamps. "server CPU" is the server process's user+system time per sample, which
  is robust to other load on the machine (capacity on one core = 1 / that figure).
- "While retrains run": the server retrains back to back (`--min-new-samples 1000
  --retrain-min-gap-s 0`) on a window of up to 50,000 training samples, on the same core as
  ingestion. With the default `--trainer-nice 10` the trainer thread yields the core to the
  event loop, so ingestion barely slows and retraining waits for idle time; with
  `--trainer-nice 0` they share the core about evenly.
- "5,000 fresh samples": a fresh server (prior model, default settings) receives 5 requests of
  1,000 samples; the clock stops when `/models` names a trained version.
- "retrain": `Trainer.run` in process on one core with the default model settings (150 trees,
  depth 6, 64 bins, two models), including calibration, evaluation of candidate and current
  version, and the atomic publish.
"""


class Server:
    """``taskset -c CORE python -m training_server ...`` on a free loopback port."""

    def __init__(self, data_dir: Path, core: int, args: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        cmd = ["taskset", "-c", str(core), sys.executable, "-m", "training_server"]
        cmd += ["--port", str(self.port), "--data-dir", str(data_dir), "--log-level", "warning", *args]
        self.log = open(data_dir.parent / f"server-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("training_server did not start")

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = httpx.get(self.url + "/status", timeout=30).json()
        return status

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def make_bodies(count: int, seed: int) -> list[bytes]:
    """``count`` distinct request bodies of ``BATCH`` entries with distinct timestamps."""
    rng = np.random.default_rng(seed)
    bodies = []
    base = time.time()
    for i in range(count):
        stamps = [
            datetime.fromtimestamp(base + i + j * 1e-4, UTC).isoformat().replace("+00:00", "Z")
            for j in range(BATCH)
        ]
        bodies.append(orjson.dumps({"entries": synthetic.to_entries(synthetic.samples(BATCH, rng), stamps)}))
    return bodies


async def _blast(url: str, bodies: list[bytes], requests: int, concurrency: int) -> tuple[int, int, float]:
    accepted = rejected = 0
    counter = iter(range(requests))
    headers = {"content-type": "application/json"}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=30) as client:

        async def worker() -> None:
            nonlocal accepted, rejected
            for i in counter:
                response = await client.post(
                    "/add_training_data_bulk", content=bodies[i % len(bodies)], headers=headers
                )
                if response.status_code == 202:
                    accepted += BATCH
                elif response.status_code == 429:
                    rejected += BATCH
                else:
                    raise RuntimeError(f"{response.status_code}: {response.text[:300]}")

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return accepted, rejected, time.perf_counter() - started


def blast(server: Server, bodies: list[bytes], requests: int, concurrency: int) -> dict[str, float]:
    cpu0 = server.cpu_s()
    accepted, rejected, elapsed = asyncio.run(_blast(server.url, bodies, requests, concurrency))
    cpu = server.cpu_s() - cpu0
    return {
        "samples_per_s": accepted / elapsed,
        "rejected": rejected,
        "server_cpu_us_per_sample": 1e6 * cpu / max(accepted + rejected, 1),
    }


def validation_baseline(bodies: list[bytes], repeats: int) -> float:
    rates = []
    for _ in range(repeats):
        started = time.perf_counter()
        for body in bodies:
            parse_training_entries(require_list(loads(body), "entries"), now_s=time.time())
        rates.append(len(bodies) * BATCH / (time.perf_counter() - started))
    return statistics.median(rates)


def ingest_runs(
    tmp: Path, bodies: list[bytes], args: argparse.Namespace, server_args: list[str], prefill: int = 0
) -> dict[str, Any]:
    server = Server(tmp / f"data-{time.monotonic_ns()}", args.server_core, server_args)
    try:
        blast(server, bodies, max(prefill, 20), args.concurrency)  # warm-up (and fill the window)
        if prefill:
            deadline = time.monotonic() + 60
            while server.status()["training"]["runs"] == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
        runs_before = runs_at_start = server.status()["training"]["runs"]
        results, overlapped = [], 0
        for _ in range(args.repeats):
            running_at_start = server.status()["training"]["running"]
            results.append(blast(server, bodies, args.requests, args.concurrency))
            runs_now = server.status()["training"]
            # A retrain ran during this run if one was running at its start or end, or one finished.
            overlapped += bool(running_at_start or runs_now["running"] or runs_now["runs"] > runs_before)
            runs_before = runs_now["runs"]
        status = server.status()
    finally:
        server.stop()
    return {
        "samples_per_s": statistics.median(r["samples_per_s"] for r in results),
        "all": [round(r["samples_per_s"]) for r in results],
        "cpu_us": statistics.median(r["server_cpu_us_per_sample"] for r in results),
        "rejected": sum(r["rejected"] for r in results),
        "runs_with_retrain": overlapped,
        "retrains_completed": status["training"]["runs"] - runs_at_start,
        "window": status["window"]["samples"],
        "last_retrain_s": status["training"]["last_duration_s"],
    }


def time_to_first_model(tmp: Path, bodies: list[bytes], args: argparse.Namespace) -> dict[str, Any]:
    times, server_s = [], []
    for i in range(args.repeats):
        server = Server(tmp / f"fresh-{i}", args.server_core, [])  # defaults: min_new_samples=5000
        try:
            time.sleep(0.5)
            with httpx.Client(base_url=server.url, timeout=30) as client:
                started = time.perf_counter()
                for body in bodies[i * 5 : i * 5 + 5]:
                    assert client.post("/add_training_data_bulk", content=body).status_code == 202
                while "prior" in (client.get("/models").json()["current"] or "prior"):
                    time.sleep(0.005)
                times.append(time.perf_counter() - started)
            server_s.append(server.status()["training"]["last_duration_s"])
        finally:
            server.stop()
    return {"median_s": statistics.median(times), "all": [round(t, 2) for t in times], "retrain_s": server_s}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300, help="bulk requests of 1,000 per run")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="write a Markdown report here")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    os.sched_setaffinity(0, {args.client_core})
    with tempfile.TemporaryDirectory() as tmp:
        run_all(args, Path(tmp))


def run_all(args: argparse.Namespace, tmp: Path) -> None:
    load_before = os.getloadavg()
    bodies = make_bodies(60, seed=1)
    print("validating in process (baseline) ...", flush=True)
    os.sched_setaffinity(0, {args.server_core})  # the baseline runs where the server will run
    baseline = validation_baseline(bodies, args.repeats)
    os.sched_setaffinity(0, {args.client_core})
    print("ingesting, trainer idle ...", flush=True)
    no_retrain = ["--min-new-samples", "1000000000", "--retrain-interval-s", "1000000"]
    idle = ingest_runs(tmp, bodies, args, no_retrain)
    print("ingesting while retrains run back to back ...", flush=True)
    busy_args = ["--min-new-samples", "1000", "--retrain-min-gap-s", "0"]
    busy = ingest_runs(tmp, bodies, args, busy_args, prefill=60)
    busy0 = ingest_runs(tmp, bodies, args, [*busy_args, "--trainer-nice", "0"], prefill=60)
    print("5,000 fresh samples -> published model ...", flush=True)
    first = time_to_first_model(tmp, bodies, args)
    print("retrain of a 50,000-sample window on one core ...", flush=True)
    retrain = retrain_times(50_000, args.repeats, args.server_core)
    load_after = os.getloadavg()

    rows = [
        ("validation only, in process, no HTTP (baseline)", f"{baseline:,.0f} samples/s", "-"),
        (
            "ingestion, bulk 1,000, trainer idle",
            f"{idle['samples_per_s']:,.0f} samples/s ({idle['samples_per_s'] / baseline:.2f}x baseline); "
            f"server CPU {idle['cpu_us']:.1f} us/sample",
            ">= 100,000/s",
        ),
        (
            "ingestion while retrains run (trainer nice 10, default)",
            f"{busy['samples_per_s']:,.0f} samples/s; a retrain ran during "
            f"{busy['runs_with_retrain']}/{args.repeats} runs; window {busy['window']:,}",
            ">= 50,000/s",
        ),
        (
            "ingestion while retrains run (trainer nice 0)",
            f"{busy0['samples_per_s']:,.0f} samples/s; a retrain ran during "
            f"{busy0['runs_with_retrain']}/{args.repeats} runs",
            ">= 50,000/s",
        ),
        ("5,000 fresh samples -> published model", f"{first['median_s']:.2f} s", "<= 2 s"),
        (
            f"retrain of a {retrain.samples:,}-sample window, 1 core",
            f"{retrain.median_s:.2f} s wall ({retrain.median_cpu_s:.2f} s CPU)",
            "<= 5 s",
        ),
    ]
    table = ["| measurement | median | target |", "|---|---|---|"]
    table += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    details = [
        f"- runs (samples/s): idle {idle['all']}, retraining nice 10 {busy['all']}, nice 0 {busy0['all']}",
        f"- 429 answers: idle {idle['rejected']}, retraining {busy['rejected']} / {busy0['rejected']}",
        f"- retrains completed during the measured runs: nice 10 {busy['retrains_completed']}, "
        f"nice 0 {busy0['retrains_completed']}; last retrain took {busy['last_retrain_s']:.2f} s / "
        f"{busy0['last_retrain_s']:.2f} s (it shares core {args.server_core} with ingestion)",
        f"- 5,000 samples -> model runs (s): {first['all']}; server-side retrain "
        f"{[round(t, 2) for t in first['retrain_s']]}",
        f"- 50k retrain runs (s): wall {[round(t, 2) for t in retrain.runs_s]}, "
        f"CPU {[round(t, 2) for t in retrain.cpu_s]}; held-out coverage "
        f"ttft {retrain.coverage['ttft']:.3f}, tpot {retrain.coverage['tpot']:.3f}",
        f"- load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f} (shared machine)",
    ]
    print("\n".join([*table, "", *details]))
    if args.out is not None:
        command = "OMP_NUM_THREADS=1 .venv/bin/python bench/training_ingest.py " + " ".join(sys.argv[1:])
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "?")
        args.out.write_text(
            "# Training server benchmarks\n\n"
            f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {os.cpu_count()} cores ({cpu}); "
            f"server pinned with `taskset -c {args.server_core}`, load generator on core {args.client_core}, "
            f"OMP_NUM_THREADS=1, XGBoost nthread=1; medians of {args.repeats} runs of "
            f"{args.requests} bulk requests x 1,000 samples, {args.concurrency} connections.\n\n"
            f"Command:\n\n```\n{command}\n```\n\n"
            + "\n".join(table)
            + "\n\n"
            + "\n".join(details)
            + "\n\n"
            + NOTES
        )


if __name__ == "__main__":
    main()
