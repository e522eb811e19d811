"""``python -m coalescer`` (console script ``latency-coalescer``): run the coalescer (one process)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from coalescer.app import create_app
from coalescer.config import CoalescerSettings
from shared.config import service_settings_from_cli
from shared.logging import configure_logging
from shared.serve import serve


def main(argv: Sequence[str] | None = None) -> int:
    settings = service_settings_from_cli(CoalescerSettings, argv, prog="python -m coalescer")
    configure_logging("coalescer", settings.log_level)
    serve(
        create_app(settings),
        settings,
        graceful_s=max(5, round(settings.relay_wait_budget_s) + 1),
        proxy_headers=False,  # nothing here uses the client address; skip the per-request middleware
        server_header=False,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
