"""Settings of the training server (flags ``--field-name`` or env ``TRAINING_SERVER_<FIELD>``).

Validated at start-up, so a bad value fails before the server binds its port.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings

from shared.config import settings_config
from shared.schemas import MAX_BULK_ROWS


class TrainingSettings(BaseSettings):
    """Training server: ingests samples, keeps a stratified window, retrains and publishes models."""

    model_config = settings_config("TRAINING_SERVER_")

    host: str = Field(default="127.0.0.1", description="Interface to listen on (loopback by default).")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port to listen on.")
    data_dir: Path = Field(
        default=Path("./var/training"),
        description="Directory for the persisted window (and the store by default).",
    )
    store: Path | None = Field(default=None, description="Model store directory; default <data-dir>/models.")
    quantile: float = Field(
        default=0.9, gt=0.0, lt=1.0, description="Quantile the models predict (objective=quantile)."
    )
    objective: Literal["quantile", "mean"] = Field(
        default="quantile", description="'quantile' (pinball loss at --quantile) or 'mean' (squared error)."
    )
    auth_token: SecretStr | None = Field(
        default=None, description="If set, /flush and /retrain require 'Authorization: Bearer <token>'."
    )
    token_protects_ingest: bool = Field(
        default=False,
        description="Also require the token on /add_training_data_bulk (needs a token-aware sender).",
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, description="Largest accepted request body in bytes (larger: 413)."
    )
    max_entries_per_request: int = Field(
        default=MAX_BULK_ROWS,
        ge=1,
        le=100_000,
        description="Most entries accepted in one bulk request (more: 422).",
    )
    max_pending_samples: int = Field(
        default=50_000,
        ge=1,
        description="Intake bound: accepted samples not yet in the window; beyond it ingestion answers 429.",
    )
    max_concurrent_ingest_requests: int = Field(
        default=32,
        ge=1,
        description="Ingest requests being read/parsed at once; beyond it ingestion answers 429.",
    )
    stratum_cap: int = Field(default=2000, ge=1, description="Newest samples kept per window stratum.")
    max_age_s: float = Field(
        default=6 * 3600.0, gt=0, description="Samples older than this (by their timestamp) leave the window."
    )
    max_train_samples: int = Field(
        default=50_000,
        ge=100,
        description="Most samples one retrain uses; larger windows are thinned evenly across strata.",
    )
    retrain_interval_s: float = Field(
        default=10.0, gt=0, description="Retrain at least this often while new samples keep arriving."
    )
    min_new_samples: int = Field(
        default=200,
        ge=1,
        description="Retrain once this many new samples (and --min-new-fraction of the window) arrived.",
    )
    min_new_fraction: float = Field(
        default=0.02,
        ge=0,
        le=1,
        description="Retrain once new samples reach this share of the window (and --min-new-samples).",
    )
    retrain_min_gap_s: float = Field(
        default=1.0, ge=0, description="Least time between the start of two automatic retrains."
    )
    min_train_samples: int = Field(
        default=500, ge=20, description="Fewest samples with a non-zero target needed to train that model."
    )
    holdout_fraction: float = Field(
        default=0.15, gt=0, lt=0.5, description="Newest share of samples held out to evaluate candidates."
    )
    calibration_fraction: float = Field(
        default=0.15,
        gt=0,
        lt=0.5,
        description="Share of samples used to calibrate the quantile (conformal offset), spread over the "
        "window in short runs.",
    )
    publish_tolerance: float = Field(
        default=0.0,
        ge=0,
        description="Refuse a candidate only if its held-out loss is confidently > current * (1 + this).",
    )
    publish_confidence: float = Field(
        default=0.95,
        gt=0.5,
        lt=1,
        description="Confidence of the guard's paired comparison on the held-out samples (one-sided).",
    )
    work_baseline: bool = Field(
        default=True,
        description="Fit a linear work-ahead baseline (quantile regression) and train the trees around it.",
    )
    monotone_constraints: bool = Field(
        default=True,
        description="Constrain the trees: more queued/prefill work never lowers TTFT, more decode work TPOT.",
    )
    n_estimators: int = Field(default=150, ge=1, le=5000, description="Boosting rounds per model.")
    max_depth: int = Field(default=6, ge=1, le=16, description="Maximum tree depth.")
    learning_rate: float = Field(default=0.1, gt=0, le=1, description="Boosting learning rate (eta).")
    max_bin: int = Field(default=64, ge=8, le=1024, description="Histogram bins per feature.")
    recency_half_life_s: float = Field(
        default=0.0, ge=0, description="If > 0, weight training samples by 0.5 ** (age / half-life)."
    )
    training_threads: int = Field(default=1, ge=1, le=64, description="XGBoost threads used by a retrain.")
    trainer_nice: int = Field(
        default=10,
        ge=0,
        le=19,
        description="Niceness added to the trainer thread so ingestion keeps priority.",
    )
    keep_versions: int = Field(
        default=5, ge=1, description="Model versions kept in the store (for rollback)."
    )
    persist_interval_s: float = Field(
        default=30.0, gt=0, description="How often the window is saved to disk."
    )
    seed_bundle: Path | None = Field(
        default=None,
        description="Seed bundle (from GET /model/export) a fresh server publishes instead of the prior; "
        "ignored, with a log line, when the store already has trained versions.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Log level.")

    @model_validator(mode="after")
    def _check_consistency(self) -> TrainingSettings:
        if self.max_pending_samples < self.max_entries_per_request:
            raise ValueError("max_pending_samples must be >= max_entries_per_request")
        if self.holdout_fraction + self.calibration_fraction > 0.6:
            raise ValueError("holdout_fraction + calibration_fraction must be <= 0.6")
        return self

    @property
    def store_dir(self) -> Path:
        return self.store if self.store is not None else self.data_dir / "models"

    @property
    def window_path(self) -> Path:
        return self.data_dir / "window.npz"

    def token(self) -> str | None:
        return self.auth_token.get_secret_value() if self.auth_token is not None else None
