"""The routing benchmark's tuning rule (best attainment under the TTFT-tail criterion, the
shipped setting kept unless another beats it by more than ``KEEP_PTS``) and its verdict."""

from __future__ import annotations

from bench.routing_compare import KEEP_PTS, _best
from bench.routing_docs import verdict
from bench.routing_report import TARGETS
from bench.routing_sim import RunResult


def _run(policy: str, met: int, p99: float, scenario: str = "chat / high") -> tuple[int, RunResult]:
    ms = {"p50": p99 / 4, "p90": p99 / 2, "p99": p99}
    return 7, RunResult(scenario, policy, 1000, 1000, 0, met, ms, ms, 1.0, 1.0)


def test_the_best_attainment_wins_among_settings_whose_tail_is_no_longer_than_composites() -> None:
    results = [_run("composite", 800, 1000.0), _run("a", 850, 900.0), _run("b", 900, 1500.0)]
    assert _best(results, ["a", "b"]) == 0  # b has more attainment but a longer TTFT tail


def test_the_shipped_setting_stays_unless_another_beats_it_by_more_than_the_margin() -> None:
    close = 1000 * KEEP_PTS / 100  # requests: exactly KEEP_PTS points of 1000
    results = [_run("composite", 800, 1000.0), _run("a", 850, 900.0), _run("b", 850 + int(close), 900.0)]
    assert _best(results, ["a", "b"]) == 1
    assert _best(results, ["a", "b"], shipped=0) == 0  # within the margin: kept
    results[-1] = _run("b", 850 + int(close) + 1, 900.0)
    assert _best(results, ["a", "b"], shipped=0) == 1  # beyond it: changed
    # A shipped setting that breaks the tail criterion is not kept.
    results = [_run("composite", 800, 1000.0), _run("a", 850, 1100.0), _run("b", 851, 900.0)]
    assert _best(results, ["a", "b"], shipped=0) == 1


def test_the_verdict_says_when_the_admission_target_is_beyond_100_percent() -> None:
    """+5 points over a heuristic at 95.5 % would need 100.5 %: the verdict says so, and only there."""

    def run(scenario: str, policy: str, met: int) -> RunResult:
        ms = {"p50": 100.0, "p90": 200.0, "p99": 300.0}
        return RunResult(scenario, policy, 1000, 1000, 0, met, ms, ms, 1.0, 1.0)

    results = []
    for scenario, base in (("prefix-heavy / high", 955), ("chat / high", 834)):
        results += [run(scenario, "composite", base), run(scenario, TARGETS[0], base + 10)]
        results.append(run(scenario, TARGETS[1], base + 20))
    text = verdict(results, {"composite"}, {})
    assert "At prefix-heavy / high that target is out of reach by construction" in text
    assert "95.5% + 5 points is more than 100%" in text
    assert "At chat / high that target" not in text
