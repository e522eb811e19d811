"""``import_xgboost()``: XGBoost for the services, without its optional scikit-learn integration.

When scikit-learn is installed (the ``bench`` extra), ``import xgboost`` (3.x) imports it eagerly
to define the sklearn estimator classes, and scikit-learn drags most of scipy into the process:
about a second of start-up and ~100 MB per process, none of it used by the services, which call
``xgboost.train`` and ``Booster`` only. A ``None`` entry in ``sys.modules`` makes that optional
import fail the way a missing package does, and xgboost falls back to its dummy base classes. The
entry is removed right after, so a later explicit ``import sklearn`` still works.
"""

from __future__ import annotations

import sys
from functools import cache
from types import ModuleType


@cache
def import_xgboost() -> ModuleType:
    if "xgboost" in sys.modules or "sklearn" in sys.modules:
        import xgboost

        return xgboost
    sys.modules["sklearn"] = None  # type: ignore[assignment]
    try:
        import xgboost
    finally:
        if sys.modules.get("sklearn", 0) is None:
            del sys.modules["sklearn"]
    return xgboost
