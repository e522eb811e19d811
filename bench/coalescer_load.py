"""Coalescer load benchmark: the latency it adds when idle, the throughput it gains under
concurrency, and how it sheds 5x overload.

Topology on the 2-core box: one real prediction replica (``python -m prediction_server``,
built-in prior model, one worker) pinned to CPU 1, the coalescer pinned to CPU 0, and this
process (the load generator: asyncio + uvloop over keep-alive raw HTTP/1.1 connections)
unpinned. The direct baseline calls the same replica with the same client, so both sides pay
the same client cost; the coalescer shares its core with the load generator, which is the
conservative choice for the coalescer.

1. Added latency at low load: one caller, sequential calls of ``--rows`` rows, direct and
   through the coalescer in alternating blocks of 100 calls (so both see the same background
   load); p50/p90/p99 per run, and the processes' CPU time per call.
2. Throughput: ``--concurrency`` closed-loop callers of ``--rows`` rows for ``--duration-s``,
   direct vs through the coalescer; the coalescer's mean batch (callers and rows per upstream
   call) comes from its /metrics.
3. Overload: a replica whose capacity is known and small, so a Python load generator on this
   box can offer 5x of it: the fault-injection replica (``tests.fake_upstream``) answering each
   call after 20 ms, behind a coalescer allowed one call in flight and 50 rows per call (5
   callers of 10 rows), i.e. ~250 callers/s. The capacity is measured (closed loop), then an
   open-loop arrival process offers ``--overload-factor`` times it. Reported: accepted calls
   and their latency against the 250 ms deadline, 504s, rejection latency, coalescer RSS.
   (The real replica serves ~20,000 callers/s of 10 rows in large batches, more than this box
   can offer 5x of while also running the coalescer.)

Every phase runs ``--runs`` times, direct and coalesced interleaved; the report gives medians.

    OMP_NUM_THREADS=1 .venv/bin/python bench/coalescer_load.py --out docs/benchmarks-coalescer.md
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvloop

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from coalescer.http1 import Http1Pool, UpstreamError  # noqa: E402
from tests.procs import RunningService, start_service  # noqa: E402

STRICT = "/predict/bulk/strict"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def rows_body(n: int, seed: int = 0) -> bytes:
    rows = [
        {
            "kv_cache_percentage": round((seed + i) % 97 / 97, 3),
            "input_token_length": 100 + 37 * i,
            "num_request_waiting": i % 7,
            "num_request_running": 3 + i % 11,
            "num_tokens_generated": 1,
            "prefix_cache_score": round(i % 5 / 5, 2),
        }
        for i in range(n)
    ]
    return orjson.dumps({"requests": rows})


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def pin(service: RunningService, cpu: int, enabled: bool) -> None:
    if enabled and cpu < (os.cpu_count() or 1):
        os.sched_setaffinity(service.proc.pid, {cpu})


def metric(url: str, name: str) -> float:
    total = 0.0
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.split()[-1])
    return total


# ---- load generators -------------------------------------------------------------------


async def sequential(
    direct_url: str, coalescer_url: str, body: bytes, calls: int, pids: tuple[int, int], block: int = 100
) -> dict[str, dict[str, float]]:
    """One caller, direct and through the coalescer in alternating blocks of ``block`` calls.

    Fine-grained alternation exposes both paths to the same background load on a shared box;
    each side's CPU is counted only while its own block runs.
    """
    pools = {"direct": Http1Pool(direct_url), "coalescer": Http1Pool(coalescer_url)}
    for pool in pools.values():
        for _ in range(200):
            await pool.request("POST", STRICT, body, timeout_s=5.0)
    latencies: dict[str, list[float]] = {"direct": [], "coalescer": []}
    cpu = {"direct": 0.0, "coalescer": 0.0}
    pid_of = {"direct": pids[0], "coalescer": pids[1]}
    for round_ in range(max(1, calls // block)):
        order = ("direct", "coalescer") if round_ % 2 == 0 else ("coalescer", "direct")
        for side in order:
            pool, sink, pid = pools[side], latencies[side], pid_of[side]
            cpu0 = cpu_s(pid)
            for _ in range(block):
                started = time.perf_counter()
                response = await pool.request("POST", STRICT, body, timeout_s=5.0)
                sink.append(time.perf_counter() - started)
                assert response.status == 200, response.body[:200]
            cpu[side] += cpu_s(pid) - cpu0
    for pool in pools.values():
        pool.close()
    return {
        side: {
            "p50_us": pct(values, 0.5) * 1e6,
            "p90_us": pct(values, 0.9) * 1e6,
            "p99_us": pct(values, 0.99) * 1e6,
            "cpu_per_call_us": cpu[side] / len(values) * 1e6,
        }
        for side, values in latencies.items()
    }


async def closed_loop(
    url: str, body: bytes, concurrency: int, duration_s: float, warmup_s: float = 1.0
) -> dict[str, Any]:
    pool = Http1Pool(url, max_idle=concurrency)
    codes: dict[int, int] = {}
    latencies: list[float] = []
    measuring = False
    stop_at = time.monotonic() + warmup_s + duration_s

    async def caller() -> None:
        while time.monotonic() < stop_at:
            started = time.perf_counter()
            response = await pool.request("POST", STRICT, body, timeout_s=10.0)
            if measuring:
                latencies.append(time.perf_counter() - started)
                codes[response.status] = codes.get(response.status, 0) + 1

    async def clock() -> float:
        nonlocal measuring
        await asyncio.sleep(warmup_s)
        measuring = True
        started = time.perf_counter()
        await asyncio.sleep(duration_s)
        return time.perf_counter() - started

    timer = asyncio.get_running_loop().create_task(clock())
    await asyncio.gather(*(caller() for _ in range(concurrency)))
    elapsed = await timer
    pool.close()
    return {
        "calls_per_s": codes.get(200, 0) / elapsed,
        "codes": codes,
        "p50_ms": pct(latencies, 0.5) * 1e3,
        "p99_ms": pct(latencies, 0.99) * 1e3,
    }


async def open_loop(url: str, body: bytes, rate: float, duration_s: float, pid: int) -> dict[str, Any]:
    """Arrivals at a fixed rate whatever the answers (schedulers do not slow down for us)."""
    pool = Http1Pool(url, max_idle=512)
    results: list[tuple[int, float]] = []
    rss: list[float] = []
    tasks: set[asyncio.Task[None]] = set()
    errors: dict[str, int] = {}

    async def one() -> None:
        started = time.perf_counter()
        try:
            status = (await pool.request("POST", STRICT, body, timeout_s=10.0)).status
        except UpstreamError as exc:
            status = 0
            errors[str(exc)[:80]] = errors.get(str(exc)[:80], 0) + 1
        results.append((status, time.perf_counter() - started))

    async def sample_rss() -> None:
        while not done:
            rss.append(rss_mb(pid))
            await asyncio.sleep(0.25)

    done = False
    sampler = asyncio.get_running_loop().create_task(sample_rss())
    buckets0 = rejection_buckets(url)
    cpu0 = cpu_s(pid)
    started = time.perf_counter()
    sent = 0
    while (now := time.perf_counter() - started) < duration_s:
        due = int(now * rate) + 1
        while sent < due:
            sent += 1
            task = asyncio.get_running_loop().create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.sleep(0.001)
    elapsed = time.perf_counter() - started
    cpu_share = (cpu_s(pid) - cpu0) / elapsed
    await asyncio.gather(*tasks)
    done = True
    await sampler
    pool.close()
    accepted = [t for code, t in results if code == 200]
    rejected = [t for code, t in results if code == 503]
    settled = rss[len(rss) // 4 :]
    buckets1 = rejection_buckets(url)
    within = (buckets1[0] - buckets0[0]) / max(1.0, buckets1[1] - buckets0[1])
    return {
        "client_errors": errors,
        "server_rejected_within_5ms": within,
        "offered_per_s": sent / elapsed,
        "accepted_per_s": len(accepted) / elapsed,
        "accepted": len(accepted),
        "rejected": len(rejected),
        "expired_504": sum(1 for code, _ in results if code == 504),
        "other": sum(1 for code, _ in results if code not in (200, 503, 504)),
        "accepted_p50_ms": pct(accepted, 0.5) * 1e3,
        "accepted_p99_ms": pct(accepted, 0.99) * 1e3,
        "accepted_max_ms": max(accepted, default=float("nan")) * 1e3,
        "rejected_p50_ms": pct(rejected, 0.5) * 1e3,
        "rejected_p99_ms": pct(rejected, 0.99) * 1e3,
        "rss_mb_first": settled[0] if settled else float("nan"),
        "rss_mb_last": settled[-1] if settled else float("nan"),
        "rss_mb_spread": (max(settled) - min(settled)) if settled else float("nan"),
        "coalescer_cpu_share": cpu_share,
    }


def rejection_buckets(url: str) -> tuple[float, float]:
    """503 answers of /predict/bulk/strict the coalescer itself timed: (within 5 ms, all)."""
    within = total = 0.0
    prefix = 'coalescer_call_duration_seconds_bucket{code="503",endpoint="bulk_strict",'
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(prefix + 'le="0.005"}'):
            within = float(line.split()[-1])
        elif line.startswith(prefix + 'le="+Inf"}'):
            total = float(line.split()[-1])
    return within, total


# ---- phases ----------------------------------------------------------------------------


def run_phases(args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    replica = start_service("prediction_server", [], log_dir=log_dir, ready_path="/readyz")
    coalescer = start_service(
        "coalescer",
        ["--prediction-urls", replica.url, "--log-level", "warning"],
        log_dir=log_dir,
        ready_path="/readyz",
    )
    pin(replica, 1, args.pin)
    pin(coalescer, 0, args.pin)
    body = rows_body(args.rows)
    report: dict[str, Any] = {"latency": [], "throughput": [], "overload": []}
    try:
        for run in range(args.runs):
            pids = (replica.proc.pid, coalescer.proc.pid)
            result = uvloop.run(sequential(replica.url, coalescer.url, body, args.latency_calls, pids))
            report["latency"].append(result)
            print(f"latency run {run + 1}: {result}", flush=True)
        for run in range(args.runs):
            direct = uvloop.run(closed_loop(replica.url, body, args.concurrency, args.duration_s))
            before = {n: metric(coalescer.url, n) for n in BATCH_METRICS}
            through = uvloop.run(closed_loop(coalescer.url, body, args.concurrency, args.duration_s))
            delta = {n: metric(coalescer.url, n) - before[n] for n in BATCH_METRICS}
            through["mean_batch_callers"] = delta["coalescer_batch_callers_sum"] / max(
                1, delta["coalescer_batch_callers_count"]
            )
            through["mean_batch_rows"] = delta["coalescer_batch_rows_sum"] / max(
                1, delta["coalescer_batch_rows_count"]
            )
            report["throughput"].append({"direct": direct, "coalescer": through})
            print(f"throughput run {run + 1}: direct {direct}  coalescer {through}", flush=True)
    finally:
        coalescer.stop()
        replica.stop()

    slow = start_service("tests.fake_upstream", [], log_dir=log_dir, ready_path="/healthz")
    httpx.post(slow.url + "/_control", json={"delay_ms": args.overload_upstream_ms})
    shed = start_service(
        "coalescer",
        [
            *("--prediction-urls", slow.url, "--log-level", "warning"),
            *("--max-inflight-per-replica", "1", "--max-batch-rows", str(args.overload_batch_rows)),
        ],
        log_dir=log_dir,
        ready_path="/readyz",
    )
    pin(slow, 1, args.pin)
    pin(shed, 0, args.pin)
    try:
        for run in range(args.runs):
            capacity = uvloop.run(closed_loop(shed.url, body, 64, args.duration_s))["calls_per_s"]
            rate = args.overload_factor * capacity
            result = uvloop.run(open_loop(shed.url, body, rate, args.duration_s + 2, shed.proc.pid))
            result["capacity_per_s"] = capacity
            report["overload"].append(result)
            print(f"overload run {run + 1}: {result}", flush=True)
    finally:
        shed.stop()
        slow.stop()
    return report


BATCH_METRICS = (
    "coalescer_batch_callers_sum",
    "coalescer_batch_callers_count",
    "coalescer_batch_rows_sum",
    "coalescer_batch_rows_count",
)


# ---- report ----------------------------------------------------------------------------


def values(runs: list[dict[str, Any]], *path: str) -> list[float]:
    out = []
    for run in runs:
        value: Any = run
        for key in path:
            value = value[key]
        out.append(float(value))
    return out


def med(runs: list[dict[str, Any]], *path: str) -> float:
    return statistics.median(values(runs, *path))


def series(numbers: Sequence[float], fmt: str) -> str:
    return "[" + ", ".join(fmt.format(n) for n in numbers) + "]"


def markdown(
    report: dict[str, Any], args: argparse.Namespace, command: str, load: tuple[float, float]
) -> str:
    lat, thr, ovl = report["latency"], report["throughput"], report["overload"]
    added = [run["coalescer"]["p50_us"] - run["direct"]["p50_us"] for run in lat]
    ratios = [run["coalescer"]["calls_per_s"] / run["direct"]["calls_per_s"] for run in thr]
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    placement = (
        "real prediction replica (built-in prior, 1 worker) pinned to CPU 1, coalescer pinned to CPU 0, "
        "load generator unpinned"
        if args.pin
        else "real prediction replica (built-in prior, 1 worker), coalescer and load generator unpinned"
    )
    lines = [
        "# Coalescer benchmarks",
        "",
        f"Measured {when} on {os.cpu_count()} cores; {placement}; medians of {args.runs} runs, "
        f"direct and coalesced interleaved; calls of {args.rows} rows.",
        "",
        "Command:",
        "",
        "```",
        command,
        "```",
        "",
        "| measurement | median | target |",
        "|---|---|---|",
        f"| p50 latency, one caller: direct / through the coalescer | "
        f"{med(lat, 'direct', 'p50_us'):.0f} µs / {med(lat, 'coalescer', 'p50_us'):.0f} µs | - |",
        f"| **added p50 latency at low load** | **{statistics.median(added):.0f} µs** | ≤ 300 µs |",
        f"| p99 latency, one caller: direct / coalescer | {med(lat, 'direct', 'p99_us'):.0f} µs / "
        f"{med(lat, 'coalescer', 'p99_us'):.0f} µs | - |",
        f"| CPU per call: replica (direct) / coalescer | {med(lat, 'direct', 'cpu_per_call_us'):.0f} µs / "
        f"{med(lat, 'coalescer', 'cpu_per_call_us'):.0f} µs | - |",
        f"| throughput, {args.concurrency} callers x {args.rows} rows: direct | "
        f"{med(thr, 'direct', 'calls_per_s'):,.0f} calls/s (p50 {med(thr, 'direct', 'p50_ms'):.1f} ms) | - |",
        f"| throughput, {args.concurrency} callers x {args.rows} rows: through the coalescer | "
        f"{med(thr, 'coalescer', 'calls_per_s'):,.0f} calls/s "
        f"(p50 {med(thr, 'coalescer', 'p50_ms'):.1f} ms) | - |",
        f"| **throughput ratio coalescer / direct** | **{statistics.median(ratios):.2f}x** | ≥ 1.5x |",
        f"| mean batch under that load | {med(thr, 'coalescer', 'mean_batch_callers'):.1f} callers, "
        f"{med(thr, 'coalescer', 'mean_batch_rows'):.0f} rows per upstream call | - |",
        f"| overload: upstream capacity (measured) / offered | {med(ovl, 'capacity_per_s'):,.0f} / "
        f"{med(ovl, 'offered_per_s'):,.0f} calls/s ({args.overload_factor:g}x) | - |",
        f"| overload: accepted calls, p50 / p99 / max latency | {med(ovl, 'accepted_per_s'):,.0f} calls/s, "
        f"{med(ovl, 'accepted_p50_ms'):.0f} / {med(ovl, 'accepted_p99_ms'):.0f} / "
        f"{med(ovl, 'accepted_max_ms'):.0f} ms | within the 250 ms deadline |",
        f"| overload: admitted calls that expired (504) | {med(ovl, 'expired_504'):.0f} | few |",
        f"| **overload: rejections (503), p50 / p99 latency** | **{med(ovl, 'rejected_p50_ms'):.2f} / "
        f"{med(ovl, 'rejected_p99_ms'):.2f} ms** | < 5 ms |",
        f"| overload: rejections the coalescer answered within 5 ms (its own clock) | "
        f"{med(ovl, 'server_rejected_within_5ms') * 100:.1f}% | - |",
        f"| **overload: coalescer RSS, first / last / spread** | **{med(ovl, 'rss_mb_first'):.1f} / "
        f"{med(ovl, 'rss_mb_last'):.1f} / {med(ovl, 'rss_mb_spread'):.1f} MB** | flat |",
        "",
        f"- added p50 per run (µs): {series(added, '{:.0f}')}",
        f"- p50 per run (µs): direct {series(values(lat, 'direct', 'p50_us'), '{:.0f}')}, "
        f"coalescer {series(values(lat, 'coalescer', 'p50_us'), '{:.0f}')}",
        f"- throughput per run (calls/s): direct {series(values(thr, 'direct', 'calls_per_s'), '{:.0f}')}, "
        f"coalescer {series(values(thr, 'coalescer', 'calls_per_s'), '{:.0f}')}; mean batch callers "
        f"{series(values(thr, 'coalescer', 'mean_batch_callers'), '{:.1f}')}",
        f"- overload per run: rejected {series(values(ovl, 'rejected'), '{:.0f}')}, accepted "
        f"{series(values(ovl, 'accepted'), '{:.0f}')}, 504 {series(values(ovl, 'expired_504'), '{:.0f}')}, "
        f"other {series(values(ovl, 'other'), '{:.0f}')}; rejection p99 ms "
        f"{series(values(ovl, 'rejected_p99_ms'), '{:.2f}')}; coalescer CPU share "
        f"{series(values(ovl, 'coalescer_cpu_share'), '{:.2f}')}",
        f"- load average before / after: {load[0]:.2f} / {load[1]:.2f} (shared machine)",
        "",
        NOTES,
    ]
    return "\n".join(lines) + "\n"


NOTES = """Notes:
- Client: the same lean keep-alive HTTP/1.1 client (`coalescer.http1`) calls the replica directly
  and the coalescer, in alternating blocks of 100 calls, so "added latency" is the coalescer's
  extra hop: one more HTTP server and one more HTTP client in the path, plus validation,
  queueing and the split of the answer. "CPU per call" is the process's user+system time over
  its own blocks divided by their calls (robust to other load; capacity on one core is roughly
  1 / that figure). For scale: a do-nothing uvicorn proxy that forwards
  bytes with the same client costs about 150-160 µs of CPU per call and adds 150-250 µs on this
  box; most of the coalescer's cost is that HTTP floor.
