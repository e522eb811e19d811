"""Closed-loop capacity with wrk (a C load generator), for ``bench/prediction_load.py --generator wrk``.

The Python open-loop generator of ``prediction_load`` costs ~150-180 µs of CPU per call, so on a
2-core machine (server on core 0, generator on core 1) it saturates near 5,500-6,700 calls/s,
below what the floor server answers: the floor's "capacity" was then the generator's. wrk
(``apt-get install wrk``; epoll, one thread pinned to core 1) costs a fraction of that per call.

Method: for each (server, rows per call), wrk keeps ``C`` connections busy (each sends its next
call when the answer to the last arrives) for ``--step-s`` seconds, for ``C`` = 1, 2, 4, ... up to
``--max-connections``, stopping after the first step whose p99 is above ``--p99-ms``. The capacity
is the highest calls/s of a step with p99 within the bound, every answer a 200 and no socket
error. Closed loop: latencies are those of the calls as sent (no coordinated-omission
correction), which is right for a saturation throughput, and the latency bound keeps it honest.
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import time
from pathlib import Path
from typing import Any

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 60e3}
_LATENCY = re.compile(r"^\s*(50|99)%\s+([\d.]+)(us|ms|s|m)\s*$", re.MULTILINE)
_REQUESTS = re.compile(r"^\s*(\d+) requests in ([\d.]+)(us|ms|s|m)", re.MULTILINE)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)")
_SOCKET = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")

_SCRIPT = """
local f = assert(io.open("{body}", "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
"""


def write_script(workdir: Path, rows: int, body: bytes) -> Path:
    """A wrk Lua script POSTing ``body``; returns its path."""
    body_file = workdir / f"body-{rows}.json"
    body_file.write_bytes(body)
    script = workdir / f"post-{rows}.lua"
    script.write_text(_SCRIPT.format(body=body_file))
    return script


def run_wrk(url: str, script: Path, connections: int, seconds: float, timeout_s: float) -> dict[str, Any]:
    """One wrk run on core 1: calls, seconds, p50/p99 ms, errors, wrk's CPU seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    command = [
        "taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s",
        f"--timeout={max(1, round(timeout_s))}s", "--latency", "-s", str(script), url,
    ]  # fmt: skip
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = parse_wrk(output)
    result["generator_cpu_s"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return result


def parse_wrk(output: str) -> dict[str, Any]:
    """wrk's ``--latency`` report: calls, seconds, p50/p99 ms, errors (non-2xx answers and socket
    errors of every kind)."""
    calls = _REQUESTS.search(output)
    if calls is None:
        raise RuntimeError(f"unreadable wrk output:\n{output}")
    latency = {q: float(v) * _UNITS[u] for q, v, u in _LATENCY.findall(output)}
    non_2xx = _NON_2XX.search(output)
    socket = _SOCKET.search(output)
    errors = (int(non_2xx.group(1)) if non_2xx else 0) + (sum(map(int, socket.groups())) if socket else 0)
    return {
        "calls": int(calls.group(1)),
        "seconds": float(calls.group(2)) * _UNITS[calls.group(3)] / 1e3,
        "p50_ms": latency.get("50", float("nan")),
        "p99_ms": latency.get("99", float("nan")),
        "errors": errors,
    }


def wrk_capacity(
    server: Any, rows: int, script: Path, args: argparse.Namespace, run: int, step_type: Any
) -> tuple[Any, list[Any]]:
    """``prediction_load.capacity`` with wrk: the best passing step (or None) and every step."""
    steps: list[Any] = []
    best = None
    connections = 1
    while connections <= args.max_connections:
        cpu0, wait0, wall0 = server.cpu_s(), server.runqueue_wait_s(), time.perf_counter()
        url = server.url + "/predict/bulk/strict"
        result = run_wrk(url, script, connections, args.step_s, args.timeout_s)
        wall = time.perf_counter() - wall0
        cpu, wait = server.cpu_s() - cpu0, server.runqueue_wait_s() - wait0
        calls = result["calls"]
        passed = bool(calls and result["p99_ms"] <= args.p99_ms and result["errors"] == 0)
        step = step_type(
            server=server.name,
            rows=rows,
            run=run,
            offered_rps=float("nan"),
            sent=calls,
            ok=calls - result["errors"],
            errors=result["errors"],
            achieved_rps=calls / result["seconds"],
            p50_ms=result["p50_ms"],
            p99_ms=result["p99_ms"],
            server_cpu_us_per_call=cpu / calls * 1e6 if calls else float("nan"),
            server_wait_share=wait / wall,
            generator_cpu_share=result["generator_cpu_s"] / result["seconds"],
            passed=passed,
            connections=connections,
        )
        steps.append(step)
        print(f"  run {run} {connections:3d} conn: {_describe(step)}", flush=True)
        if passed and (best is None or step.achieved_rps > best.achieved_rps):
            best = step
        if not passed:
            break
        connections *= 2
    return best, steps


def _describe(step: Any) -> str:
    return (
        f"{step.server:14s} {step.rows:3d} rows: {step.achieved_rps:8.0f} calls/s p50 {step.p50_ms:6.2f} "
        f"p99 {step.p99_ms:6.2f} ms errors {step.errors} | server cpu {step.server_cpu_us_per_call:5.0f} "
        f"us/call, waited {step.server_wait_share:4.0%} | wrk cpu {step.generator_cpu_share:4.0%} | "
        + ("pass" if step.passed else "FAIL")
    )
