"""The JIT evaluator and its fallback, as real servers: a prediction server on a machine without
numba serves the same version through the numpy/XGBoost evaluators, with the same answers as one
serving it through the JIT's fused kernel (features, trees and served transform compiled)."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from shared.model_store import ModelStore
from tests.prediction_support import publish_trained, random_rows
from tests.procs import get_json, start_service, wait_until

pytestmark = pytest.mark.e2e


def test_a_server_without_numba_gives_the_jit_servers_answers_bit_for_bit(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store")
    version = publish_trained(store, seed=4).version
    # A package named numba that fails to import, ahead of the real one: as if it were not installed.
    no_numba = tmp_path / "no-numba"
    (no_numba / "numba").mkdir(parents=True)
    (no_numba / "numba" / "__init__.py").write_text("raise ImportError('numba is not installed here')\n")
    args = ["--store", str(store.root), "--no-prior-fallback"]
    with (
        start_service("prediction_server", args, log_dir=tmp_path / "jit", ready_path="/readyz") as jit,
        start_service(
            "prediction_server",
            args,
            log_dir=tmp_path / "fallback",
            ready_path="/readyz",
            env={"PYTHONPATH": str(no_numba)},
        ) as fallback,
    ):
        for service in (jit, fallback):
            wait_until(lambda s=service: get_json(s.url + "/status")["model_version"] == version, "version")
        # A first version is served by the fallback until the JIT kernel is loaded, then by the JIT.
        wait_until(lambda: get_json(jit.url + "/status")["evaluator"] == "numba-jit", "the JIT", 120)
        wait_until(
            lambda: get_json(fallback.url + "/status")["evaluator"].startswith("CompiledForest<="), "fallback"
        )
        rows = random_rows(300, np.random.default_rng(5))  # small and large batches: both fallbacks

        def fused() -> bool:  # a call checks the fused kernel once it is compiled, then it serves
            httpx.post(jit.url + "/predict/bulk/strict", json={"requests": rows[:2]}, timeout=30)
            return bool(get_json(jit.url + "/status")["served_kernel"])

        wait_until(fused, "the JIT's fused kernel", 120)
        assert get_json(fallback.url + "/status")["served_kernel"] is False
        for batch in (rows[:1], rows[:10], rows):
            answers = [
                [
                    (p["ttft_ms"], p["tpot_ms"])
                    for p in httpx.post(s.url + "/predict/bulk/strict", json={"requests": batch}, timeout=30)
                    .raise_for_status()
                    .json()["predictions"]
                ]
                for s in (jit, fallback)
            ]
            assert answers[0] == answers[1] and len(answers[0]) == len(batch)
