"""Typed settings and the command line built from them.

Every service has one ``BaseSettings`` subclass (pydantic-settings) whose fields are the
complete list of its settings. Each field is settable three ways, highest priority first:
a command-line flag ``--field-name``, an environment variable ``<PREFIX><FIELD_NAME>``,
or its default. The same class generates the README's configuration reference, so the
documentation cannot drift from the code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args, get_origin

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from shared.slow_clients import BODY_TIMEOUT_S, HEADER_TIMEOUT_S

S = TypeVar("S", bound=BaseSettings)
SS = TypeVar("SS", bound="ServiceSettings")


def settings_config(env_prefix: str) -> SettingsConfigDict:
    """The ``model_config`` of a service's settings class: env vars are ``<env_prefix><FIELD>``."""
    return SettingsConfigDict(env_prefix=env_prefix, extra="ignore", validate_default=True)


def env_var(cls: type[BaseSettings], field_name: str) -> str:
    prefix = cls.model_config.get("env_prefix", "")
    return f"{prefix}{field_name}".upper()


def flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def settings_from_cli(
    cls: type[S],
    argv: Sequence[str] | None = None,
    prog: str | None = None,
    description: str | None = None,
    epilog: str | None = None,
) -> S:
    """Parse flags named after ``cls``'s fields on top of its environment variables and defaults.

    Invalid values exit with a message naming the flag/variable, so bad config fails at start.
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        usage="%(prog)s [options]",
        description=description or cls.__doc__,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    for name, info in cls.model_fields.items():
        default = _shown_default(info.get_default(call_default_factory=True))
        help_text = f"{info.description or ''} (default: {default}; env {env_var(cls, name)})".strip()
        choices = _literal_choices(info.annotation)
        if info.annotation is bool:
            parser.add_argument(
                flag(name),
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        elif choices:
            parser.add_argument(
                flag(name), dest=name, default=argparse.SUPPRESS, help=help_text, choices=choices
            )
        else:
            parser.add_argument(
                flag(name), dest=name, default=argparse.SUPPRESS, help=help_text, metavar=name.upper()
            )
    args = vars(parser.parse_args(argv))
    try:
        settings = cls(**args)
        return settings
    except ValidationError as exc:
        problems = "; ".join(
            f"{flag(str(err['loc'][0]))} / {env_var(cls, str(err['loc'][0]))}: {err['msg']}"
            if err["loc"]
            else str(err["msg"])  # a rule across several settings (a model validator)
            for err in exc.errors()
        )
        parser.error(f"invalid settings: {problems}")
        raise  # unreachable: parser.error exits


def service_settings_from_cli(
    cls: type[SS], argv: Sequence[str] | None = None, prog: str | None = None, epilog: str | None = None
) -> SS:
    """``settings_from_cli`` for a service about to start: a token file that cannot be read (or is
    empty) fails here, with the flag's name, before the service builds its app or binds its port."""
    settings = settings_from_cli(cls, argv, prog=prog, epilog=epilog)
    try:
        _ = settings.token
    except ValueError as exc:
        print(
            f"{prog or 'service'}: error: invalid settings: {flag('auth_token_file')} / "
            f"{env_var(cls, 'auth_token_file')}: {exc}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    return settings


def settings_to_env(settings: BaseSettings) -> dict[str, str]:
    """Environment variables that recreate ``settings`` (used to hand them to worker processes)."""
    env: dict[str, str] = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, list | tuple):
            text = ",".join(str(v) for v in value)
        elif isinstance(value, BaseModel):
            text = value.model_dump_json()
        else:
            reveal = getattr(value, "get_secret_value", None)
            text = str(reveal() if reveal is not None else value)
        env[env_var(type(settings), name)] = text
    return env


