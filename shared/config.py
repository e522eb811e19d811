"""Typed settings and the command line built from them.

Every service has one ``BaseSettings`` subclass (pydantic-settings) whose fields are the
complete list of its settings. Each field is settable three ways, highest priority first:
a command-line flag ``--field-name``, an environment variable ``<PREFIX><FIELD_NAME>``,
or its default. The same class generates the README's configuration reference, so the
documentation cannot drift from the code.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ValidationError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

S = TypeVar("S", bound=BaseSettings)


def settings_config(env_prefix: str) -> SettingsConfigDict:
    """The ``model_config`` of a service's settings class: env vars are ``<env_prefix><FIELD>``."""
    return SettingsConfigDict(env_prefix=env_prefix, extra="ignore", validate_default=True)


def env_var(cls: type[BaseSettings], field_name: str) -> str:
    prefix = cls.model_config.get("env_prefix", "")
    return f"{prefix}{field_name}".upper()


def flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def settings_from_cli(
    cls: type[S], argv: Sequence[str] | None = None, prog: str | None = None, description: str | None = None
) -> S:
    """Parse flags named after ``cls``'s fields on top of its environment variables and defaults.

    Invalid values exit with a message naming the flag/variable, so bad config fails at start.
    """
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description or cls.__doc__,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for name, info in cls.model_fields.items():
        help_text = f"{info.description or ''} [env {env_var(cls, name)}]".strip()
        if info.annotation is bool:
            parser.add_argument(
                flag(name),
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            parser.add_argument(
                flag(name), dest=name, default=argparse.SUPPRESS, help=help_text, metavar=name.upper()
            )
    args = vars(parser.parse_args(argv))
    try:
        return cls(**args)
    except ValidationError as exc:
        problems = "; ".join(
            f"{flag(str(err['loc'][0]))} / {env_var(cls, str(err['loc'][0]))}: {err['msg']}"
            if err["loc"]
            else str(err["msg"])  # a rule across several settings (a model validator)
            for err in exc.errors()
        )
        parser.error(f"invalid settings: {problems}")
        raise  # unreachable: parser.error exits


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


def split_comma_list(value: Any) -> Any:
    """Validator helper: accept ``"a,b"`` as well as a list for list-typed settings."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


CommaList = Annotated[list[str], NoDecode, BeforeValidator(split_comma_list)]
"""A list setting written ``a,b,c`` in flags and environment variables (not JSON)."""
