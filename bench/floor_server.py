"""The HTTP floor of the prediction benchmark: the prediction server's stack with no model.

Run from the repository root:

    python bench/floor_server.py --port 8102

Uvicorn with uvloop and httptools, orjson, one process, a bare ASGI callable (no framework, no
validation, no features, no trees): ``POST /predict/bulk/strict`` reads the whole body, parses it
with ``orjson.loads``, and answers a canned body of the same shape and size as the prediction
server's for that many rows (built once per row count). ``GET /healthz`` answers ``{"status":
"ok"}``. ``bench/prediction_load.py`` measures it in the same run as the prediction server: what
no Python server on this stack can beat, so our calls/s and CPU per call are reported as a
fraction of it.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from functools import cache
from typing import Any

import orjson
import uvicorn

_HEALTHY = orjson.dumps({"status": "ok"})


@cache
def canned_response(rows: int) -> bytes:
    """A ``/predict/bulk/strict`` body of ``rows`` predictions, shaped like the prediction server's."""
    now = datetime.now(UTC).isoformat()
    prediction = {
        "ttft_ms": 123.45678901234,
        "tpot_ms": 12.345678901234,
        "predicted_at": now,
        "model_type": "xgboost",
        "objective_type": "quantile",
        "quantile": 0.9,
        "last_model_load": now,
        "model_version": "000001-trained",
        "model_kind": "trained",
    }
    return orjson.dumps(
        {
            "predictions": [prediction] * rows,
            "total_requests": rows,
            "successful_predictions": rows,
            "failed_predictions": 0,
            "processing_time_ms": 0.123456789,
            "model_version": "000001-trained",
        }
    )


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if scope["path"] == "/predict/bulk/strict":
        payload = canned_response(len(orjson.loads(body)["requests"]))
    else:
        payload = _HEALTHY
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
