"""Settings of the training server (flags ``--field-name`` or env ``TRAINING_SERVER_<FIELD>``).

Validated at start-up, so a bad value fails before the server binds its port.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from shared.config import ServiceSettings, settings_config
from shared.schemas import MAX_BULK_ROWS, MAX_TRAINING_BODY_BYTES


class TrainingSettings(ServiceSettings):
    """Training server: ingests samples, keeps a stratified window, retrains and publishes models."""

    model_config = settings_config("TRAINING_SERVER_")

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
    token_protects_ingest: bool = Field(
        default=False,
        description="Also require the token on /add_training_data_bulk (needs a token-aware sender).",
    )
    max_body_bytes: int = Field(
        default=MAX_TRAINING_BODY_BYTES,
        ge=1024,
        le=MAX_TRAINING_BODY_BYTES,
        description="Largest accepted request body in bytes (larger: 413); at most the coalescer's cap "
        "(8 MiB), so the coalescer never acknowledges a body this server would refuse",
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
        default=500,
        ge=20,
        description="Fewest samples with a non-zero TTFT needed to train TTFT (TPOT: its own, below).",
    )
    min_train_samples_tpot: int = Field(
        default=200,
        ge=20,
        description="Fewest samples with a non-zero TPOT needed to train TPOT; until then the prior answers. "
        "Fewer than TTFT's: a TPOT's p90 is 1.05-1.2x its median on the H200 traces (a TTFT's 2-3x, its "
        "p99 up to 70x), so fewer samples pin it down.",
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
    cross_conformal_below: int = Field(
        default=100,
        ge=0,
        description="A calibration split smaller than this is replaced by cross-conformal calibration: every "
        "fitted sample calibrates, predicted by trees fitted on the other folds (0: always a split). A small "
        "split's conformal offset is its largest residuals, so a few stalls in a first window set it.",
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
    baseline_bend: bool = Field(
        default=True,
        description="Let TPOT's baseline bend (concave, piecewise linear) where the newest held-out samples "
        "show, with the guard's confidence, that TPOT stopped growing.",
    )
    baseline_kv_scale: bool = Field(
        default=True,
        description="Let TTFT's baseline take terms whose cost per token of work ahead grows with the KV "
        "cache's use (a queue behind a full cache waits for running requests to free it), where the "
        "newest held-out samples show, with the guard's confidence, that they predict better.",
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
    calibration_half_life_s: float = Field(
        default=120.0,
        ge=0,
        description="Half-life of a calibration sample's weight in a retrain's conformal offset "
        "(weighted conformal: 0.5 ** (age / half-life)), so the offset follows the newest "
        "residuals; 0 weighs the calibration split equally.",
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
    journal_fsync: Literal["always", "everysec", "no"] = Field(
        default="always",
        description="When the ingest journal is fsynced: 'always' (every group commit, before the 202), "
        "'everysec' (at most 1 s later) or 'no' (by the OS). A kill -9 loses nothing with any of them; "
        "only a power loss does, with everysec (up to 1 s) and no.",
    )
    journal_snapshot_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1024 * 1024,
        description="Save the window (and compact the journal) early once this many journal bytes "
        "were written since the last save.",
    )
    idempotency_ttl_s: float = Field(
        default=600.0, gt=0, description="How long an accepted Idempotency-Key is remembered."
    )
    idempotency_max_keys: int = Field(
        default=100_000, ge=1, description="Most Idempotency-Keys remembered (the oldest are forgotten)."
    )
    live_scoring: bool = Field(
        default=True,
        description="Score every arriving sample against the version that served it, keep live coverage "
        "and pinball per regime, calibrate per regime online and detect drift.",
    )
    live_max_pending_samples: int = Field(
        default=20_000,
        ge=1,
        description="Samples waiting to be scored; beyond it new batches are skipped (counted), not queued.",
    )
    live_half_life_samples: int = Field(
        default=500,
        ge=10,
        description="Horizon of live coverage and pinball per regime: half-life in samples of that regime.",
    )
    calibrate_online: Literal["ttft", "ttft+tpot", "off"] = Field(
        default="ttft+tpot",
        description="Models whose calibration is corrected online between retrains (see "
        "--calibration-per-regime).",
    )
    calibration_per_regime: Literal["ttft", "ttft+tpot", "off"] = Field(
        default="ttft",
        description="Calibrated models that also correct each regime's own offset between retrains; the "
        "others keep one offset for all regimes that only ever widens the trainer's calibration (a "
        "slower pool). TPOT is not by default: its sample arrives when the whole request completed, "
        "after the queue it saw is gone.",
    )
    calibration_window: int = Field(
        default=256,
        ge=20,
        description="Newest samples per regime kept to scale the tracker's step and to carry its offset "
        "over to new trees (restarting it from their conformal offset if it still fell short on them).",
    )
    calibration_min_samples: int = Field(
        default=30,
        ge=2,
        description="Fewest recent samples a regime needs to scale its step by its own residual spread "
        "(fewer: the spread of all regimes), and a queue bin to be served its own offset when that is "
        "below the bin under it (fewer: at least that bin's).",
    )
    calibration_step_ttft: float = Field(
        default=0.05,
        gt=0,
        le=1,
        description="Online calibration step of TTFT per posted batch and sample (up to 8), as a share "
        "of the regime's residual spread (5th to 95th percentile): larger follows a change faster and "
        "jitters more.",
    )
    calibration_step_tpot: float = Field(
        default=0.02,
        gt=0,
        le=1,
        description="The same for TPOT. Smaller: a TPOT sample arrives when its whole request completed, "
        "so a regime's own tracker chases bursts that are over; TPOT's one widening offset (not per "
        "regime, the default) takes 0.02.",
    )
    calibration_publish_interval_s: float = Field(
        default=0.25,
        ge=0,
        description="Least time between two published calibration versions (a replica's default poll "
        "interval: offsets reach the replicas within about half a second of the samples that moved them).",
    )
    calibration_min_shift: float = Field(
        default=0.02,
        ge=0,
        description="Publish new regime offsets only if one moved by at least this much (log-latency units).",
    )
    drift_coverage_drop: float = Field(
        default=0.1,
        gt=0,
        lt=1,
        description="Drift: a regime's live coverage below quantile minus this, sustained over "
        "--drift-min-samples samples.",
    )
    drift_loss_rise: float = Field(
        default=1.5,
        gt=1,
        description="Drift: a regime's live pinball above this times its long-run pinball, sustained.",
    )
    drift_min_samples: int = Field(
        default=200, ge=1, description="Samples of a regime since its last drift event before another."
    )
    drift_cooldown_s: float = Field(
        default=30.0, ge=0, description="Least time between two drift events of the same model and regime."
    )
    seed_bundle: Path | None = Field(
        default=None,
        description="Seed bundle (from GET /model/export) a fresh server publishes instead of the prior; "
        "ignored, with a log line, when the store already has trained versions.",
    )

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

    @property
    def journal_dir(self) -> Path:
        return self.data_dir / "journal"

    def min_train_samples_of(self, model: str) -> int:
        """Fewest samples with a non-zero target that train ``model`` (``ttft`` or ``tpot``)."""
        return self.min_train_samples_tpot if model == "tpot" else self.min_train_samples
