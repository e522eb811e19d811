"""Coalescer settings: defaults, flags over env, comma lists, and configurations refused at start."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from coalescer.config import CoalescerSettings
from shared.config import settings_from_cli, settings_reference


def test_defaults_are_the_documented_ones() -> None:
    s = CoalescerSettings(prediction_urls=["http://127.0.0.1:8001"])
    assert (s.host, s.port) == ("127.0.0.1", 8080)
    assert s.batch_window_us == 1000 and s.batch_window_s == 0.001
    assert s.max_batch_rows == 2000
    assert s.deadline_ms == 250.0
    assert s.relay_aimd_factor == 0.8
    assert s.relay_max_inflight_bytes == 64 * 1024 * 1024 and s.relay_wait_budget_s == 10.0
    assert s.token is None


def test_every_setting_is_described() -> None:
    assert all(info.description for info in CoalescerSettings.model_fields.values())
    assert "COALESCER_PREDICTION_URLS" in settings_reference(CoalescerSettings)


def test_comma_lists_from_env_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COALESCER_PREDICTION_URLS", "http://a:1, http://b:2/")
    monkeypatch.setenv("COALESCER_BATCH_WINDOW_US", "250")
    s = settings_from_cli(CoalescerSettings, ["--max-batch-rows", "500"])
    assert s.prediction_urls == ["http://a:1", "http://b:2"]
    assert (s.batch_window_us, s.max_batch_rows) == (250, 500)
    s = settings_from_cli(CoalescerSettings, ["--prediction-urls", "http://c:3", "--auth-token", "t"])
    assert s.prediction_urls == ["http://c:3"]
    assert s.token == "t"


@pytest.mark.parametrize(
    "kwargs",
    [
        {},  # no replica source
        {"prediction_urls": ["http://a:1"], "prediction_dns": "svc:8001"},  # two sources
        {"prediction_urls": ["ftp://a:1"]},
        {"prediction_urls": ["http://a:1/predict"]},
        {"prediction_dns": "svc"},
        {"prediction_urls": ["http://a:1"], "max_batch_rows": 10_001},
        {"prediction_urls": ["http://a:1"], "relay_max_inflight_bytes": 1024},  # below one body
        {"prediction_urls": ["http://a:1"], "relay_min_rate": 5, "relay_max_rate": 1},
        {"prediction_urls": ["http://a:1"], "relay_aimd_factor": 1.2},
        {"prediction_urls": ["http://a:1"], "eager_inflight_per_replica": 3, "max_inflight_per_replica": 2},
        {"prediction_urls": ["http://a:1"], "training_url": "not a url"},
    ],
)
def test_bad_configurations_fail_at_start(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        CoalescerSettings(**kwargs)  # type: ignore[arg-type]


def test_bad_flags_exit_naming_the_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        settings_from_cli(CoalescerSettings, ["--prediction-urls", "http://a:1", "--max-batch-rows", "20000"])
    assert "--max-batch-rows" in capsys.readouterr().err


def test_a_rule_across_settings_exits_with_its_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        settings_from_cli(CoalescerSettings, ["--port", "9000"])  # neither replica source
    assert "set exactly one of --prediction-urls and --prediction-dns" in capsys.readouterr().err
