"""Settings of the prediction server (flags ``--field-name`` or env ``PREDICTION_SERVER_<FIELD>``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from shared.config import ServiceSettings, settings_config

ENV_PREFIX = "PREDICTION_SERVER_"


class PredictionSettings(ServiceSettings):
    """Prediction server: answers TTFT/TPOT predictions from the newest published model version."""

    model_config = settings_config(ENV_PREFIX)

    port: int = Field(default=8001, ge=0, le=65535, description="TCP port to listen on.")
    store: str = Field(
        default="",
        description=(
            "Where models come from: a model-store directory (shared volume) or the http(s) URL of the "
            "training server, whose store is pulled and verified. Empty: serve the built-in prior only."
        ),
    )
    workers: int = Field(default=1, ge=1, le=64, description="Worker processes (each single-threaded).")
    quantile: float = Field(
        default=0.9,
        gt=0.0,
        lt=1.0,
        description="Quantile of the built-in prior, used until the store holds a model version.",
    )
    prior_fallback: bool = Field(
        default=True,
        description=(
            "Serve the built-in prior while the store has no usable version. "
            "Off: answer 503 'Models not ready' until one is published."
        ),
    )
    poll_interval_s: float = Field(
        default=0.25,
        gt=0.0,
        le=60.0,
        description="How often each worker checks the store for a new current version (seconds).",
    )
    store_timeout_s: float = Field(
        default=5.0, gt=0.0, description="Timeout of each HTTP request to a remote store (seconds)."
    )
    cache_dir: Path | None = Field(
        default=None,
        description=(
            "Directory where versions pulled from an HTTP store are kept after verification: a worker "
            "finding a version there skips the download, and a restart while the training server is "
            "down serves the last model. Unset: keep pulled models in memory only."
        ),
    )
    training_server_url: str = Field(
        default="",
        description="Training server URL reported in /status (defaults to --store when that is a URL).",
    )

    @field_validator("store", "training_server_url")
    @classmethod
    def _strip(cls, value: str) -> str:
        return value.strip().rstrip("/") if value.startswith(("http://", "https://")) else value.strip()

    @property
    def store_is_url(self) -> bool:
        return self.store.startswith(("http://", "https://"))

    @property
    def reported_training_server_url(self) -> str:
        if self.training_server_url:
            return self.training_server_url
        return self.store if self.store_is_url else ""
