"""Soak: the whole stack under the demo workload for a long stretch, its resources sampled.

A deployment runs for days, so nothing may grow without bound. This starts the main command as a
user runs it (``python -m stack --demo`` with a long ``--demo-duration-s``) and, every
``--interval-s`` until it exits, samples each service's process tree from ``/proc`` (resident
memory, open file descriptors, threads), the training window's size (``GET /data/status``), the
data directory's disk use per subdirectory and the model versions on disk.

At the end it prints, per service, the resident memory when the first sample after start-up was
taken, half-way and at the end, and its growth over the second half in MB per hour (a least-squares
slope: a leak keeps growing there, a window filling to its caps levels off), the most file
descriptors and threads seen, and the disk use at the end. It fails (exit 1) if the stack exits
with an error, if the demo reports failed calls or lost samples, or if a service died.

    python -m bench.soak [--duration-s 3600 --speed 2 --interval-s 30 --json F]

Linux only (``/proc``). One simulated hour at the default pace takes 30 min of wall time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from stack.config import StackSettings
from stack.launcher import plan

DEMO_SUMMARY = "demo-summary.json"  # what the demo writes into its data dir when it ends


@dataclass
class ProcessTree:
    """One service's process and its descendants (a prediction replica's workers), summed."""

    rss_mb: float
    fds: int
    threads: int


@dataclass
class Sample:
    t_s: float
    services: dict[str, ProcessTree]  # "<service>:<pid>" -> its tree
    window_samples: int | None
    disk_mb: dict[str, float]  # subdirectory of the data dir -> MB
    versions: int


@dataclass
class Soak:
    samples: list[Sample] = field(default_factory=list)
    returncode: int | None = None
    demo: dict[str, Any] | None = None  # the demo's own summary (``DEMO_SUMMARY``), None if it wrote none


def children(pid: int) -> list[int]:
    """The pids of ``pid``'s children (every thread's), from ``/proc``."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):  # the task ended meanwhile
            kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def process_tree(pid: int) -> ProcessTree | None:
    """``pid`` and its descendants' memory, fds and threads, summed; None if ``pid`` is gone."""
    rss_kb = fds = threads = 0
    pending, found = [pid], False
    while pending:
        p = pending.pop()
        try:
            status = Path(f"/proc/{p}/status").read_text()
            fds += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            continue  # gone meanwhile
        found = True
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                rss_kb += int(line.split()[1])
            elif line.startswith("Threads:"):
                threads += int(line.split()[1])
        pending += children(p)
    return ProcessTree(rss_kb / 1024, fds, threads) if found else None


def stack_services(replicas: int) -> Counter[str]:
    """The service modules the stack runs with ``replicas`` replicas, and how many of each."""
    return Counter(spec.module for spec in plan(StackSettings(replicas=replicas)))


def _service(pid: int) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    modules = stack_services(1)
    for i, arg in enumerate(argv[:-1]):
        if arg == b"-m" and argv[i + 1].decode() in modules:
            return argv[i + 1].decode()
    return None


def _disk_mb(root: Path) -> dict[str, float]:
    """MB per subdirectory of ``root``, each file once however many hard links it has (a calibration
    version links the model files of the version it is based on)."""
    sizes: dict[str, float] = {}
    for sub in sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []:
        total, seen = 0, set()
        for f in sub.rglob("*"):
            with contextlib.suppress(OSError):  # replaced or pruned meanwhile
                st = f.lstat()
                if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
        sizes[sub.name] = total / 2**20
    return sizes


def _versions(root: Path) -> int:
    with contextlib.suppress(OSError):  # not yet created, or pruned meanwhile
        return sum(1 for _ in (root / "models" / "versions").iterdir())
    return 0


def _window_samples(training_url: str) -> int | None:
    try:
        return int(httpx.get(f"{training_url}/data/status", timeout=5.0).json()["window"]["samples"])
    except (httpx.HTTPError, KeyError, ValueError):
        return None


def sample(stack_pid: int, data_dir: Path, training_url: str, t_s: float) -> Sample:
    services: dict[str, ProcessTree] = {}
    for pid in children(stack_pid):
        name = _service(pid)
        tree = process_tree(pid) if name else None
        if name and tree:
            services[f"{name}:{pid}"] = tree
    return Sample(t_s, services, _window_samples(training_url), _disk_mb(data_dir), _versions(data_dir))


def slope_per_hour(ts: list[float], values: list[float]) -> float:
    """Least-squares slope of ``values`` over ``ts`` (seconds), per hour; 0 with fewer than 2 points."""
    if len(ts) < 2:
        return 0.0
    mean_t, mean_v = sum(ts) / len(ts), sum(values) / len(values)
    var = sum((t - mean_t) ** 2 for t in ts)
    if var == 0:
        return 0.0
    return 3600.0 * sum((t - mean_t) * (v - mean_v) for t, v in zip(ts, values, strict=True)) / var


