"""Open-loop load benchmark: prediction_server against a naive pandas/pydantic reference.

Run from the repository root (2+ cores; the servers get core 0, this generator core 1):

    .venv/bin/python bench/prediction_load.py [--runs 3] [--duration-s 10]

Both servers serve the same trained model version (150 trees of depth 6 per model, like the
training server's defaults) from one temporary store, each as a single worker process pinned
with ``taskset -c 0``. For each scenario (rows per call, target calls/s) the generator sends
requests on a fixed schedule, whatever the answers do (open loop), over keep-alive HTTP/1.1
connections opened as needed, and measures each latency from the request's *scheduled* send
time, so a server (or generator) that falls behind is charged for the queueing it causes.
A request still unanswered after ``--timeout-s``, or that would need more than
``--max-in-flight`` connections, counts as an error. Scenarios and servers alternate within
each run, so background noise hits both alike; figures are medians over runs.

Reported per scenario and server: achieved rate (successful calls/s and rows/s), p50/p90/p99
latency, errors, server CPU per call (from /proc) and the generator's own CPU use, which must
stay well below one core for the numbers to describe the server.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import asyncio
import contextlib
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from shared.artifacts import ModelStore, to_margin_target  # noqa: E402
from shared.features import build_features  # noqa: E402
from shared.prior import prior_latency_ms, synthetic_columns  # noqa: E402
from shared.schemas import pod_type_name  # noqa: E402

SCENARIOS: tuple[tuple[int, float], ...] = ((10, 1000.0), (100, 500.0))
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class RunResult:
    server: str
    rows: int
    target_rps: float
    sent: int
    ok: int
    errors: int
    achieved_rps: float
    rows_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_send_lag_ms: float
    server_cpu_us_per_call: float
    server_cpu_share: float
    # Share of the run the server was runnable but waiting for its core (other processes on it).
    server_wait_share: float
    generator_cpu_share: float


# -- workload and model ----------------------------------------------------------------------------


def make_rows(n: int, seed: int) -> list[dict[str, Any]]:
    columns = synthetic_columns(n, np.random.default_rng(seed))
    rows = []
    for i in range(n):
        row: dict[str, Any] = {name: column[i].item() for name, column in columns.items()}
        for name, value in row.items():
            if name not in ("kv_cache_percentage", "prefix_cache_score", "pod_type"):
                row[name] = int(value)
        row["pod_type"] = pod_type_name(int(row["pod_type"]))
        rows.append(row)
    return rows


def publish_benchmark_model(store: ModelStore, rounds: int, depth: int) -> str:
    import xgboost as xgb

    rng = np.random.default_rng(1)
    columns = synthetic_columns(20_000, rng)
    features = build_features(columns)
    models = {}
    for name, target in zip(("ttft", "tpot"), prior_latency_ms(columns, 0.5), strict=True):
        label = to_margin_target(target * rng.lognormal(0.0, 0.3, len(target)), "log1p")
        params = {"objective": "reg:quantileerror", "quantile_alpha": 0.9, "max_depth": depth, "eta": 0.1}
        booster = xgb.train({**params, "nthread": 1}, xgb.DMatrix(features, label=label), rounds)
        models[name] = bytes(booster.save_raw("ubj"))
    return store.publish("trained", models, objective="quantile", quantile=0.9).version


# -- servers ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, name: str, command: list[str], port: int, log: Path) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                ["taskset", "-c", "0", sys.executable, *command],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
            )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{name} exited:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                answered = httpx.get(self.url + "/healthz", timeout=1).status_code == 200
                if answered and self.proc.poll() is None:  # ours, not a stranger on the port
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime

    def runqueue_wait_s(self) -> float:
        """Time spent runnable but not running (``/proc/<pid>/schedstat``, second field)."""
        return int(Path(f"/proc/{self.proc.pid}/schedstat").read_text().split()[1]) / 1e9

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


# -- open-loop generator ---------------------------------------------------------------------------


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    start = lower.index(b"content-length:") + 15
    length = int(lower[start : lower.index(b"\r\n", start)])
    return status, await reader.readexactly(length)


async def open_loop(
    port: int, body: bytes, rows: int, rate: float, duration_s: float, timeout_s: float, max_in_flight: int
) -> tuple[list[float], int, int, float, float]:
    """Send ``rate`` calls/s for ``duration_s``.

    Returns the latencies (s) of the answered calls, the number sent, errors, the largest send
    lag (s) and the window from the first scheduled send to the last answer (s).
    """
    request = (
        b"POST /predict/bulk/strict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    idle: list[_Conn] = []
    latencies: list[float] = []
    errors = 0
    in_flight = 0
    max_lag = 0.0
    marker = b'"ttft_ms"'

    async def one(intended: float) -> None:
        nonlocal errors, in_flight
        conn = idle.pop() if idle else None
        try:
            if conn is None:
                conn = _Conn(*await asyncio.open_connection("127.0.0.1", port))
            conn.writer.write(request)
            status, payload = await asyncio.wait_for(_read_response(conn.reader), timeout_s)
            if status != 200 or payload.count(marker) != rows:
                errors += 1
            else:
                done = time.perf_counter()
                latencies.append(done - intended)
                last_done[0] = max(last_done[0], done)
            idle.append(conn)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
            errors += 1
            if conn is not None:
                conn.writer.close()
        finally:
            in_flight -= 1

    tasks: set[asyncio.Task[None]] = set()
    total = int(rate * duration_s)
    interval = 1.0 / rate
    start = time.perf_counter() + 0.01
    last_done = [start]
    for i in range(total):
        intended = start + i * interval
        delay = intended - time.perf_counter()
        if delay > 0.0005:
            await asyncio.sleep(delay)
        max_lag = max(max_lag, time.perf_counter() - intended)
        if in_flight >= max_in_flight:
            errors += 1  # the server is this far behind: the call would only queue
            continue
        in_flight += 1
        task = asyncio.create_task(one(intended))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(tasks, timeout=timeout_s + 1)
    for conn in idle:
        conn.writer.close()
    # From the first scheduled send to the last answer: the window the answered calls took.
    return latencies, total, errors, max_lag, max(last_done[0] - start, duration_s)


def measure(server: Server, rows: int, rate: float, args: argparse.Namespace, body: bytes) -> RunResult:
    cpu0, wait0, gen0, wall0 = (
        server.cpu_s(),
        server.runqueue_wait_s(),
        time.process_time(),
        time.perf_counter(),
    )
    latencies, sent, errors, lag, window = asyncio.run(
        open_loop(server.port, body, rows, rate, args.duration_s, args.timeout_s, args.max_in_flight)
    )
    wall = time.perf_counter() - wall0
    cpu, gen = server.cpu_s() - cpu0, time.process_time() - gen0
    wait = server.runqueue_wait_s() - wait0
    ok = len(latencies)
    q = np.quantile(np.array(latencies), [0.5, 0.9, 0.99]) * 1000 if latencies else [float("nan")] * 3
    return RunResult(
        server=server.name,
        rows=rows,
        target_rps=rate,
        sent=sent,
        ok=ok,
        errors=errors,
        achieved_rps=ok / window,
        rows_per_s=ok * rows / window,
        p50_ms=float(q[0]),
        p90_ms=float(q[1]),
        p99_ms=float(q[2]),
        max_send_lag_ms=lag * 1000,
        server_cpu_us_per_call=cpu / ok * 1e6 if ok else float("nan"),
        server_cpu_share=cpu / wall,
        server_wait_share=wait / wall,
        generator_cpu_share=gen / wall,
    )


def check_same_answers(servers: list[Server], rows: list[dict[str, Any]]) -> None:
    answers = []
    for server in servers:
        response = httpx.post(server.url + "/predict/bulk/strict", json={"requests": rows}, timeout=30)
        response.raise_for_status()
        answers.append(np.array([[p["ttft_ms"], p["tpot_ms"]] for p in response.json()["predictions"]]))
    for other in answers[1:]:
        np.testing.assert_allclose(other, answers[0], rtol=1e-6)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--timeout-s", type=float, default=10.0)
    parser.add_argument("--max-in-flight", type=int, default=256)
    parser.add_argument("--trees", type=int, default=150)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--no-naive", action="store_true", help="skip the reference server")
    parser.add_argument(
        "--scenario",
        action="append",
        default=[],
        metavar="ROWS:RATE",
        help="rows per call and target calls/s (repeatable); default 10:1000 and 100:500",
    )
    parser.add_argument("--json", type=Path, help="also write every run's figures here")
    args = parser.parse_args()
    scenarios = [(int(r), float(q)) for r, q in (s.split(":") for s in args.scenario)] or list(SCENARIOS)
    os.sched_setaffinity(0, {1})

    import uvloop

    workdir = Path(tempfile.mkdtemp(prefix="prediction-bench-"))
    store = ModelStore(workdir / "store")
    version = publish_benchmark_model(store, args.trees, args.depth)
    print(f"model {version}: {args.trees} trees x depth {args.depth} per model; store {store.root}")
    ours_port = free_port()
    ours_args = ["--port", str(ours_port), "--store", str(store.root), "--log-level", "warning"]
    servers = [
        Server(
            "prediction_server",
            ["-m", "prediction_server", *ours_args],
            ours_port,
            workdir / "prediction_server.log",
        )
    ]
    if not args.no_naive:
        naive_port = free_port()
        servers.append(
            Server(
                "naive",
                ["bench/naive_prediction_server.py", "--port", str(naive_port), "--store", str(store.root)],
                naive_port,
                workdir / "naive.log",
            )
        )
    results: list[RunResult] = []
    try:
        check_same_answers(servers, make_rows(200, 99))
        bodies = {rows: orjson.dumps({"requests": make_rows(rows, rows)}) for rows, _ in scenarios}
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        for server in servers:  # warm up connections, caches and allocators
            measure(
                server,
                scenarios[0][0],
                200.0,
                argparse.Namespace(**{**vars(args), "duration_s": 2.0}),
                bodies[scenarios[0][0]],
            )
        for run in range(args.runs):
            for rows, rate in scenarios:
                for server in servers:
                    result = measure(server, rows, rate, args, bodies[rows])
                    results.append(result)
                    print(f"run {run + 1} {describe(result)}", flush=True)
    finally:
        for server in servers:
            server.stop()
    print_summary(results, scenarios, [s.name for s in servers])
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))


def describe(r: RunResult) -> str:
    return (
        f"{r.server:17s} {r.rows:4d} rows @ {r.target_rps:6.0f}/s: {r.achieved_rps:7.1f} calls/s "
        f"{r.rows_per_s:8.0f} rows/s p50 {r.p50_ms:7.2f} p90 {r.p90_ms:7.2f} p99 {r.p99_ms:8.2f} ms "
        f"errors {r.errors:5d} | server cpu {r.server_cpu_us_per_call:6.0f} us/call, busy "
        f"{r.server_cpu_share:4.0%}, waited for its core {r.server_wait_share:4.0%} | generator cpu "
        f"{r.generator_cpu_share:4.0%}, max send lag {r.max_send_lag_ms:.0f} ms"
    )


def print_summary(results: list[RunResult], scenarios: list[tuple[int, float]], names: list[str]) -> None:
    print("\nmedians over runs:")
    print(
        "| server | rows/call | target calls/s | calls/s | rows/s | p50 ms | p90 ms | p99 ms | errors "
        "| server CPU µs/call | server waited for its core | generator CPU |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    medians: dict[tuple[str, int], dict[str, float]] = {}
    for rows, rate in scenarios:
        for name in names:
            runs = [r for r in results if r.server == name and r.rows == rows and r.target_rps == rate]
            m = {
                key: statistics.median(getattr(r, key) for r in runs)
                for key in (
                    "achieved_rps",
                    "rows_per_s",
                    "p50_ms",
                    "p90_ms",
                    "p99_ms",
                    "errors",
                    "server_cpu_us_per_call",
                    "server_wait_share",
                    "generator_cpu_share",
                )
            }
            medians[(name, rows)] = m
            print(
                f"| {name} | {rows} | {rate:.0f} | {m['achieved_rps']:.0f} | {m['rows_per_s']:.0f} "
                f"| {m['p50_ms']:.2f} | {m['p90_ms']:.2f} | {m['p99_ms']:.2f} | {m['errors']:.0f} "
                f"| {m['server_cpu_us_per_call']:.0f} | {m['server_wait_share']:.0%} "
                f"| {m['generator_cpu_share']:.0%} |"
            )
    if len(names) > 1:
        ours, naive = names[0], names[1]
        for rows, _ in scenarios:
            a, b = medians[(ours, rows)], medians[(naive, rows)]
            rate_ratio = a["achieved_rps"] / max(b["achieved_rps"], 1e-9)
            cost_ratio = b["server_cpu_us_per_call"] / a["server_cpu_us_per_call"]
            print(
                f"{rows} rows/call, same offered load: {ours} answered {rate_ratio:.1f}x the calls/s of "
                f"{naive}, spending {cost_ratio:.1f}x less server CPU per call; "
                f"p99 {a['p99_ms']:.1f} ms vs {b['p99_ms']:.1f} ms"
            )


if __name__ == "__main__":
    main()
