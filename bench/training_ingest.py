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
   ``bench/training_retrain.py``);
5. the cost of the ingest journal: ingestion throughput (trainer idle) with each
   ``--journal-fsync`` policy (``always``, the default; ``everysec``; ``no``), and how many
   requests shared one group commit (write + fsync).

Baseline measured in the same run: validating the same bodies in process (orjson + the
shared vectorised validation) on the server's core, without HTTP.
Not a test: the machine may be shared, so read medians. Results go to stdout and, with
``--out``, to a Markdown file.

    OMP_NUM_THREADS=1 .venv/bin/python bench/training_ingest.py --out docs/benchmarks-training.md

``--journal-only`` measures only (5) and replaces the journal section of ``--out``.
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

    def __init__(self, data_dir: Path, core: int, args: list[str], repo: Path = REPO) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(repo)}
        cmd = ["taskset", "-c", str(core), sys.executable, "-m", "training_server"]
        cmd += ["--port", str(self.port), "--data-dir", str(data_dir), "--log-level", "warning", *args]
        self.log = open(data_dir.parent / f"server-{self.port}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180  # generous: the machine may be busy
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
    tmp: Path,
    bodies: list[bytes],
    args: argparse.Namespace,
    server_args: list[str],
    prefill: int = 0,
    repo: Path = REPO,
) -> dict[str, Any]:
    data_dir = tmp / f"data-{time.monotonic_ns()}"
    data_dir.mkdir(parents=True)
    server = Server(data_dir, args.server_core, server_args, repo)
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
        "journal": status.get("journal", {}),
        "requests": (args.repeats * args.requests + max(prefill, 20)),
    }


JOURNAL_BEGIN, JOURNAL_END = "<!-- journal-bench -->", "<!-- /journal-bench -->"
JOURNAL_NOTES = """- Every accepted batch is appended to the journal before its 202 (one record of 1,000 rows
  x 14 float64 columns, about 112 kB). Concurrent requests share one group commit: one `write`
  and, with `always`, one `fsync`. "requests per commit" is the number of ingest requests divided
  by the group commits the server counted (`/status` -> `journal.group_commits`).
- `always` fsyncs before any 202 of the group goes out (covers power loss); `everysec` fsyncs at
  most a second later (a power loss may lose up to about 1 s of acknowledged samples); `no` leaves
  it to the OS. A `kill -9` loses nothing with any of them (tests/e2e/test_journal_durability.py).
- Journal bytes at this rate: about 112 MB per 1,000,000 samples; the window is saved and the
  journal compacted every `--persist-interval-s` or after `--journal-snapshot-bytes` (256 MiB)."""


