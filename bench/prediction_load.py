"""Capacity of the prediction server as a fraction of the HTTP floor, open-loop, in one run.

Run from the repository root (2+ cores; the servers get core 0, this generator core 1):

    python bench/prediction_load.py [--runs 3] [--rows 1,10,100] [--sizes 200x6,150x6]

Servers, each one process pinned with ``taskset -c 0``, ``OMP_NUM_THREADS=1``:
  floor          bench/floor_server.py: uvicorn + uvloop + httptools + orjson, parses the request
                 and answers a canned body of the same shape (no validation, features or trees);
  ours-TxD       python -m prediction_server serving a trained version of T trees of depth D per
                 model (200x6 is the llm-d predictor's size, 150x6 the training server's default),
                 with baselines and offsets like the training server's versions, in their widest
                 form (``--forms served``, the default; ``publish_benchmark_model``);
  ours-TxD-linear with ``--forms linear``: a plain linear baseline and no offsets, the version
                 this benchmark served before the wider forms (figures comparable with earlier runs);
  base-TxD       with ``--baseline-code DIR``: the first size's first form, served by the code in
                 DIR (another checkout), for a before/after in the same run;
  churn-TxD      with ``--calibration-every-s S``: the first size's served form from a store that
                 gets a calibration version (new regime offsets, the same trees) every S seconds
                 during the runs, as the training server's live scorer publishes them.

Generator: wrk where it is installed (``--generator wrk``, the default; ``bench/wrk_load.py``:
closed loop, 1, 2, 4, ... connections, capacity = the highest calls/s with p99 within the bound),
else this script's open-loop generator (``--generator python``), which costs ~150-180 µs of CPU
per call and so saturates near 6,000 calls/s on one core, below the floor server's capacity.

Open-loop capacity: for each (server, rows per call) the generator first offers a light load to
measure the server's CPU per call, then offers fixed rates at fractions of the rate that CPU cost allows
(``--fractions``) for ``--step-s`` each, open loop (call *i* is sent at ``start + i / rate``
whatever the answers do, over keep-alive connections, and its latency runs from that due time),
until a rate fails: p99 above ``--p99-ms``, more than 0.1 % errors, or fewer answered than 98 %
of those offered; then up to ``--refine`` steps bisect between the highest passing and the lowest
failing rate. The capacity is the highest passing rate's answered calls/s.
Servers and row counts alternate within each run so background noise hits all alike; the
summary gives medians over runs, and ours as a fraction of the floor measured in the same run.
The generator's own CPU share is reported: near 100 % it, not the server, was the limit.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import asyncio
import contextlib
import json
import math
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.wrk_load import write_script, wrk_capacity  # noqa: E402
from shared.artifacts import MODEL_NAMES, to_margin_target  # noqa: E402
from shared.baseline import WORK_FEATURES  # noqa: E402
from shared.features import build_features  # noqa: E402
from shared.model_store import ModelStore  # noqa: E402
from shared.prior import prior_latency_ms, synthetic_columns  # noqa: E402
from shared.regimes import DEFAULT_SCHEME, RegimeOffsets  # noqa: E402
from shared.wire_fields import pod_type_name  # noqa: E402
from training_server.baseline_fit import widest_baseline  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
FLOOR = "floor"


@dataclass
class StepResult:
    server: str
    rows: int
    run: int
    offered_rps: float
    sent: int
    ok: int
    errors: int
    achieved_rps: float
    p50_ms: float
    p99_ms: float
    server_cpu_us_per_call: float
    server_wait_share: float
    generator_cpu_share: float
    passed: bool
    connections: int = 0  # wrk's (closed loop); 0 for the open-loop generator


# -- workload and models -----------------------------------------------------------------------------


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


def publish_benchmark_model(store: ModelStore, rounds: int, depth: int, form: str = "served") -> str:
    """A trained version like the training server's: quantile trees around a work-ahead baseline.

    ``form`` "served": what the training server publishes at its defaults, at the most it may
    ask of the prediction path: each model's widest baseline (TTFT's KV-scaled terms, TPOT's bent
    and bounded terms, ``training_server.baseline_fit.widest_baseline``), a calibration offset and
    regime offsets. "linear": a plain linear baseline and no offsets (this benchmark's version
    before the wider forms existed, for figures comparable with the earlier ones)."""
    import xgboost as xgb

    rng = np.random.default_rng(1)
    columns = synthetic_columns(20_000, rng)
    features = build_features(columns)
    models: dict[str, bytes] = {}
    baselines: dict[str, dict[str, Any] | None] = {}
    offsets: dict[str, float] = {}
    regimes: dict[str, RegimeOffsets | None] = {}
    for name, target in zip(MODEL_NAMES, prior_latency_ms(columns, 0.5), strict=True):
        latency = target * rng.lognormal(0.0, 0.3, len(target))
        if form == "served":
            baselines[name] = widest_baseline(name, features, latency, 0.9)
            offsets[name] = 0.05
            regimes[name] = random_regime_offsets(rng)
        else:
            work = WORK_FEATURES[name]
            baselines[name] = {
                "kind": "linear",
                "features": list(work),
                "intercept": 5.0,
                "coefficients": [0.001] * len(work),
            }
        label = to_margin_target(latency, "log1p")
        params = {"objective": "reg:quantileerror", "quantile_alpha": 0.9, "max_depth": depth, "eta": 0.1}
        booster = xgb.train({**params, "nthread": 1}, xgb.DMatrix(features, label=label), rounds)
        models[name] = bytes(booster.save_raw("ubj"))
    return store.publish(
        "trained",
        models,
        objective="quantile",
        quantile=0.9,
        baselines=baselines,
        calibration_offsets=offsets,
        regime_offsets=regimes,
    ).version


def random_regime_offsets(rng: np.random.Generator) -> RegimeOffsets:
    """Regime offsets of the size the live scorer publishes (``DEFAULT_SCHEME``), random values."""
    return RegimeOffsets.of(DEFAULT_SCHEME, np.round(rng.uniform(-0.1, 0.3, DEFAULT_SCHEME.size), 6))


class CalibrationChurn:
    """While ``running``: publishes a calibration version (the same trees, new regime offsets, as
    the training server's live scorer does) to ``store`` every ``every_s`` seconds, from a thread.
    Only while its own server is measured: the servers share a core, and another server's swaps
    would cost the one under test."""

    def __init__(self, store: ModelStore, every_s: float) -> None:
        self.store, self.every_s = store, every_s
        self.published = 0
        self._rng = np.random.default_rng(2)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        stop = threading.Event()
        thread = threading.Thread(target=self._run, args=(stop,), name="calibration-churn", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.every_s):
            current = self.store.current_version()
            assert current is not None
            offsets = {name: random_regime_offsets(self._rng) for name in MODEL_NAMES}
            if self.store.publish_calibrated(current, offsets, {}) is not None:
                self.published += 1


# -- servers ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    def __init__(self, name: str, command: list[str], port: int, log: Path, code: Path = REPO) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(code)}
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                ["taskset", "-c", "0", sys.executable, *command],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=code,
            )
        deadline = time.monotonic() + 120
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


# -- open-loop generator -----------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One keep-alive connection with at most one call in flight (HTTP/1.1 without pipelining)."""

    def __init__(self, load: _OpenLoop) -> None:
        self.load = load
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.intended = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(self.buffer[:end]).lower()
        at = head.find(b"content-length:") + 15
        stop = head.find(b"\r\n", at)
        length = int(head[at : stop if stop >= 0 else len(head)])
        if len(self.buffer) < end + 4 + length:
            return
        body = bytes(self.buffer[end + 4 : end + 4 + length])
        status = int(head[9:12])
        del self.buffer[: end + 4 + length]
        self.load.answered(self, status, body)

    def connection_lost(self, exc: Exception | None) -> None:
        self.load.lost(self)


class _OpenLoop:
    def __init__(self, port: int, request: bytes, rows: int, max_in_flight: int) -> None:
        self.port = port
        self.request = request
        self.marker_count = rows
        self.max_in_flight = max_in_flight
        self.idle: list[_Connection] = []
        self.busy: set[_Connection] = set()
        self.opening = 0
        self.latencies: list[float] = []
        self.errors = 0
        self.last_answer = 0.0

    def answered(self, conn: _Connection, status: int, body: bytes) -> None:
        now = time.perf_counter()
        self.busy.discard(conn)
        if status == 200 and body.count(b'"ttft_ms"') == self.marker_count:
            self.latencies.append(now - conn.intended)
            self.last_answer = now
        else:
            self.errors += 1
        self.idle.append(conn)

    def lost(self, conn: _Connection) -> None:
        if conn in self.busy:
            self.busy.discard(conn)
            self.errors += 1
        with contextlib.suppress(ValueError):
            self.idle.remove(conn)

    async def _open_and_send(self, intended: float) -> None:
        self.opening += 1
        try:
            loop = asyncio.get_running_loop()
            _, conn = await loop.create_connection(lambda: _Connection(self), "127.0.0.1", self.port)
        except OSError:
            self.errors += 1
            return
        finally:
            self.opening -= 1
        self._send(conn, intended)

    def _send(self, conn: _Connection, intended: float) -> None:
        conn.intended = intended
        self.busy.add(conn)
        assert conn.transport is not None
        conn.transport.write(self.request)

    def send(self, intended: float, tasks: set[asyncio.Task[None]]) -> None:
        if self.idle:
            self._send(self.idle.pop(), intended)
        elif len(self.busy) + self.opening < self.max_in_flight:
            task = asyncio.get_running_loop().create_task(self._open_and_send(intended))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        else:
            self.errors += 1  # the server is this far behind: the call would only queue

    async def run(self, rate: float, duration_s: float, timeout_s: float) -> tuple[int, float]:
        """Offer ``rate`` calls/s for ``duration_s``; returns (sent, window from first due to last answer)."""
        tasks: set[asyncio.Task[None]] = set()
        total = int(rate * duration_s)
        start = time.perf_counter() + 0.01
        self.last_answer = start
        sent = 0
        while sent < total:
            due = min(total, int((time.perf_counter() - start) * rate) + 1)
            while sent < due:
                self.send(start + sent / rate, tasks)
                sent += 1
            # Sleep at least 0.5 ms (uvloop's timers have 1 ms resolution): a burst of due calls is
            # then sent together instead of the generator spinning, and each is still timed from
            # its own due time.
            await asyncio.sleep(max(0.0005, start + sent / rate - time.perf_counter()))
        deadline = time.perf_counter() + timeout_s
        while (self.busy or tasks) and time.perf_counter() < deadline:
            await asyncio.sleep(0.005)
        self.errors += len(self.busy)  # unanswered within the timeout
        for conn in [*self.idle, *self.busy]:
            if conn.transport is not None:
                conn.transport.close()
        return total, max(self.last_answer - start, duration_s)


def offer(
    server: Server,
    rows: int,
    rate: float,
    duration_s: float,
    args: argparse.Namespace,
    request: bytes,
    run: int,
) -> StepResult:
    cpu0, wait0, gen0, wall0 = (
        server.cpu_s(),
        server.runqueue_wait_s(),
        time.process_time(),
        time.perf_counter(),
    )
    load = _OpenLoop(server.port, request, rows, args.max_in_flight)
    sent, window = asyncio.run(load.run(rate, duration_s, args.timeout_s))
    wall = time.perf_counter() - wall0
    cpu, gen, wait = server.cpu_s() - cpu0, time.process_time() - gen0, server.runqueue_wait_s() - wait0
    ok = len(load.latencies)
    q = np.quantile(np.array(load.latencies), [0.5, 0.99]) * 1000 if ok else [float("nan")] * 2
    achieved = ok / window
    passed = bool(
        ok
        and q[1] <= args.p99_ms
        and load.errors <= 0.001 * sent
        and ok >= 0.98 * sent
        and achieved >= 0.98 * rate
    )
    return StepResult(
        server=server.name,
        rows=rows,
        run=run,
        offered_rps=rate,
        sent=sent,
        ok=ok,
        errors=load.errors,
        achieved_rps=achieved,
        p50_ms=float(q[0]),
        p99_ms=float(q[1]),
        server_cpu_us_per_call=cpu / ok * 1e6 if ok else float("nan"),
        server_wait_share=wait / wall,
        generator_cpu_share=gen / wall,
        passed=passed,
    )


def capacity(
    server: Server, rows: int, args: argparse.Namespace, request: bytes, run: int
) -> tuple[StepResult | None, list[StepResult]]:
    """The highest passing step (None if even the lowest failed) and every step measured.

    The listed fractions of the CPU-derived rate first (lower ones after a failure at the first,
    higher ones while every listed one passes), then up to ``--refine`` steps bisecting
    (geometrically) between the highest passing and the lowest failing rate, while they are more
    than 10 % apart.
    """
    probe = offer(server, rows, args.probe_rps, args.probe_s, args, request, run)
    steps = [probe]
    estimate = 1e6 / probe.server_cpu_us_per_call  # calls/s one core allows at this CPU cost
    best: StepResult | None = None
    lowest_failing: float | None = None
    fractions = list(args.fractions)

    def measure(rate: float) -> StepResult:
        step = offer(server, rows, rate, args.step_s, args, request, run)
        steps.append(step)
        print(f"  run {run} {describe(step)}", flush=True)
        return step

    while fractions and len(steps) <= args.max_steps:
        fraction = fractions.pop(0)
        step = measure(fraction * estimate)
        if not step.passed:
            lowest_failing = step.offered_rps
            if best is None and fraction > 0.2:  # failed at the first rate: try lower ones
                fractions = [fraction * 0.6]
                continue
            break
        best = step
        if not fractions:  # every listed rate passed: keep climbing
            fractions.append(fraction * 1.15)
    for _ in range(args.refine):
        if best is None or lowest_failing is None or lowest_failing <= best.offered_rps * 1.1:
            break
        step = measure(math.sqrt(best.offered_rps * lowest_failing))
        if step.passed:
            best = step
        else:
            lowest_failing = step.offered_rps
    return best, steps


def settled_status(server: Server, timeout_s: float = 120.0) -> dict[str, Any]:
    """``/status`` once the first version's evaluator has settled: a worker serves it through
    XGBoost's C predictor until its JIT kernel is loaded in the background."""
    deadline = time.monotonic() + timeout_s
    status = httpx.get(server.url + "/status").json()
    while status["evaluator"] == "xgboost-c" and time.monotonic() < deadline:
        time.sleep(0.1)
        status = httpx.get(server.url + "/status").json()
    return dict(status)


def check_same_answers(servers: list[Server], rows: list[dict[str, Any]]) -> None:
    """Every prediction server answers the same rows with the same bits as itself one row at a time."""
    for server in servers:
        bulk = httpx.post(server.url + "/predict/bulk/strict", json={"requests": rows}, timeout=30)
        bulk.raise_for_status()
        got = [(p["ttft_ms"], p["tpot_ms"]) for p in bulk.json()["predictions"]]
        for row, expected in list(zip(rows, got, strict=True))[:20]:
            one = httpx.post(server.url + "/predict", json=row, timeout=30).json()
            assert (one["ttft_ms"], one["tpot_ms"]) == expected, server.name


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", default="1,10,100", help="rows per call, comma-separated")
    parser.add_argument("--sizes", default="200x6,150x6", help="TREESxDEPTH per model of each server")
    parser.add_argument(
        "--fractions", default="0.6,0.8,0.95,1.1,1.25", help="of the rate the probe's CPU per call allows"
    )
    parser.add_argument("--max-steps", type=int, default=9, help="rates tried per server and row count")
    parser.add_argument(
        "--refine", type=int, default=3, help="bisecting steps between the best pass and the lowest fail"
    )
    parser.add_argument("--probe-rps", type=float, default=300.0)
    parser.add_argument("--probe-s", type=float, default=2.0)
    parser.add_argument("--step-s", type=float, default=4.0)
    parser.add_argument("--p99-ms", type=float, default=50.0)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    parser.add_argument("--max-in-flight", type=int, default=256)
    parser.add_argument(
        "--generator",
        choices=("wrk", "python"),
        default="wrk" if shutil.which("wrk") else "python",
        help="wrk (closed loop, bench/wrk_load.py; the default where installed) or this script's "
        "open-loop generator, which saturates near 6,000 calls/s on one core",
    )
    parser.add_argument("--max-connections", type=int, default=64, help="wrk: connections tried up to")
    parser.add_argument("--json", type=Path, help="also write every step's figures here")
    parser.add_argument(
        "--forms",
        default="served",
        help="versions served per size, comma-separated: 'served' (ours-TxD: the widest baselines and "
        "regime offsets the training server publishes) and/or 'linear' (ours-TxD-linear: a linear "
        "baseline without offsets, as this benchmark served before)",
    )
    parser.add_argument(
        "--calibration-every-s",
        type=float,
        default=0.0,
        help="also serve the first size's served form as churn-TxD, from a store that gets a "
        "calibration version (new regime offsets) this often, as the live scorer publishes them "
        "(its default: every 0.25 s); 0: off",
    )
    parser.add_argument(
        "--baseline-code",
        type=Path,
        help="another checkout (e.g. from git worktree) serving the first size too, as base-TxD",
    )
    args = parser.parse_args()
    args.fractions = [float(f) for f in args.fractions.split(",")]
    row_counts = [int(n) for n in args.rows.split(",")]
    forms = args.forms.split(",")
    if not set(forms) <= {"served", "linear"}:
        parser.error(f"--forms: {args.forms!r}, expected served and/or linear")
    if args.calibration_every_s and "served" not in forms:
        parser.error("--calibration-every-s churns the served form: add it to --forms")
    os.sched_setaffinity(0, {1})

    import uvloop

    workdir = Path(tempfile.mkdtemp(prefix="prediction-bench-"))
    servers: list[Server] = []
    churns: dict[str, CalibrationChurn] = {}  # --calibration-every-s: per server name
    results: list[StepResult] = []
    best: dict[tuple[str, int, int], StepResult | None] = {}
    try:
        port = free_port()
        servers.append(
            Server(FLOOR, ["bench/floor_server.py", "--port", str(port)], port, workdir / "floor.log")
        )

        def start(name: str, store: ModelStore, code: Path = REPO) -> dict[str, Any]:
            port = free_port()
            command = ["-m", "prediction_server", "--port", str(port), "--store", str(store.root)]
            log = workdir / f"{name}.log"
            servers.append(Server(name, [*command, "--log-level", "warning"], port, log, code))
            return settled_status(servers[-1])

        for index, size in enumerate(args.sizes.split(",")):
            trees, depth = (int(v) for v in size.split("x"))
            for form in forms:
                name = f"ours-{size}" if form == "served" else f"ours-{size}-{form}"
                store = ModelStore(workdir / f"store-{name}")
                version = publish_benchmark_model(store, trees, depth, form)
                status = start(name, store)
                print(f"{name}: version {version}, evaluator {status['evaluator']}", flush=True)
                if index > 0:  # base- and churn- serve the first size only
                    continue
                if args.baseline_code and form == forms[0]:
                    status = start(f"base-{size}", store, args.baseline_code)
                    print(f"base-{size}: {args.baseline_code}, evaluator {status['evaluator']}", flush=True)
                if args.calibration_every_s and form == "served":
                    # the same version (a copy of its store) from a store of its own, which gets
                    # calibration versions
                    churned = ModelStore(shutil.copytree(store.root, workdir / f"store-churn-{size}"))
                    start(f"churn-{size}", churned)
                    churns[f"churn-{size}"] = CalibrationChurn(churned, args.calibration_every_s)
        check_same_answers(servers[1:], make_rows(100, 99))
        requests, bodies = {}, {}
        for rows in row_counts:
            body = bodies[rows] = orjson.dumps({"requests": make_rows(rows, rows)})
            requests[rows] = (
                b"POST /predict/bulk/strict HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        scripts = {rows: write_script(workdir, rows, bodies[rows]) for rows in row_counts}
        for server in servers:  # warm up connections, caches and allocators
            offer(server, row_counts[0], 200.0, 1.0, args, requests[row_counts[0]], 0)
        print(f"generator: {args.generator}", flush=True)
        for name in churns:
            print(f"{name}: a calibration version every {args.calibration_every_s:g} s", flush=True)
        for run in range(1, args.runs + 1):
            for rows in row_counts:
                for server in servers:
                    churn = churns.get(server.name)
                    with churn.running() if churn is not None else contextlib.nullcontext():
                        if args.generator == "wrk":
                            top, steps = wrk_capacity(server, rows, scripts[rows], args, run, StepResult)
                        else:
                            top, steps = capacity(server, rows, args, requests[rows], run)
                    results.extend(steps)
                    best[(server.name, rows, run)] = top
    finally:
        for server in servers:
            if server.name in churns:  # that the server took them: the version it serves at the end
                with contextlib.suppress(httpx.HTTPError):
                    serving = httpx.get(server.url + "/status").json()["model_version"]
                    published = churns[server.name].published
                    print(
                        f"{server.name}: {published} calibration versions published while measured, "
                        f"serving {serving} (store: {churns[server.name].store.current_version()})",
                        flush=True,
                    )
        for server in servers:
            server.stop()
    print_summary(best, row_counts, [s.name for s in servers], args.runs)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=2))


