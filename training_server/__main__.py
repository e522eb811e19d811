"""``python -m training_server`` / ``training-server``: run the training server with uvicorn."""

from __future__ import annotations

from collections.abc import Sequence

import uvicorn

from shared.config import settings_from_cli
from shared.logging import configure_logging
from shared.slow_clients import uvicorn_http_options
from training_server.app import create_app
from training_server.config import TrainingSettings


def main(argv: Sequence[str] | None = None) -> None:
    settings = settings_from_cli(TrainingSettings, argv, prog="training-server")
    configure_logging("training_server", settings.log_level)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        **uvicorn_http_options(),
        log_config=None,
        log_level=settings.log_level,
        access_log=False,
        timeout_graceful_shutdown=10,
    )


if __name__ == "__main__":
    main()
