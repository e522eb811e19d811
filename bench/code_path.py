"""Import the services from another checkout and ``bench`` from this one (the in-process tools' ``--code``).

``bench`` has no ``__init__.py``: it is a namespace package, so with both checkouts on ``sys.path``
its modules would come from whichever checkout has them first, and an older checkout's bench
(without the helpers a newer tool imports) would shadow this one's. So only the service packages
of ``code`` go first, through a directory of links to them; everything else, ``bench`` included,
comes from this checkout.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SERVICES = ("shared", "training_server", "prediction_server", "coalescer", "stack", "scheduler_client")


def use_services_of(code: Path) -> None:
    """Before anything of the services is imported: take them from ``code``, the rest from here."""
    code = code.resolve()
    first = [str(REPO)]
    if code != REPO:
        links = Path(tempfile.mkdtemp(prefix="services-of-"))
        for name in SERVICES:
            if (code / name).is_dir():
                (links / name).symlink_to(code / name, target_is_directory=True)
        first.insert(0, str(links))
    sys.path[:0] = first


def add_arguments(parser: argparse.ArgumentParser, setting_example: str) -> None:
    """The in-process replays' shared flags: ``--code``, ``--quantile`` and ``--setting``."""
    parser.add_argument(
        "--code", type=Path, default=REPO, help="checkout whose training/prediction code runs"
    )
    parser.add_argument("--quantile", type=float, default=0.9)
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"a TrainingSettings field, e.g. {setting_example} (repeatable)",
    )


def use_services(args: argparse.Namespace) -> dict[str, Any]:
    """``use_services_of(args.code)``, then ``args.setting`` as ``TrainingSettings`` overrides."""
    use_services_of(args.code)
    from bench.inprocess_training import parse_settings

    return parse_settings(args.setting)