def describe(r: StepResult) -> str:
    return (
        f"{r.server:12s} {r.rows:4d} rows @ {r.offered_rps:7.0f}/s: {r.achieved_rps:7.0f} calls/s "
        f"p50 {r.p50_ms:6.2f} p99 {r.p99_ms:7.2f} ms errors {r.errors:5d} | server cpu "
        f"{r.server_cpu_us_per_call:5.0f} us/call, waited {r.server_wait_share:4.0%} | generator cpu "
        f"{r.generator_cpu_share:4.0%} | {'pass' if r.passed else 'FAIL'}"
    )


def print_summary(
    best: dict[tuple[str, int, int], StepResult | None], row_counts: list[int], names: list[str], runs: int
) -> None:
    def med(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    print(f"\nmedians over {runs} runs (capacity: highest passing offered rate, its answered calls/s):")
    print(
        "| server | rows/call | calls/s | p99 ms | server CPU µs/call | calls/s vs floor "
        "| floor CPU / our CPU | generator CPU | server waited |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for rows in row_counts:
        for name in names:
            tops = [best[(name, rows, run)] for run in range(1, runs + 1)]
            ratios, cpu_ratios = [], []
            for run, top in enumerate(tops, start=1):
                floor = best[(FLOOR, rows, run)]
                if top is not None and floor is not None:
                    ratios.append(top.achieved_rps / floor.achieved_rps)
                    cpu_ratios.append(floor.server_cpu_us_per_call / top.server_cpu_us_per_call)
            got = [t for t in tops if t is not None]
            cells = [
                f"{med([t.achieved_rps for t in got]):.0f}",
                f"{med([t.p99_ms for t in got]):.1f}",
                f"{med([t.server_cpu_us_per_call for t in got]):.0f}",
                f"{med(ratios):.0%}",
                f"{med(cpu_ratios):.0%}",
                f"{med([t.generator_cpu_share for t in got]):.0%}",
                f"{med([t.server_wait_share for t in got]):.0%}",
            ]
            print(f"| {name} | {rows} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
