"""The operator API of the llm-d training server (wire-contract.md section 5), in native formats.

``GET /``, ``/models/list``, ``/model/{name}/info``, ``/model/{name}/download`` (the native
XGBoost file, ``ETag`` = its SHA-256), ``/model/export`` and ``POST /model/import`` (seed
bundles, see ``shared.bundle``), ``/data/status`` and ``POST /flush`` with the llm-d shapes.

We keep no test set apart from the window: each retrain holds out the newest share of the window.
So "training data" is the window, "test data" in ``/data/status`` is the held-out share of the
last retrain, and a flush of training data drops the window (where both come from).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, StrictBool
from starlette.responses import Response

from shared.artifacts import LISTED_MODEL_NAMES, MODEL_NAMES, Manifest
from shared.bundle import BUNDLE_MEDIA_TYPE, BundleError, read_bundle
from shared.errors import ArtifactError, InvalidInput, NotFound, Overloaded
from shared.http import check_token, json_response, read_body
from shared.identity import MODEL_TYPE, root_body
from training_server.routes import ServiceDep
from training_server.seeding import export_bundle, publish_bundle
from training_server.service import TrainingService

TARGETS = {"ttft": "actual_ttft_ms", "tpot": "actual_tpot_ms"}

router = APIRouter()


def require_token(request: Request, service: ServiceDep) -> None:
    """Checked before the body is validated, so an unauthorised caller learns nothing from a 422."""
    check_token(request, service.settings.token)


Authorized = Annotated[None, Depends(require_token)]


class FlushRequest(BaseModel):
    """``POST /flush`` body (llm-d shape); every flag defaults to true, booleans only."""

    model_config = ConfigDict(extra="ignore")

    flush_training_data: StrictBool = True
    flush_test_data: StrictBool = True
    flush_metrics: StrictBool = True
    reason: str | None = None


@router.get("/")
async def root(service: ServiceDep) -> Response:
    m = service.current
    return json_response(
        root_body(
            "training_server",
            is_ready=m is not None,
            objective_type=service.settings.objective,
            quantile=service.settings.quantile,
            model_version=m.version if m else None,
            is_prior=m.kind == "prior" if m else None,
            models=list(MODEL_NAMES),
            operator_endpoints=[
                "/models/list",
                "/model/{name}/info",
                "/model/{name}/download",
                "/model/export",
                "/model/import",
                "/data/status",
                "/flush",
            ],
        )
    )


@router.get("/models/list")
async def models_list(service: ServiceDep) -> Response:
    m = service.current
    return json_response(
        {
            "models": {name: _model_entry(m, name) for name in LISTED_MODEL_NAMES},
            "model_type": MODEL_TYPE,
            "quantile": service.settings.quantile,
            "objective_type": service.settings.objective,
            "server_time": datetime.now(UTC).isoformat(),
            "model_version": m.version if m else None,
        }
    )


@router.get("/model/export")
async def model_export(service: ServiceDep) -> Response:
    counts = await run_in_threadpool(window_counts, service)
    try:
        data, manifest = await run_in_threadpool(
            export_bundle, service.store, {"window": counts, "training": manifest_counts(service.current)}
        )
    except ArtifactError as exc:
        raise NotFound(f"no exportable model version: {exc}") from None
    filename = f"latency-model-{manifest.version}.tar.gz"
    return Response(
        data,
        media_type=BUNDLE_MEDIA_TYPE,
        headers={
            "Content-Disposition": f'attachment; filename="{filename}"',
            "X-Model-Version": manifest.version,
        },
    )


@router.post("/model/import")
async def model_import(request: Request, service: ServiceDep, _: Authorized) -> Response:
    """Verify a seed bundle (the body, as ``/model/export`` served it) and publish it as a new version."""
    data = await read_body(request, service.settings.max_body_bytes)
    if service.scheduler.status()["running"]:  # its publish would race ours and replace the import
        raise Overloaded("A retrain is in progress; retry the import shortly", retry_after_s=5.0)
    try:
        bundle = await run_in_threadpool(read_bundle, data)
        manifest = await run_in_threadpool(publish_bundle, service.store, bundle, service.settings)
    except BundleError as exc:
        raise InvalidInput(
            [{"type": "bundle_invalid", "loc": ["body"], "msg": f"Invalid seed bundle: {exc}", "input": None}]
        ) from None
    service.adopt(manifest)
    return json_response(
        {
            "success": True,
            "version": manifest.version,
            "source_version": bundle.manifest.version,
            "models": {name: spec.sha256 for name, spec in manifest.models.items()},
            "message": f"Published seed bundle of {bundle.manifest.version} as {manifest.version}.",
        }
    )


@router.get("/model/{name}/info")
async def model_info(name: str, service: ServiceDep) -> Response:
    _check_name(name)
    m = service.current
    entry = _model_entry(m, name)
    spec = m.models.get(name) if m else None
    return json_response(
        {
            "model_name": name,
            **entry,
            "model_type": MODEL_TYPE,
            "quantile": service.settings.quantile,
            "objective_type": service.settings.objective,
            "model_version": m.version if m else None,
            "sha256": spec.sha256 if spec else None,
            "format": "xgboost-ubjson" if spec else None,
            "training_samples": m.training_samples.get(name, 0) if m else 0,
            "download_url": f"/model/{name}/download" if spec else None,
        }
    )


@router.get("/model/{name}/download")
async def model_download(name: str, request: Request, service: ServiceDep) -> Response:
    _check_name(name)
    m = service.current
    spec = m.models.get(name) if m else None
    if m is None or spec is None:
        raise NotFound(f"model {name!r} does not exist")
    etag = f'"{spec.sha256}"'
    headers = {"ETag": etag, "X-Model-Version": m.version, "X-Model-SHA256": spec.sha256}
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    try:
        data = await run_in_threadpool(service.store.read_file, m.version, spec.file)
    except ArtifactError as exc:
        raise NotFound(str(exc)) from None
    headers["Content-Disposition"] = f'attachment; filename="{spec.file}"'
    return Response(data, media_type="application/octet-stream", headers=headers)


@router.get("/data/status")
async def data_status(service: ServiceDep) -> Response:
    counts = await run_in_threadpool(window_counts, service)
    held_out = holdout_counts(service.current)
    return json_response(
        {
            "training_data": counts,
            "test_data": held_out,
            "ensemble": {"ensemble_mode": False, "ensemble_active": False},
            "window": {"samples": service.window.size, "pending_samples": service.intake.pending_samples},
            "model_version": service.current.version if service.current else None,
            "test_data_source": "held-out share of the window at the last retrain",
            "server_time": datetime.now(UTC).isoformat(),
        }
    )


@router.post("/flush")
async def flush(service: ServiceDep, _: Authorized, body: FlushRequest | None = None) -> Response:
    """Drop the window (``flush_training_data``) and clear the model-quality gauges (``flush_metrics``).

    We keep no test set apart from the window (see the module docstring): the test counts are 0.
    """
    body = body or FlushRequest()
    counts = {"ttft_samples": 0, "tpot_samples": 0}
    total = 0
    if body.flush_training_data:
        counts = await run_in_threadpool(window_counts, service)
        total = await service.flush()
    if body.flush_metrics:
        service.metrics.clear_model_metrics()
    return json_response(
        {
            "success": True,
            "flushed_at": datetime.now(UTC).isoformat(),
            "reason": body.reason,
            "ttft_training_samples_flushed": counts["ttft_samples"],
            "tpot_training_samples_flushed": counts["tpot_samples"],
            "ttft_test_samples_flushed": 0,
            "tpot_test_samples_flushed": 0,
            "metrics_cleared": body.flush_metrics,
            "flushed_samples": total,
            "message": f"Flushed {total} training samples.",
        }
    )


def window_counts(service: TrainingService) -> dict[str, int]:
    """Samples in the window carrying each target (a sample may carry both), and in all."""
    snapshot = service.window.snapshot()
    counts = {f"{name}_samples": int((snapshot.column(column) > 0).sum()) for name, column in TARGETS.items()}
    return {**counts, "total_samples": len(snapshot)}


def holdout_counts(manifest: Manifest | None) -> dict[str, int]:
    """The held-out samples of the retrain that produced ``manifest`` (0 for a prior or a seed)."""
    counts: dict[str, int] = {}
    for name in MODEL_NAMES:
        entry = manifest.metrics.get(name) if manifest else None
        samples = entry.get("samples") if isinstance(entry, dict) else None
        held = samples.get("holdout", 0) if isinstance(samples, dict) else 0
        counts[f"{name}_samples"] = int(held) if isinstance(held, int) else 0
    return {**counts, "total_samples": sum(counts.values())}


def manifest_counts(manifest: Manifest | None) -> dict[str, int]:
    return {name: int(manifest.training_samples.get(name, 0)) if manifest else 0 for name in MODEL_NAMES}


def _model_entry(manifest: Manifest | None, name: str) -> dict[str, Any]:
    spec = manifest.models.get(name) if manifest else None
    return {
        "exists": spec is not None,
        "size_bytes": spec.size_bytes if spec else 0,
        "last_modified": manifest.created_at if manifest and spec else None,
    }


def _check_name(name: str) -> None:
    if name not in LISTED_MODEL_NAMES:
        raise NotFound(f"Unknown model {name!r}; expected one of {list(LISTED_MODEL_NAMES)}")
