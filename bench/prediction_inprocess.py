"""The prediction server's ASGI app called in process: thread CPU time per ``POST /predict/bulk/strict``.

Run from the repository root, pinned to one core:

    OMP_NUM_THREADS=1 taskset -c 1 python bench/prediction_inprocess.py [--code DIR] [--rows 1,10,100]
        [--form linear]

No sockets or HTTP parsing (the floor server pays those too): what our code costs per call, from
the body's bytes to the response's. The app is ``prediction_server.app.create_app`` with its
lifespan run, serving a trained 200x6 version (``prediction_load.publish_benchmark_model``, in
its ``--form``) once its evaluator has settled; ``--code DIR`` takes the services from another
checkout (e.g. main, for a before/after in one sitting). Each row count: ``--repeats`` timings of
``--calls`` calls, median.
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
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
_PUBLISH = """
import sys
from bench.prediction_load import publish_benchmark_model
from shared.model_store import ModelStore
publish_benchmark_model(ModelStore(sys.argv[1]), 200, 6, sys.argv[2])
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--code", type=Path, default=REPO, help="checkout whose services are timed")
    parser.add_argument("--rows", default="1,10,100")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--form",
        choices=("served", "linear"),
        default="served",
        help="the version's form (prediction_load.publish_benchmark_model): the widest baselines and "
        "offsets the training server publishes, or the earlier linear one",
    )
    args = parser.parse_args()
    # The store is written by this checkout (its forms), in a child, whichever code serves it.
    store = tempfile.mkdtemp(prefix="inprocess-")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", _PUBLISH, store, args.form], cwd=REPO, env=env, check=True)
    sys.path.insert(0, str(args.code.resolve()))
    sys.path.insert(1, str(REPO))
    import orjson

    from bench.prediction_load import make_rows
    from prediction_server.app import create_app
    from prediction_server.config import PredictionSettings

    app = create_app(PredictionSettings(store=store, log_level="warning"))
    rows = [int(n) for n in args.rows.split(",")]
    print(
        f"code {args.code.resolve()}, {args.form} form; thread CPU µs per call, "
        f"median of {args.repeats} x {args.calls} calls"
    )
    print("| rows | µs per call |\n|---|---|")
    asyncio.run(_measure(app, rows, args, make_rows, orjson))


async def _measure(
    app: Any, row_counts: list[int], args: argparse.Namespace, make_rows: Any, orjson: Any
) -> None:
    startup: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    sent: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    await startup.put({"type": "lifespan.startup"})
    lifespan = asyncio.create_task(
        app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, startup.get, sent.put)
    )
    await sent.get()
    watcher = app.state.watcher
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the first version's JIT (and fused kernel) warm up in the background
        current = watcher.current
        if (
            current is not None
            and current.evaluator == "numba-jit"
            and getattr(getattr(current, "served", None), "reproduced", True)
        ):
            break
        if current is not None:
            await _call(app, orjson.dumps({"requests": make_rows(2, 0)}))
        await asyncio.sleep(0.05)
    for n in row_counts:
        body = orjson.dumps({"requests": make_rows(n, n)})
        calls = max(50, args.calls // max(1, n // 10))
        await _call(app, body)
        timings = []
        for _ in range(args.repeats):
            started = time.thread_time_ns()
            for _ in range(calls):
                await _call(app, body)
            timings.append((time.thread_time_ns() - started) / calls / 1000)
        print(f"| {n} | {statistics.median(timings):.0f} |", flush=True)
    await startup.put({"type": "lifespan.shutdown"})
    await lifespan


async def _call(app: Any, body: bytes) -> None:
    headers = [(b"content-length", b"%d" % len(body)), (b"content-type", b"application/json")]
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/predict/bulk/strict",
        "headers": headers,
        "query_string": b"",
    }
    message = {"type": "http.request", "body": body, "more_body": False}
    status = []

    async def receive() -> dict[str, Any]:
        return message

    async def send(event: dict[str, Any]) -> None:
        if event["type"] == "http.response.start":
            status.append(event["status"])

    await app(scope, receive, send)
    if status != [200]:
        raise RuntimeError(f"the app answered {status}")


if __name__ == "__main__":
    main()
