"""Settings of the coalescer: every knob, its flag (``--batch-window-us``) and env var (``COALESCER_*``).

Units are in the names. Cross-field rules (exactly one replica source, relay rate bounds) are
checked here, so a bad configuration fails at start with a message naming the setting.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from shared.config import CommaList, ServiceSettings, settings_config
from shared.schemas import MAX_BULK_ROWS, MAX_TRAINING_BODY_BYTES


class CoalescerSettings(ServiceSettings):
    """The scheduler's front door: batches prediction calls to replicas and relays training samples."""

    model_config = settings_config("COALESCER_")

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
    max_loop_lag_share: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description="Shed prediction calls at once (503) while the event loop runs later than this share "
        "of their deadline (time queued before the handler); the lag also counts against each deadline",
    )
    eject_cooldown_s: float = Field(
        default=5.0, gt=0, description="How long a failed replica gets no traffic before it is probed back"
    )
    probe_interval_s: float = Field(
        default=0.5, gt=0, description="How often ejected and not-yet-ready replicas are probed on /readyz"
    )
    relay_max_inflight_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=MAX_TRAINING_BODY_BYTES,
        description="Bytes of sample bodies being read or forwarded at once (the relay's whole memory "
        "bound; at least one 8 MiB body); beyond it senders get 429 before their body is read",
    )
    relay_min_rate: float = Field(
        default=1.0, gt=0, description="Lowest relay admission rate, sample requests per second"
    )
    relay_max_rate: float = Field(
        default=100.0, gt=0, description="Highest relay admission rate, sample requests per second"
    )
    relay_initial_rate: float | None = Field(
        default=None,
        gt=0,
        description="Relay admission rate at start, requests per second (default: the maximum); beyond "
        "the current rate senders get 429 with Retry-After",
    )
    relay_aimd_step: float = Field(
        default=1.0,
        gt=0,
        description="Additive increase of the relay rate per request the training server accepted",
    )
    relay_aimd_factor: float = Field(
        default=0.8,
        gt=0,
        lt=1,
        description="Multiplicative decrease of the relay rate after a 429, 5xx or timeout",
    )
    relay_timeout_s: float = Field(
        default=2.0, gt=0, description="Timeout of one relayed bulk call, seconds (then resent, same key)"
    )
    relay_wait_budget_s: float = Field(
        default=10.0,
        gt=0,
        description="How long a sender's request may wait for the training server, resends included, "
        "seconds; then 504 (timed out) or 503 (unreachable). Also the shutdown grace for requests in flight",
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
        description="When set (or --auth-token-file), /reload requires 'Authorization: Bearer <token>' (and "
        "/add_training_data_bulk too with --token-protects-ingest); the token is also sent to replicas and "
        "the training server",
    )
    token_protects_ingest: bool = Field(
        default=False,
        description="Also require the token on /add_training_data_bulk (needs a token-aware sender; the "
        "llm-d Go client sends none)",
    )
    max_body_bytes: int = Field(
        default=16 * 1024 * 1024, ge=1024, description="Largest accepted request body, bytes"
    )

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