def journal_alone(tmp: Path, policy: str, appenders: int, batches: int = 400) -> tuple[float, float]:
    """In process: ``appenders`` threads each append-and-wait ``batches`` records of 1,000 samples
    to a real ``Journal`` on this disk; returns (samples/s, mean ms per append)."""
    from concurrent.futures import ThreadPoolExecutor

    from training_server.journal import SAMPLES, Journal, JournalRecord
    from training_server.window import JOURNAL_COLUMNS

    directory = tmp / f"journal-{policy}-{appenders}-{time.monotonic_ns()}"
    journal = Journal(directory, JOURNAL_COLUMNS, policy, lambda _: None)  # type: ignore[arg-type]
    list(journal.recover())
    journal.start(1)
    data = np.random.default_rng(0).random((BATCH, len(JOURNAL_COLUMNS)))
    latencies: list[float] = []

    def run(_: int) -> None:
        for _ in range(batches // appenders):
            started = time.perf_counter()
            journal.append(JournalRecord(SAMPLES, data, "", BATCH)).result(30)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    with ThreadPoolExecutor(appenders) as pool:
        list(pool.map(run, range(appenders)))
    elapsed = time.perf_counter() - started
    journal.close()
    return len(latencies) * BATCH / elapsed, 1000 * statistics.mean(latencies)


def journal_section(tmp: Path, bodies: list[bytes], args: argparse.Namespace, baseline: float) -> str:
    no_retrain = ["--min-new-samples", "1000000000", "--retrain-interval-s", "1000000"]
    rows, details = [], []
    os.sched_setaffinity(0, {args.server_core})
    for policy in ("always", "everysec", "no"):
        for appenders in (1, 4):
            rate, ms = journal_alone(tmp, policy, appenders)
            rows.append(
                f"| journal alone, in process, `{policy}`, {appenders} appender(s) | {rate:,.0f} samples/s; "
                f"{ms:.2f} ms per 1,000-sample append | - |"
            )
    os.sched_setaffinity(0, {args.client_core})
    if args.compare_repo is not None:
        print(f"ingesting without a journal ({args.compare_repo}) ...", flush=True)
        result = ingest_runs(tmp, bodies, args, no_retrain, repo=args.compare_repo)
        rows.append(
            f"| no journal (the code before it, `{args.compare_repo}`) | {result['samples_per_s']:,.0f} "
            f"samples/s ({result['samples_per_s'] / baseline:.2f}x validation baseline); server CPU "
            f"{result['cpu_us']:.1f} us/sample | - |"
        )
        details.append(f"- no journal runs (samples/s): {result['all']}; 429 answers: {result['rejected']}")
    for policy in ("always", "everysec", "no"):
        print(f"ingesting with --journal-fsync {policy} ...", flush=True)
        result = ingest_runs(tmp, bodies, args, [*no_retrain, "--journal-fsync", policy])
        commits = max(int(result["journal"].get("group_commits", 0)), 1)
        default = " (default)" if policy == "always" else ""
        rows.append(
            f"| `--journal-fsync {policy}`{default} | {result['samples_per_s']:,.0f} samples/s "
            f"({result['samples_per_s'] / baseline:.2f}x validation baseline); server CPU "
            f"{result['cpu_us']:.1f} us/sample; {result['requests'] / commits:.1f} requests per commit "
            "| >= 100,000/s |"
        )
        details.append(f"- `{policy}` runs (samples/s): {result['all']}; 429 answers: {result['rejected']}")
    return "\n".join(
        [
            JOURNAL_BEGIN,
            "## The ingest journal: cost of each fsync policy",
            "",
            f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with the same setup (trainer idle, "
            f"{args.repeats} runs of {args.requests} requests x 1,000, {args.concurrency} connections); "
            f"validation baseline in the same run {baseline:,.0f} samples/s.",
            "",
            "| measurement | median | target |",
            "|---|---|---|",
            *rows,
            "",
            *details,
            JOURNAL_NOTES,
            JOURNAL_END,
        ]
    )


def write_journal_section(path: Path, section: str) -> None:
    text = path.read_text() if path.exists() else "# Training server benchmarks\n"
    if JOURNAL_BEGIN in text and JOURNAL_END in text:
        head, rest = text.split(JOURNAL_BEGIN, 1)
        text = head + section + rest.split(JOURNAL_END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


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
    parser.add_argument(
        "--compare-repo",
        type=Path,
        default=None,
        help="also measure a server from this checkout (no journal)",
    )
    parser.add_argument(
        "--journal-only", action="store_true", help="only the fsync-policy comparison (replaces its section)"
    )
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
    if args.journal_only:
        section = journal_section(tmp, bodies, args, baseline)
        load_after = os.getloadavg()
        section = section.replace(
            JOURNAL_END, f"- load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f} "
            "(shared, busy machine)\n" + JOURNAL_END
        )  # fmt: skip
        print(section)
        if args.out is not None:
            write_journal_section(args.out, section)
        return
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
    journal = journal_section(tmp, bodies, args, baseline)
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
            + "\n"
            + journal
            + "\n"
        )


if __name__ == "__main__":
    main()
