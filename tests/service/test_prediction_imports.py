"""The serving process stays lean: creating the app and answering predictions never imports pandas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.procs import REPO_ROOT

_SERVE_ONE_PREDICTION = """
import asyncio, sys
import httpx
from prediction_server.app import create_app
from prediction_server.config import PredictionSettings

async def main():
    app = create_app(PredictionSettings(store=sys.argv[1]))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://p")
    async with app.router.lifespan_context(app), client as c:
        row = {"kv_cache_percentage": 0.5, "input_token_length": 100, "num_request_waiting": 1,
               "num_request_running": 1, "num_tokens_generated": 1, "prefix_cache_score": 0.0}
        r = await c.post("/predict/bulk/strict", json={"requests": [row] * 3})
        assert r.status_code == 200, r.text
        assert (await c.post("/predict/bulk", json={"requests": [row, {}]})).status_code == 422
    heavy = sorted(m for m in ("pandas", "sklearn", "pyarrow") if m in sys.modules)
    print("xgboost" in sys.modules, ",".join(heavy) or "-")

asyncio.run(main())
"""


def test_creating_the_app_and_predicting_does_not_import_pandas(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", _SERVE_ONE_PREDICTION, str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "-"]