def settings_reference(cls: type[BaseSettings]) -> str:
    """A Markdown table of every setting: flag, environment variable, default, description."""
    lines = ["| flag | environment variable | default | meaning |", "|---|---|---|---|"]
    for name, info in cls.model_fields.items():
        default: Any = info.get_default(call_default_factory=True)
        if isinstance(default, list | tuple):
            default = ",".join(str(v) for v in default)
        shown = "" if default is None else f"`{default}`"
        lines.append(f"| `{flag(name)}` | `{env_var(cls, name)}` | {shown} | {info.description or ''} |")
    return "\n".join(lines)


def _shown_default(default: Any) -> str:
    if default is None:
        return "unset"
    if isinstance(default, list | tuple):
        return ",".join(str(v) for v in default) or "empty"
    if isinstance(default, str) and not default:
        return "empty"
    return str(default)


def _literal_choices(annotation: Any) -> list[str] | None:
    if get_origin(annotation) is Literal:
        return [str(v) for v in get_args(annotation)]
    return None


def split_comma_list(value: Any) -> Any:
    """Validator helper: accept ``"a,b"`` as well as a list for list-typed settings."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


CommaList = Annotated[list[str], NoDecode, BeforeValidator(split_comma_list)]
"""A list setting written ``a,b,c`` in flags and environment variables (not JSON)."""


class ServiceSettings(BaseSettings):
    """What every service's settings share: where it listens, its log level, its admin token, its
    body limit and whether it shows internals. Each service subclasses it (and may override a
    field's default, e.g. ``port``) with ``model_config = settings_config("<SERVICE>_")``.

    The admin token comes from ``--auth-token`` / ``<SERVICE>_AUTH_TOKEN`` or, better (a flag is
    visible in ``ps``), from a file: ``--auth-token-file`` / ``<SERVICE>_AUTH_TOKEN_FILE`` (a
    Kubernetes Secret or compose secret mounted as a file). Read it as ``settings.token``.
    """

    host: str = Field(default="127.0.0.1", description="Interface to listen on (loopback by default).")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port to listen on.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(default="info", description="Log level.")
    auth_token: SecretStr | None = Field(
        default=None,
        description="Token the admin endpoints require as 'Authorization: Bearer <token>' (prefer "
        "--auth-token-file: a flag is visible in ps).",
    )
    auth_token_file: Path | None = Field(
        default=None,
        description="File holding the admin token (surrounding whitespace ignored); exclusive with "
        "--auth-token.",
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, description="Largest accepted request body in bytes (larger: 413)."
    )
    header_timeout_s: float = Field(
        default=HEADER_TIMEOUT_S,
        gt=0,
        description="A request's line and headers must arrive within this many seconds, else the "
        "connection is closed (slow clients)",
    )
    body_timeout_s: float = Field(
        default=BODY_TIMEOUT_S,
        gt=0,
        description="A request's body must arrive within this many seconds of its headers, else the "
        "connection is closed (slow clients)",
    )
    expose_internals: bool = Field(
        default=False,
        description="Show process ids and file paths in /status, and the training server's /docs and "
        "/redoc (debugging).",
    )

    _token: str | None = PrivateAttr(default=None)
    _token_read: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _one_token_source(self) -> ServiceSettings:
        if self.auth_token is not None and self.auth_token_file is not None:
            raise ValueError("set only one of --auth-token and --auth-token-file")
        return self

    @property
    def token(self) -> str | None:
        """The admin token (flag, variable or file), or None when none is set.

        A token file is read on first use and kept (``serve`` reads it before binding, so an
        unreadable or empty file fails at start); rotate it with a restart.
        """
        if not self._token_read:
            self._token = self._read_token()
            self._token_read = True
        return self._token

    def _read_token(self) -> str | None:
        if self.auth_token_file is None:
            return (self.auth_token.get_secret_value() or None) if self.auth_token is not None else None
        try:
            text = self.auth_token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the token file {self.auth_token_file}: {exc}") from exc
        if not text:
            raise ValueError(f"the token file {self.auth_token_file} is empty")
        return text
