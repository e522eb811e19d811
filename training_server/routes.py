"""HTTP routes of the training server (wire-contract.md section 3, plus admin and store views).

Handlers stay thin: they read requests, call ``TrainingService`` and shape responses.
Errors are ``shared.errors`` exceptions, mapped to HTTP by ``install_error_handlers``.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from starlette.responses import Response

from shared.artifacts import MANIFEST_FILE, MODEL_NAMES, sha256_hex
from shared.errors import ArtifactError, CorruptArtifact, NotFound, StoreUnreadable
from shared.http import check_token, json_response, read_body
from shared.metrics import metrics_response
from training_server.service import TrainingService


def get_service(request: Request) -> TrainingService:
    service: TrainingService = request.app.state.service
    return service


ServiceDep = Annotated[TrainingService, Depends(get_service)]
router = APIRouter()

TREE_ENDPOINTS = {f"{name}_trees": f"/model/{name}/xgb/json" for name in MODEL_NAMES}


@router.post("/add_training_data_bulk", status_code=202)
async def add_training_data_bulk(request: Request, service: ServiceDep) -> Response:
    settings = service.settings

    def authorize() -> None:
        if settings.token_protects_ingest:
            check_token(request, settings.token)

    accepted, stale = await service.ingest(
        lambda: read_body(request, settings.max_body_bytes),
        authorize,
        request.headers.get("idempotency-key"),
    )
    message = f"Accepted {accepted} training samples."
    if stale:  # counted too: training_window_evicted_samples_total{reason="stale"}, /status
        message = (
            f"Accepted {accepted} training samples; {stale} of them are older than max-age "
            f"({settings.max_age_s:g} s) and were discarded."
        )
    return json_response({"message": message}, 202)


@router.get("/model/download/info")
async def model_download_info(service: ServiceDep) -> Response:
    manifest = service.current
    models = manifest.models if manifest else {}
    return json_response(
        {
            "model_type": "xgboost",
            "quantile": service.settings.quantile,
            "objective_type": service.settings.objective,
            "available_endpoints": {
                "trees": TREE_ENDPOINTS,
                "store": {
                    "versions": "/models",
                    "current_manifest": "/models/current",
                    "files": "/models/versions/{version}/{file}",
                },
            },
            "model_status": {f"{name}_model_ready": name in models for name in MODEL_NAMES},
            "model_version": manifest.version if manifest else None,
            "is_prior": manifest.kind == "prior" if manifest else None,
        }
    )


@router.get("/model/{name}/xgb/json")
async def model_trees(name: str, service: ServiceDep) -> Response:
    if name not in MODEL_NAMES:
        raise NotFound(f"Unknown model {name!r}; expected one of {list(MODEL_NAMES)}")
    return Response(await service.tree_dump(name), media_type="application/json")


@router.get("/healthz")
async def healthz() -> Response:
    return json_response({"status": "ok"})


@router.get("/readyz")
async def readyz(service: ServiceDep) -> Response:
    manifest = service.current
    if manifest is None:
        return json_response({"status": "not_ready"}, 503)
    return json_response(
        {"status": "ready", "model_version": manifest.version, "is_prior": manifest.kind == "prior"}
    )


@router.get("/status")
async def status(service: ServiceDep) -> Response:
    return json_response(service.status())


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return metrics_response(request.app.state.registry)


@router.post("/retrain")
async def retrain(request: Request, service: ServiceDep, wait: bool = False) -> Response:
    """Start a retrain now. ``?wait=true`` answers 200 with its outcome; otherwise 202 at once."""
    check_token(request, service.settings.token)
    outcome = await service.retrain(wait)
    if outcome is None:
        return json_response({"message": "Retrain scheduled."}, 202)
    body: dict[str, Any] = {
        "outcome": outcome.outcome,
        "detail": outcome.detail,
        "version": outcome.version,
        "duration_s": outcome.duration_s,
        "window_samples": outcome.window_samples,
        "models": outcome.models,
    }
    return json_response(body)


# ---- the model store over HTTP (prediction replicas on other machines pull with these) ----
@router.get("/models")
async def list_versions(service: ServiceDep) -> Response:
    store = service.store

    def listing() -> dict[str, Any]:
        try:
            current = store.current_version()
        except CorruptArtifact as exc:  # the versions are still listed, for readers to fall back on
            return {"current": None, "current_error": str(exc), "versions": store.versions()}
        return {"current": current, "versions": store.versions()}

    return json_response(await run_in_threadpool(listing))


def _current(service: TrainingService) -> str | None:
    try:
        return service.store.current_version()
    except CorruptArtifact as exc:  # damaged after start-up (start-up quarantines it)
        raise StoreUnreadable(f"store_unreadable: {exc}") from None


@router.get("/models/current")
async def current_manifest(request: Request, service: ServiceDep) -> Response:
    """The current manifest, with an ``ETag``: a replica polling with ``If-None-Match`` gets a
    bodiless 304 while the version is unchanged."""
    version = await run_in_threadpool(_current, service)
    if version is None:
        raise NotFound("No model version has been published")
    response = await _store_file(service, version, MANIFEST_FILE)
    etag = f'"{sha256_hex(bytes(response.body))[:32]}"'
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers={"ETag": etag})
    response.headers["ETag"] = etag
    return response


@router.get("/models/versions/{version}/manifest.json")
async def version_manifest(version: str, service: ServiceDep) -> Response:
    return await _store_file(service, version, MANIFEST_FILE)


@router.get("/models/versions/{version}/{file}")
async def version_file(version: str, file: str, service: ServiceDep) -> Response:
    return await _store_file(service, version, file)


async def _store_file(service: TrainingService, version: str, file: str) -> Response:
    try:
        data = await run_in_threadpool(service.store.read_file, version, file)
    except ArtifactError as exc:
        raise NotFound(str(exc)) from None
    media_type = "application/json" if file == MANIFEST_FILE else "application/octet-stream"
    return Response(data, media_type=media_type)
