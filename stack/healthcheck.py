"""Container health check without curl: ``python -m stack.healthcheck http://127.0.0.1:8000/readyz``.

Exits 0 when the URL answers 200 within ``--timeout-s``, 1 otherwise. Standard library only,
so it starts fast inside a slim image.
"""

from __future__ import annotations

import argparse
import sys
import urllib.error
import urllib.request


def check(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stack.healthcheck", description=__doc__)
    parser.add_argument("url", help="URL that must answer 200, e.g. http://127.0.0.1:8000/readyz")
    parser.add_argument("--timeout-s", type=float, default=2.0)
    args = parser.parse_args(argv)
    return 0 if check(args.url, args.timeout_s) else 1


if __name__ == "__main__":
    sys.exit(main())
