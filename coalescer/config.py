"""Settings of the coalescer: every knob, its flag (``--batch-window-us``) and env var (``COALESCER_*``).

Units are in the names. Cross-field rules (exactly one replica source, relay rate bounds) are
checked here, so a bad configuration fails at start with a message naming the setting.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings

from shared.config import CommaList, settings_config
from shared.schemas import MAX_BULK_ROWS

MAX_RELAY_BATCH_SAMPLES = 1000


class CoalescerSettings(BaseSettings):
    """The scheduler's front door: batches prediction calls to replicas and relays training samples."""

    model_config = settings_config("COALESCER_")

    host: str = Field(default="127.0.0.1", description="Interface to listen on (loopback by default)")
    port: int = Field(default=8080, ge=1, le=65535, description="TCP port to listen on")
    prediction_urls: CommaList = Field(
        default_factory=list,
        description="Static prediction replicas, comma-separated base URLs (http://host:port)",
    )
    prediction_dns: str | None = Field(
        default=None,
        description="Discover replicas from a DNS name, NAME:PORT; every A/AAAA address becomes a replica "
        "(a Kubernetes headless service or a compose service name)",
    )
    dns_refresh_s: float = Field(
        default=5.0, gt=0, description="How often the DNS name is re-resolved, seconds"
    )
    training_url: str | None = Field(
        default=None,
        description="Training server base URL that samples are relayed to (unset: relay disabled)",
    )
    batch_window_us: int = Field(
        default=1000,
        ge=0,
        le=1_000_000,
        description="While every replica is busy, how long a batch collects callers, microseconds from "
        "its first arrival; an idle replica takes a batch at once",
    )
    max_batch_rows: int = Field(
        default=2000,
        ge=1,
        le=MAX_BULK_ROWS,
        description="Row cap of one upstream call (the upstream limit is 10000)",
    )
    eager_inflight_per_replica: int = Field(
        default=1,
        ge=1,
        description="A batch leaves without waiting for its window while some replica has fewer calls in "
        "flight than this (set it to the replicas' worker processes)",
    )
    max_inflight_per_replica: int = Field(
        default=4, ge=1, description="Hard cap on concurrent upstream calls per replica (the bulkhead)"
    )
    max_queued_rows: int = Field(
        default=20_000,
        ge=1,
        description="Rows allowed to wait for an upstream slot; beyond it callers get an immediate 503",
    )
    max_queue_wait_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Refuse a caller at once (503) when the queue wait it should expect (rows ahead / "
        "recent drain rate) exceeds this share of its deadline: it would most likely expire waiting",
    )
    deadline_ms: float = Field(
        default=250.0,
        gt=0,
        description="Default total deadline of a prediction call (queue wait, upstream call and one "
        "retry); a caller may ask for a shorter one with the X-Deadline-Ms header",
    )
    eject_cooldown_s: float = Field(
        default=5.0, gt=0, description="How long a failed replica gets no traffic before it is probed back"
    )
    probe_interval_s: float = Field(
        default=0.5, gt=0, description="How often ejected and not-yet-ready replicas are probed on /readyz"
    )
    relay_buffer_samples: int = Field(
        default=200_000,
        ge=1,
        description="Training samples held for the training server; beyond it senders get 429",
    )
    relay_batch_samples: int = Field(
        default=MAX_RELAY_BATCH_SAMPLES,
        ge=1,
        le=MAX_RELAY_BATCH_SAMPLES,
        description="Samples per relayed bulk call (at most 1000)",
    )
    relay_min_rate: float = Field(default=1.0, gt=0, description="Lowest relay send rate, batches per second")
    relay_max_rate: float = Field(
        default=100.0, gt=0, description="Highest relay send rate, batches per second"
    )
    relay_initial_rate: float | None = Field(
        default=None, gt=0, description="Relay send rate at start, batches per second (default: the maximum)"
    )
    relay_aimd_step: float = Field(
        default=1.0,
        gt=0,
        description="Additive increase of the relay rate per accepted batch, batches per second",
    )
    relay_aimd_factor: float = Field(
        default=0.8,
        gt=0,
        lt=1,
        description="Multiplicative decrease of the relay rate after a 429, 5xx or timeout",
    )
    relay_timeout_s: float = Field(default=5.0, gt=0, description="Timeout of one relayed bulk call, seconds")
    relay_drain_s: float = Field(
        default=5.0, ge=0, description="On shutdown, how long buffered samples may still be relayed, seconds"
    )
    training_cache_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description="How long the training server's read-only answers (/model/download/info, tree dumps, "
        "/models/list, /model/{name}/info) are cached, seconds",
    )
    training_cache_max_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1024,
        description="Bound on the bytes of cached training-server answers (larger answers are not cached)",
    )
    training_timeout_s: float = Field(
        default=5.0, gt=0, description="Timeout of one read from the training server, seconds"
    )
    auth_token: SecretStr | None = Field(
        default=None,
        description="When set, /reload requires 'Authorization: Bearer <token>' (and /add_training_data_bulk "
        "too with --token-protects-ingest); the token is also sent to replicas and the training server",
    )
    token_protects_ingest: bool = Field(
        default=False,
        description="Also require the token on /add_training_data_bulk (needs a token-aware sender; the "
        "llm-d Go client sends none)",
    )
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, description="Largest accepted request body, bytes"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Log level")

    @field_validator("prediction_urls")
    @classmethod
    def _check_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            check_base_url(url)
        return [url.rstrip("/") for url in urls]

    @field_validator("training_url")
    @classmethod
    def _check_training_url(cls, url: str | None) -> str | None:
        if url:
            check_base_url(url)
            return url.rstrip("/")
        return None

    @field_validator("prediction_dns")
    @classmethod
    def _check_dns(cls, value: str | None) -> str | None:
        if value:
            split_host_port(value)
        return value or None

    @model_validator(mode="after")
    def _check_consistency(self) -> CoalescerSettings:
        if bool(self.prediction_urls) == bool(self.prediction_dns):
            raise ValueError("set exactly one of --prediction-urls and --prediction-dns")
        if self.relay_min_rate > self.relay_max_rate:
            raise ValueError("relay_min_rate must not exceed relay_max_rate")
        if self.max_inflight_per_replica < self.eager_inflight_per_replica:
            raise ValueError("max_inflight_per_replica must be at least eager_inflight_per_replica")
        return self

    @property
    def batch_window_s(self) -> float:
        return self.batch_window_us / 1e6

    @property
    def token(self) -> str | None:
        return self.auth_token.get_secret_value() if self.auth_token else None


def check_base_url(url: str) -> None:
    """Accept ``http(s)://host:port`` base URLs only (a path would be silently ignored otherwise)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{url!r} is not an http(s)://host[:port] URL")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"{url!r}: give a base URL without a path")


def split_host_port(value: str) -> tuple[str, int]:
    """``"name:8000"`` -> ``("name", 8000)``; ``"[::1]:8000"`` is accepted too."""
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not NAME:PORT")
    return host, int(port)
