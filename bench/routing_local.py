"""Predictions for the routing benchmark from the frozen model, evaluated in this process.

``StorePredictions(store_dir)`` loads the current version from the model store the real
training server published to, with the prediction server's own code (``Predictor``: the same
compiled forests, self-test and ``shared.features``), and answers ``predict_for_routing(rows)``
like a ``LatencyClient`` that never fails. Simulated time stands still during a prediction
call, so over HTTP or in process the simulated outcome is the same; in process a decision costs
a fraction of the CPU, which is what lets several seeds at long runs fit on a shared machine.
The first warm-up round of ``bench.routing_compare`` routes over HTTP; ``bench.routing_overhead``
measures the HTTP decision latency.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from prediction_server.predictor import Predictor
from scheduler_client import Prediction
from scheduler_client.types import Row
from shared.features import build_features
from shared.model_store import ModelStore
from shared.schemas import parse_rows


class StorePredictions:
    """In-process predictions of the store's current model (see the module docstring)."""

    def __init__(self, store_dir: Path) -> None:
        self.predictor = Predictor.from_model_set(ModelStore(store_dir).load())
        self.version = self.predictor.version
        self.last_error: str | None = None

    async def predict_for_routing(self, rows: Sequence[Row]) -> list[Prediction] | None:
        return self.predict_now(rows)

    def predict_now(self, rows: Sequence[Row]) -> list[Prediction]:
        """One prediction per row, in row order (validation, features, forests: the server's path)."""
        ttft, tpot = self.predictor.predict(build_features(parse_rows(list(rows))))
        version = self.version
        return [Prediction(a, b, version) for a, b in zip(ttft.tolist(), tpot.tolist(), strict=True)]
