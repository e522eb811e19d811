"""Accuracy metrics of replayed predictions: overall, per stratum, per bin, per decile, per version.

Everything is computed from plain arrays (predicted and actual milliseconds, the routing-time
feature columns, the answering model version) with the training server's own code: strata come
from ``training_server.window.stratum_ids`` / ``stratum_label`` and coverage, pinball loss and MAPE
from ``training_server.evaluation``, so the report measures exactly what the trainer optimises.
Pairs whose actual value is not positive carry no measurement (0 means "no TPOT") and are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from training_server.evaluation import evaluate, pinball_loss
from training_server.window import stratum_ids, stratum_label

if TYPE_CHECKING:  # annotations only: --code may run a checkout from before shared.wire_fields
    from shared.wire_fields import Columns

DIMENSIONS: tuple[str, ...] = ("waiting", "kv", "prefix")
_DIMENSION_COLUMNS = {
    "waiting": "num_request_waiting",
    "kv": "kv_cache_percentage",
    "prefix": "prefix_cache_score",
}
MIN_REPORTED = 50  # strata and bins with fewer samples are listed but not ranked


@dataclass(frozen=True)
class Scored:
    """One model's predictions and outcomes for the requests kept after the warm-up."""

    predicted: np.ndarray
    actual: np.ndarray
    strata: np.ndarray  # full window strata (training_server.window.stratum_ids)
    bins: dict[str, np.ndarray]  # per dimension, a label per request ("waiting=2-3", ...)
    versions: np.ndarray  # answering model version per request (str)

    def __len__(self) -> int:
        return len(self.actual)


def dimension_bins(columns: Columns) -> dict[str, np.ndarray]:
    """The queue-depth, KV and prefix bin of each row, named as the training server names them.

    The other dimensions are zeroed before calling ``stratum_ids``, so each label is the window's
    own bin for that dimension (its edges are never restated here).
    """
    n = len(columns["num_request_waiting"])
    zeros = np.zeros(n)
    out: dict[str, np.ndarray] = {}
    for dim, column in _DIMENSION_COLUMNS.items():
        isolated = {name: zeros for name in _DIMENSION_COLUMNS.values()}
        isolated[column] = columns[column]
        isolated["pod_type"] = zeros
        ids = stratum_ids(isolated)
        labels = {int(i): _part(stratum_label(int(i)), dim) for i in np.unique(ids)}
        out[dim] = np.array([labels[int(i)] for i in ids], dtype=object)
    return out


def _part(label: str, dim: str) -> str:
    return next(token for token in label.split() if token.startswith(f"{dim}="))


def summarise(scored: Scored, quantile: float) -> dict[str, Any]:
    """Overall metrics, the best-constant baseline, and metrics per stratum, bin, decile and version."""
    keep = scored.actual > 0
    predicted, actual = scored.predicted[keep], scored.actual[keep]
    if not len(actual):
        return {"overall": {"samples": 0}}
    evaluated = evaluate(actual, predicted, scored.strata[keep], "quantile", quantile)
    overall = evaluated["overall"]
    overall.pop("loss", None)
    constant = np.quantile(actual, quantile)
    overall["constant_pinball_loss_ms"] = float(
        pinball_loss(actual, np.full_like(actual, constant), quantile).mean()
    )
    overall["pinball_vs_constant"] = overall["pinball_loss_ms"] / overall["constant_pinball_loss_ms"]
    return {
        "overall": overall,
        "per_stratum": evaluated["per_stratum"],
        "per_bin": {
            dim: _grouped(predicted, actual, labels[keep], quantile) for dim, labels in scored.bins.items()
        },
        "per_decile": deciles(predicted, actual, quantile),
        "per_version": _grouped(predicted, actual, scored.versions[keep], quantile),
    }


def _grouped(
    predicted: np.ndarray, actual: np.ndarray, labels: np.ndarray, quantile: float
) -> dict[str, dict[str, float | int]]:
    out: dict[str, dict[str, float | int]] = {}
    for label in sorted(set(labels.tolist()), key=_natural):
        mask = labels == label
        out[str(label)] = _metrics(predicted[mask], actual[mask], quantile)
    return out


def _natural(label: str) -> tuple[float, str]:
    """Sort ``waiting=2-3`` after ``waiting=1-1`` and before ``waiting=16-31`` (numeric lower edge)."""
    value = label.split("=", 1)[-1].split("-", 1)[0].rstrip("+")
    try:
        return float(value), label
    except ValueError:
        return float("inf"), label


def _metrics(predicted: np.ndarray, actual: np.ndarray, quantile: float) -> dict[str, float | int]:
    return {
        "samples": len(actual),
        "coverage": float(np.mean(actual <= predicted)),
        "pinball_loss_ms": float(pinball_loss(actual, predicted, quantile).mean()),
        "mape": float(np.mean(np.abs(predicted - actual) / actual)),
    }


def deciles(
    predicted: np.ndarray, actual: np.ndarray, quantile: float, bins: int = 10
) -> list[dict[str, float]]:
    """Reliability: requests grouped by decile of the predicted value.

    Per group: the mean prediction, the observed ``quantile`` of the actual values (a calibrated
    model puts it on the diagonal) and the coverage (a calibrated model keeps it at ``quantile``).
    """
    order = np.argsort(predicted, kind="stable")
    out = []
    for part in np.array_split(order, bins):
        if not len(part):
            continue
        p, a = predicted[part], actual[part]
        out.append(
            {
                "samples": len(part),
                "predicted_mean_ms": float(p.mean()),
                "observed_quantile_ms": float(np.quantile(a, quantile)),
                "coverage": float(np.mean(a <= p)),
            }
        )
    return out


def worst(
    groups: dict[str, dict[str, Any]], quantile: float, count: int = 5
) -> list[tuple[str, dict[str, Any]]]:
    """The ``count`` groups with ``MIN_REPORTED`` samples or more whose coverage is furthest from target."""
    ranked = [(k, v) for k, v in groups.items() if v["samples"] >= MIN_REPORTED]
    ranked.sort(key=lambda kv: -abs(kv[1]["coverage"] - quantile))
    return ranked[:count]
