"""The llm-d series on the training server's /metrics, in process: present for the prior, and the app
survives its lifespan running twice (a second service binds the same registry)."""

from __future__ import annotations

import warnings
from pathlib import Path

with warnings.catch_warnings():
    warnings.simplefilter("ignore", UserWarning)
    from fastapi.testclient import TestClient

from tests.service.test_training_api import make_settings
from training_server.app import create_app


def importance(text: str, model: str) -> dict[str, float]:
    return {
        line.split('"')[1]: float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(f"{model}_importance{{")
    }


def test_llmd_series_for_the_prior_and_across_two_lifespans(tmp_path: Path) -> None:
    app = create_app(make_settings(tmp_path))
    for _ in range(2):
        with TestClient(app) as client:
            text = client.get("/metrics").text
            assert 'model_type{model="ttft",type="xgboost"} 1.0' in text
            assert 'training_samples_count{model="tpot"} 0.0' in text  # the prior saw no samples
            assert "ensemble_active 0.0" in text and "ensemble_mode 0.0" in text
            shares = importance(text, "ttft")
            assert abs(sum(shares.values()) - 1.0) < 1e-6 and shares["input_token_length"] > 0
            assert "training_samples_accepted_total" in text