def summarise(soak: Soak) -> dict[str, Any]:
    """Per service: RSS first / half-way / last, growth over the second half, most fds and threads."""
    services: dict[str, Any] = {}
    keys = sorted({k for s in soak.samples for k in s.services})
    for key in keys:
        seen = [(s.t_s, s.services[key]) for s in soak.samples if key in s.services]
        half = [(t, tree) for t, tree in seen if t >= (seen[0][0] + seen[-1][0]) / 2]
        services[key] = {
            "samples": len(seen),
            "rss_mb_first": round(seen[0][1].rss_mb, 1),
            "rss_mb_half": round(half[0][1].rss_mb, 1) if half else None,
            "rss_mb_last": round(seen[-1][1].rss_mb, 1),
            "rss_mb_per_hour_second_half": round(
                slope_per_hour([t for t, _ in half], [tree.rss_mb for _, tree in half]), 1
            ),
            "fds_max": max(tree.fds for _, tree in seen),
            "fds_last": seen[-1][1].fds,
            "threads_max": max(tree.threads for _, tree in seen),
        }
    last = soak.samples[-1] if soak.samples else None
    windows = [s.window_samples for s in soak.samples if s.window_samples is not None]
    return {
        "wall_s": round(last.t_s, 1) if last else 0.0,
        "returncode": soak.returncode,
        "services": services,
        "window_samples_last": windows[-1] if windows else None,
        "window_samples_max": max(windows) if windows else None,
        "disk_mb_last": {k: round(v, 1) for k, v in (last.disk_mb.items() if last else [])},
        "disk_mb_max": {
            k: round(max(s.disk_mb.get(k, 0.0) for s in soak.samples), 1)
            for k in (last.disk_mb if last else {})
        },
        "versions_max": max((s.versions for s in soak.samples), default=0),
        "demo": None
        if soak.demo is None
        else {
            "requests": soak.demo["requests"],
            "prediction_errors": soak.demo["prediction_errors"],
            "call_latency_ms": soak.demo["call_latency_ms"],
            "samples": soak.demo["samples"],
            "retrains": soak.demo["training_server"]["retrains"],
            "final_model_version": soak.demo["final_model_version"],
        },
    }


def verdict(summary: dict[str, Any], replicas: int) -> list[str]:
    """What failed (empty: nothing did)."""
    failures = []
    if summary["returncode"] != 0:
        failures.append(f"the stack exited with {summary['returncode']}")
    demo = summary["demo"]
    if demo is None:
        failures.append("the demo wrote no summary")
    else:
        if demo["prediction_errors"]:
            failures.append(f"{demo['prediction_errors']} failed prediction calls")
        samples = demo["samples"]
        if samples["accepted"] != samples["sent"]:
            failures.append(f"{samples['sent'] - samples['accepted']} samples not accepted")
        lost = {k: samples[k] for k in ("rejected", "dropped", "unsent") if samples.get(k)}
        if lost:
            failures.append(f"samples lost: {lost}")
    names = [k.split(":")[0] for k in summary["services"]]
    for name, n in stack_services(replicas).items():
        if names.count(name) != n:
            failures.append(
                f"{names.count(name)} {name} processes seen, {n} expected (one restarted or died)"
            )
    return failures


def run(args: argparse.Namespace, data_dir: Path, log: Path) -> Soak:
    cmd = [
        sys.executable, "-m", "stack", "--demo",
        "--demo-duration-s", str(args.duration_s), "--demo-speed", str(args.speed),
        "--replicas", str(args.replicas), "--base-port", str(args.base_port), "--data-dir", str(data_dir),
    ]  # fmt: skip
    training_url = f"http://127.0.0.1:{args.base_port}"
    soak = Soak()
    start = next_sample = time.monotonic()
    with log.open("w") as out, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT) as proc:
        while proc.poll() is None:
            now = time.monotonic()
            if now >= next_sample:
                s = sample(proc.pid, data_dir, training_url, now - start)
                if s.services:
                    soak.samples.append(s)
                    print(
                        f"t={s.t_s:6.0f}s window={s.window_samples} versions={s.versions} "
                        + " ".join(
                            f"{k.split(':')[0]}={v.rss_mb:.0f}MB/{v.fds}fd" for k, v in s.services.items()
                        )
                        + " disk "
                        + " ".join(f"{k}={v:.1f}MB" for k, v in s.disk_mb.items()),
                        flush=True,
                    )
                next_sample += args.interval_s
            time.sleep(0.5)
        soak.returncode = proc.returncode
    with contextlib.suppress(OSError, ValueError):
        soak.demo = json.loads((data_dir / DEMO_SUMMARY).read_text())
    return soak


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=3600.0, help="simulated seconds of demo traffic")
    parser.add_argument("--speed", type=float, default=2.0, help="simulated seconds per wall second")
    parser.add_argument("--interval-s", type=float, default=30.0, help="wall seconds between samples")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--base-port", type=int, default=8700)
    parser.add_argument("--data-dir", type=Path, help="default: a temporary directory, removed after")
    parser.add_argument("--json", type=Path, help="also write the summary and every sample here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        log = Path(tmp) / "stack.log"
        soak = run(args, args.data_dir or Path(tmp) / "data", log)
        summary = summarise(soak)
        failures = verdict(summary, args.replicas)
        if failures:
            print("".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:]))
    print(json.dumps(summary, indent=2))
    if args.json is not None:
        samples = [vars(s) | {"services": {k: vars(v) for k, v in s.services.items()}} for s in soak.samples]
        args.json.write_text(json.dumps({"summary": summary, "samples": samples}, indent=1))
    for failure in failures:
        print(f"FAIL: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
