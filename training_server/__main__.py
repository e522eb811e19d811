"""``python -m training_server`` (console script ``latency-training-server``): run the training server.

``python -m training_server import-trace FILE...`` loads recorded samples instead (see
``training_server.import_trace``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from shared.config import service_settings_from_cli
from shared.logging import configure_logging
from shared.serve import serve
from training_server.config import TrainingSettings

PROG = "python -m training_server"
EPILOG = (
    "Load recorded samples (JSON lines, CSV or Parquet, optionally .gz/.xz) into the window:\n"
    f"  {PROG} import-trace FILE... [--data-dir DIR] [--url URL]   (see '{PROG} import-trace --help')"
)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["import-trace"]:
        from training_server.import_trace import main as import_main

        return import_main(args[1:])
    settings = service_settings_from_cli(TrainingSettings, args, prog=PROG, epilog=EPILOG)
    configure_logging("training_server", settings.log_level)
    from training_server.app import create_app

    serve(create_app(settings), settings, graceful_s=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
