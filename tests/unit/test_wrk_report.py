"""``bench/wrk_load.parse_wrk`` reads wrk 4.1's ``--latency`` report: calls, time, quantiles, errors."""

from __future__ import annotations

import math

import pytest

from bench.wrk_load import parse_wrk

# A real report (wrk 4.1.0, Debian), against bench/floor_server.py on loopback.
CLEAN = """Running 1s test @ http://127.0.0.1:18555/predict/bulk/strict
  1 threads and 2 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    99.54us  169.80us   4.27ms   98.36%
    Req/Sec    22.20k     1.59k   25.28k    54.55%
  Latency Distribution
     50%   83.00us
     75%  101.00us
     90%  122.00us
     99%  505.00us
  24246 requests in 1.10s, 12.88MB read
Requests/sec:  22040.36
Transfer/sec:     11.71MB
"""


def test_a_clean_report() -> None:
    result = parse_wrk(CLEAN)
    assert result["calls"] == 24246 and result["errors"] == 0
    assert result["seconds"] == pytest.approx(1.10)
    assert result["p50_ms"] == pytest.approx(0.083) and result["p99_ms"] == pytest.approx(0.505)


def test_errors_and_units_are_counted() -> None:
    report = (
        CLEAN.replace("99%  505.00us", "99%    2.14s")
        .replace("50%   83.00us", "50%   12.50ms")
        .replace(
            "Requests/sec",
            "  Socket errors: connect 0, read 3, write 1, timeout 2\n"
            "  Non-2xx or 3xx responses: 17\nRequests/sec",
        )
    )
    result = parse_wrk(report)
    assert result["errors"] == 17 + 3 + 1 + 2
    assert result["p50_ms"] == pytest.approx(12.5) and result["p99_ms"] == pytest.approx(2140.0)


def test_a_report_without_quantiles_gives_nan_and_garbage_is_refused() -> None:
    no_latency = "\n".join(line for line in CLEAN.splitlines() if "%" not in line or "Stdev" in line)
    assert math.isnan(parse_wrk(no_latency)["p99_ms"])
    with pytest.raises(RuntimeError, match="unreadable"):
        parse_wrk("wrk: connection refused")
