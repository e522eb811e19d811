"""``python -m prediction_server`` (console script ``latency-prediction-server``): run the prediction
server (one or several worker processes).

Each process is single-threaded for compute: the thread-count variables are pinned before
anything imports xgboost or numpy's BLAS, and scaling is by ``--workers`` and replicas.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import logging  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

from prediction_server.config import PredictionSettings  # noqa: E402
from shared.config import service_settings_from_cli, settings_to_env  # noqa: E402
from shared.logging import configure_logging, log_event  # noqa: E402
from shared.serve import serve  # noqa: E402

_MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def main(argv: list[str] | None = None) -> int:
    settings = service_settings_from_cli(PredictionSettings, argv, prog="python -m prediction_server")
    configure_logging("prediction_server", settings.log_level)
    log = logging.getLogger("prediction_server")
    log_event(
        log,
        "starting",
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        store=settings.store,
    )
    if settings.workers == 1:
        from prediction_server.app import create_app

        serve(create_app(settings), settings)
        return 0
    # Workers are fresh interpreters: hand them the settings (and a metrics directory shared by
    # all of them) through the environment, which they read in create_app_from_env.
    metrics_dir = None
    if not os.environ.get(_MULTIPROC_ENV):
        metrics_dir = tempfile.mkdtemp(prefix="prediction-metrics-")
        os.environ[_MULTIPROC_ENV] = metrics_dir
    os.environ.update(settings_to_env(settings))
    try:
        serve("prediction_server.app:create_app_from_env", settings, factory=True, workers=settings.workers)
    finally:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
