"""What a service says about itself on ``GET /`` (wire-contract sections 2 and 5).

Operators and tools look at ``/`` first; every service answers it with the same core fields
(``service``, ``version``, ``model_type``, readiness) plus its own.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

DISTRIBUTION = "latency-model-services"
MODEL_TYPE = "xgboost"  # the only value we report; the Go client accepts xgboost, lightgbm, bayesian_ridge


def package_version() -> str:
    """The installed distribution's version (``"unknown"`` when run from an uninstalled tree)."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def root_body(service: str, *, is_ready: bool, **fields: Any) -> dict[str, Any]:
    """The ``GET /`` body: the common identity fields, then ``fields``."""
    return {
        "service": service,
        "version": package_version(),
        "model_type": MODEL_TYPE,
        "is_ready": is_ready,
        **fields,
    }
