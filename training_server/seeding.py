"""Seed bundles in and out of this training server's store (``shared.bundle`` owns the format).

``export_bundle`` packs the current version; ``publish_bundle`` publishes a verified bundle as a
new version (``POST /model/import`` and ``--seed-bundle``); ``seed_at_start`` applies
``--seed-bundle`` on a fresh store, so a new cluster starts from another cluster's model
instead of the prior.
"""

from __future__ import annotations

import logging
from typing import Any

import xgboost as xgb

from shared.artifacts import Manifest
from shared.bundle import MAX_BUNDLE_BYTES, Bundle, BundleError, read_bundle, write_bundle
from shared.logging import log_event
from shared.model_store import ModelStore
from training_server.config import TrainingSettings

log = logging.getLogger(__name__)


def export_bundle(store: ModelStore, sample_counts: dict[str, Any]) -> tuple[bytes, Manifest]:
    """The current version as a seed bundle (verified on the way out, as a reader would)."""
    model_set = store.load()
    return write_bundle(model_set, sample_counts), model_set.manifest


def publish_bundle(store: ModelStore, bundle: Bundle, settings: TrainingSettings) -> Manifest:
    """Publish ``bundle`` as a new version; refuse one trained for another objective or quantile."""
    manifest = bundle.manifest
    if manifest.objective != settings.objective or (
        settings.objective == "quantile" and manifest.quantile != settings.quantile
    ):
        raise BundleError(
            f"bundle predicts objective {manifest.objective!r} at quantile {manifest.quantile}; "
            f"this server is configured for {settings.objective!r} at {settings.quantile}"
        )
    for name, data in bundle.model_set.files.items():
        try:  # the checksums say the bytes are the ones exported; this says XGBoost can read them
            xgb.Booster(params={"nthread": 1}).load_model(bytearray(data))
        except xgb.core.XGBoostError as exc:
            raise BundleError(f"model {name} is not a loadable XGBoost model: {exc}") from None
    models = manifest.models
    return store.publish(
        manifest.kind,  # a bundle of a prior stays a prior (a retrain replaces it at once)
        dict(bundle.model_set.files),
        objective=manifest.objective,
        quantile=manifest.quantile,
        target_transforms={name: spec.target_transform for name, spec in models.items()},
        calibration_offsets={name: spec.calibration_offset for name, spec in models.items()},
        baselines={name: spec.baseline for name, spec in models.items()},
        training_samples=dict(manifest.training_samples),
        metrics={
            **manifest.metrics,
            "seed": {
                "source_version": manifest.version,
                "source_created_at": manifest.created_at,
                "exported_at": bundle.metadata.get("exported_at"),
            },
        },
        xgboost_version=manifest.xgboost_version,
    )


def seed_at_start(store: ModelStore, settings: TrainingSettings) -> Manifest | None:
    """Apply ``--seed-bundle``: publish it unless the store already has trained versions.

    A bundle that cannot be read or verified stops the start (the operator asked for it).
    """
    path = settings.seed_bundle
    if path is None:
        return None
    trained = [v for v in store.versions() if v.endswith("-trained")]
    if trained:
        log_event(
            log,
            "seed_bundle_ignored",
            bundle=str(path),
            reason="store has trained versions",
            versions=len(trained),
        )
        return None
    if path.stat().st_size > MAX_BUNDLE_BYTES:
        raise BundleError(f"{path} is larger than {MAX_BUNDLE_BYTES} bytes")
    bundle = read_bundle(path.read_bytes())
    manifest = publish_bundle(store, bundle, settings)
    log_event(
        log,
        "seed_bundle_published",
        bundle=str(path),
        version=manifest.version,
        source_version=bundle.manifest.version,
    )
    return manifest
