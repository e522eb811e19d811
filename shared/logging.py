"""Structured logging: one JSON object per line, one line per event.

No per-request logging on hot paths: counters and histograms in ``/metrics`` do that job.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import Any

import orjson


class _JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            entry.update(fields)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure_logging(service: str, level: str = "info", path: Path | None = None) -> None:
    """Send every logger's records to stderr (or append them to ``path``) as JSON lines tagged
    with ``service``."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    handler: logging.Handler = (
        logging.StreamHandler(sys.stderr) if path is None else logging.FileHandler(path, encoding="utf-8")
    )
    handler.setFormatter(_JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def log_event(logger: logging.Logger, event: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one structured event: ``log_event(log, "model_published", version=v, duration_s=1.2)``."""
    logger.log(level, event, extra={"fields": fields})


def log_task_failure(task: asyncio.Task[Any]) -> None:
    """Done-callback for background tasks: a crash must be visible, not silent."""
    if not task.cancelled() and task.exception() is not None:
        log_event(
            logging.getLogger(__name__),
            "background_task_failed",
            logging.ERROR,
            task=task.get_name(),
            error=repr(task.exception()),
        )
