"""A naive prediction server, shaped like the reference llm-d latency predictor, as a baseline.

FastAPI with a pydantic model per row, a pandas DataFrame per call for the features, and
``XGBRegressor.predict`` for the trees; responses are pydantic models too. It serves the same
model version from the same store with the same feature definitions as ``prediction_server``
(``bench/prediction_load.py`` checks that both answer identically), so a benchmark compares
implementations, not models. Not for production use.

    python bench/naive_prediction_server.py --store DIR --port 8101
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import uvicorn
import xgboost as xgb
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from shared.artifacts import ModelStore, served_latency_ms
from shared.features import FEATURE_NAMES


class PredictionRequest(BaseModel):
    kv_cache_percentage: float = Field(..., ge=0.0, le=1.0)
    input_token_length: int = Field(..., ge=0)
    num_request_waiting: int = Field(..., ge=0)
    num_request_running: int = Field(..., ge=0)
    num_tokens_generated: int = Field(..., ge=0)
    prefix_cache_score: float = Field(..., ge=0.0, le=1.0)
    pod_type: Literal["", "prefill", "decode"] | None = ""
    prefill_tokens_in_flight: int = Field(0, ge=0)
    decode_tokens_in_flight: int = Field(0, ge=0)
    encoder_matched_size: int = Field(0, ge=0)
    encoder_input_size: int = Field(0, ge=0)


class PredictionResponse(BaseModel):
    ttft_ms: float
    tpot_ms: float
    predicted_at: datetime
    model_type: str
    objective_type: str
    quantile: float
    last_model_load: datetime | None
    model_version: str


class BulkPredictionRequest(BaseModel):
    requests: list[PredictionRequest] = Field(..., min_length=1, max_length=10_000)


class BulkPredictionResponse(BaseModel):
    predictions: list[PredictionResponse]
    total_requests: int
    successful_predictions: int
    failed_predictions: int
    processing_time_ms: float


class NaivePredictor:
    def __init__(self, store: Path) -> None:
        model_set = ModelStore(store).load()
        self.manifest = model_set.manifest
        self.models: dict[str, xgb.XGBRegressor] = {}
        for name, raw in model_set.files.items():
            model = xgb.XGBRegressor(n_jobs=1)
            model.load_model(bytearray(raw))
            self.models[name] = model
        self.loaded_at = datetime.now(UTC)

    def features(self, requests: list[PredictionRequest]) -> pd.DataFrame:
        df = pd.DataFrame([r.model_dump() for r in requests])
        df["pod_type"] = df["pod_type"].fillna("").map({"": 0, "prefill": 1, "decode": 2}).astype(float)
        df["uncached_input_tokens"] = df["input_token_length"] * (1.0 - df["prefix_cache_score"])
        df["queue_depth"] = df["num_request_waiting"] + df["num_request_running"]
        df["prefill_work_tokens"] = df["prefill_tokens_in_flight"] + df["uncached_input_tokens"]
        df["uncached_encoder_input"] = (df["encoder_input_size"] - df["encoder_matched_size"]).clip(lower=0)
        return df[list(FEATURE_NAMES)].astype(np.float32)

    def predict(self, requests: list[PredictionRequest]) -> list[PredictionResponse]:
        df = self.features(requests)
        out = {
            name: served_latency_ms(np.asarray(model.predict(df)), df.to_numpy(), self.manifest.models[name])
            for name, model in self.models.items()
        }
        now = datetime.now(UTC)
        return [
            PredictionResponse(
                ttft_ms=float(out["ttft"][i]),
                tpot_ms=float(out["tpot"][i]),
                predicted_at=now,
                model_type="xgboost",
                objective_type=self.manifest.objective,
                quantile=self.manifest.quantile,
                last_model_load=self.loaded_at,
                model_version=self.manifest.version,
            )
            for i in range(len(df))
        ]


def create_app(store: Path) -> FastAPI:
    app = FastAPI()
    predictor = NaivePredictor(store)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/predict", response_model=PredictionResponse)
    async def predict(request: PredictionRequest) -> PredictionResponse:
        try:
            return predictor.predict([request])[0]
        except Exception as exc:
            raise HTTPException(status_code=500, detail=str(exc)) from exc

    @app.post("/predict/bulk/strict", response_model=BulkPredictionResponse)
    async def predict_bulk_strict(request: BulkPredictionRequest) -> BulkPredictionResponse:
        started = time.perf_counter()
        predictions = predictor.predict(request.requests)
        return BulkPredictionResponse(
            predictions=predictions,
            total_requests=len(predictions),
            successful_predictions=len(predictions),
            failed_predictions=0,
            processing_time_ms=(time.perf_counter() - started) * 1000,
        )

    return app


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--store", required=True, type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8101)
    args = parser.parse_args()
    uvicorn.run(create_app(args.store), host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
