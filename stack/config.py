"""Settings of the one-command local stack (``python -m stack``) and its demo workload.

Port layout on ``host``: the training server on ``base_port``, the coalescer (the URL a
scheduler uses for predictions) on ``base_port + 1``, prediction replicas on
``base_port + 2`` onwards. The services' own settings pass through the environment
(``TRAINING_SERVER_*``, ``PREDICTION_SERVER_*``, ``COALESCER_*``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings

from shared.config import settings_config

DEMO_DATA_DIR = Path("var/demo")


class StackSettings(BaseSettings):
    """Run the training server, prediction replicas and the coalescer locally (optionally a demo)."""

    model_config = settings_config("STACK_")

    host: str = Field(
        default="127.0.0.1", description="Interface every service listens on (loopback by default)"
    )
    base_port: int = Field(
        default=8000,
        ge=1,
        le=65000,
        description="Training server port; the coalescer uses base+1, prediction replicas base+2 onwards",
    )
    data_dir: Path = Field(
        default=Path("var"),
        description="Training data, model store (<dir>/models) and logs; with --demo the default is "
        "var/demo, so a demo never leaves simulated samples or models in the real stack's directory",
    )
    replicas: int = Field(default=2, ge=1, le=64, description="Number of prediction server replicas")
    workers: int = Field(default=1, ge=1, le=64, description="Worker processes per prediction replica")
    ready_timeout_s: float = Field(
        default=90.0, gt=0, description="How long to wait for every service to be ready"
    )
    stop_timeout_s: float = Field(
        default=10.0, gt=0, description="Grace period after SIGTERM before a service is killed"
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="Log level of the launcher and the services"
    )
    log_max_mb: float = Field(
        default=50.0,
        gt=0,
        description="A service's log file past this size is copied to <name>.log.1 (replacing the last "
        "copy) and emptied, so each service keeps at most about twice this on disk",
    )
    demo: bool = Field(default=False, description="Run the simulated demo workload, then stop the stack")
    demo_duration_s: float = Field(default=120.0, gt=0, description="Simulated seconds of demo traffic")
    demo_pods: int = Field(
        default=8, ge=1, le=1000, description="Simulated model-server pods (rows per prediction call)"
    )
    demo_rate_rps: float = Field(default=60.0, gt=0, description="Mean simulated arrival rate (bursty)")
    demo_speed: float = Field(
        default=2.0,
        ge=0,
        description="Simulated seconds per wall second: 2 shows the default 120 simulated seconds in about "
        "a minute (0: as fast as predictions allow, as --fast)",
    )
    fast: bool = Field(
        default=False,
        description="With --demo: run the simulation as fast as predictions allow (about 10 s) instead of "
        "at --demo-speed",
    )
    demo_seed: int = Field(default=0, description="Seed of the simulated workload and pods")
    demo_epsilon: float = Field(
        default=0.05, ge=0, le=1, description="Share of requests routed to a random pod (exploration)"
    )
    demo_window: int = Field(
        default=500, ge=10, description="Completions in the rolling coverage/MAPE window"
    )

    @model_validator(mode="after")
    def _demo_defaults(self) -> StackSettings:
        if self.demo and "data_dir" not in self.model_fields_set:
            self.data_dir = DEMO_DATA_DIR
        if self.fast:
            self.demo_speed = 0.0
        return self

    @property
    def training_port(self) -> int:
        return self.base_port

    @property
    def coalescer_port(self) -> int:
        return self.base_port + 1

    @property
    def prediction_ports(self) -> list[int]:
        return [self.base_port + 2 + i for i in range(self.replicas)]
