"""Settings: flags over environment over defaults, clear failures, the generated reference."""

from __future__ import annotations

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings

from shared.config import CommaList, settings_config, settings_from_cli, settings_reference, settings_to_env


class DemoSettings(BaseSettings):
    model_config = settings_config("DEMO_SERVICE_")
    port: int = Field(8000, description="TCP port")
    data_dir: str = Field("./var", description="Where data lives")
    verbose: bool = Field(False, description="Say more")
    urls: CommaList = Field(default_factory=list, description="Upstreams")


def test_flags_override_env_which_overrides_defaults(monkeypatch):
    monkeypatch.setenv("DEMO_SERVICE_PORT", "9000")
    monkeypatch.setenv("DEMO_SERVICE_DATA_DIR", "/env")
    s = settings_from_cli(DemoSettings, ["--data-dir", "/flag", "--verbose"])
    assert (s.port, s.data_dir, s.verbose) == (9000, "/flag", True)


def test_invalid_value_exits_naming_flag_and_env(capsys):
    with pytest.raises(SystemExit):
        settings_from_cli(DemoSettings, ["--port", "eighty"])
    err = capsys.readouterr().err
    assert "--port" in err and "DEMO_SERVICE_PORT" in err


def test_round_trip_through_env_and_reference(monkeypatch):
    s = DemoSettings(port=1, urls="http://a,http://b")
    assert s.urls == ["http://a", "http://b"]
    env = settings_to_env(s)
    assert env["DEMO_SERVICE_URLS"] == "http://a,http://b"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert DemoSettings() == s
    assert settings_from_cli(DemoSettings, ["--urls", "http://c"]).urls == ["http://c"]
    ref = settings_reference(DemoSettings)
    assert "`--data-dir` | `DEMO_SERVICE_DATA_DIR` | `./var` | Where data lives" in ref