- Throughput: 64 callers in a closed loop, 1 s warm-up then the measured window. Direct, every
  call pays the replica's fixed per-call cost (HTTP, parsing, two model calls, ~300 µs); through
  the coalescer, ~20 callers share one upstream call. The coalescer is then bound by its own
  CPU (it shares CPU 0 with the load generator when pinned).
- Overload: the real replica serves ~20,000 callers/s of 10 rows in large batches, more than a
  Python load generator can offer 5x of on two cores while the coalescer runs, so the overload
  phase uses the fault-injection replica with a fixed 20 ms service time and a coalescer allowed
  one call in flight of at most 50 rows; its capacity is measured first, then arrivals come at a
  fixed rate of 5x that for 6 s regardless of answers (open loop). Admission refuses a caller when
  the queue is over `--max-queued-rows` or when the wait it should expect (rows ahead divided by
  the recent drain rate) exceeds half its deadline, so admitted callers finish in time and the
  rest get 503 at once. RSS is sampled every 250 ms after the first quarter of the run.
- The machine is shared with other engineers' builds and benchmarks; numbers move between runs
  (see the per-run lists). Rerun with the command above; `--no-pin` lets the OS place processes."""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=10, help="rows per call")
    parser.add_argument(
        "--latency-calls", type=int, default=2000, help="sequential calls per side per latency run"
    )
    parser.add_argument(
        "--concurrency", type=int, default=64, help="closed-loop callers in the throughput phase"
    )
    parser.add_argument("--duration-s", type=float, default=4.0, help="measured seconds per load run")
    parser.add_argument("--overload-factor", type=float, default=5.0)
    parser.add_argument(
        "--overload-upstream-ms", type=float, default=20.0, help="service time of the slow replica"
    )
    parser.add_argument(
        "--overload-batch-rows", type=int, default=50, help="row cap per call when overloaded"
    )
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pin the replica to CPU 1 and the coalescer to CPU 0 (--no-pin: let the OS place them)",
    )
    parser.add_argument("--out", type=Path, help="write the Markdown report here")
    parser.add_argument("--json", type=Path, help="write the raw results here")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="coalescer-bench-") as tmp:
        report = run_phases(args, Path(tmp))
    text = markdown(
        report,
        args,
        "OMP_NUM_THREADS=1 .venv/bin/python " + " ".join(sys.argv),
        (load_before, os.getloadavg()[0]),
    )
    print(text)
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(
            orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode()
        )


if __name__ == "__main__":
    main()
