"""``python -m coalescer``: run the coalescer (one process; uvicorn with uvloop and httptools)."""

from __future__ import annotations

import uvicorn

from coalescer.app import create_app
from coalescer.config import CoalescerSettings
from shared.config import settings_from_cli
from shared.logging import configure_logging
from shared.slow_clients import uvicorn_http_options


def main() -> None:
    settings = settings_from_cli(CoalescerSettings, prog="coalescer")
    configure_logging("coalescer", settings.log_level)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        **uvicorn_http_options(settings.header_timeout_s, settings.body_timeout_s),
        log_config=None,
        access_log=False,
        proxy_headers=False,  # nothing here uses the client address; skip the per-request middleware
        server_header=False,
        timeout_graceful_shutdown=max(5, round(settings.relay_wait_budget_s) + 1),
    )


if __name__ == "__main__":
    main()
