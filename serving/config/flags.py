"""Click flags generated from pydantic settings: one flag per field, its type, range, env
variable and default read from the field, so a default is stated once (in the settings).

Light on purpose (click and pydantic only): the registry's CLI and the tiers' share it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import annotated_types
import click
from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

SCALARS: dict[type, Any] = {bool: click.BOOL, int: int, float: float, str: str,
                            Path: click.Path(path_type=Path)}
F = TypeVar("F", bound=Callable[..., Any])


def env_name(name: str, field: FieldInfo, prefix: str) -> str:
    """The environment variable a field is read from (its last alias, else prefix + NAME)."""
    alias = getattr(field.validation_alias, "choices", None)
    return str(alias[-1]) if alias else f"{prefix}{name.upper()}"


def is_secret(field: FieldInfo) -> bool:
    return SecretStr in getattr(field.annotation, "__args__", (field.annotation,))


def _range(kind: Any, field: FieldInfo) -> Any:
    """IntRange/FloatRange from the field's ge/gt/le/lt, so click refuses what the settings
    would (with the same bounds shown in --help)."""
    if kind not in (int, float):
        return kind
    low: Any = None
    high: Any = None
    low_open = high_open = False
    for meta in field.metadata:
        if isinstance(meta, annotated_types.Ge):
            low = meta.ge
        elif isinstance(meta, annotated_types.Gt):
            low, low_open = meta.gt, True
        elif isinstance(meta, annotated_types.Le):
            high = meta.le
        elif isinstance(meta, annotated_types.Lt):
            high, high_open = meta.lt, True
    if low is None and high is None:
        return kind
    if kind is int:  # an open int bound is the next closed one
        return click.IntRange(None if low is None else int(low) + int(low_open),
                              None if high is None else int(high) - int(high_open))
    return click.FloatRange(low, high, min_open=low_open, max_open=high_open)


def option(name: str, field: FieldInfo, prefix: str, flag: str | None = None,
           **kwargs: Any) -> Callable[[F], F]:
    """The click option of settings field ``name``: ``--flag`` (default: the field's name with
    dashes), default None (unset: the settings decide), help = the field's docstring plus its
    env variable and default. ``kwargs`` override what is derived (e.g. ``type``)."""
    annotation = field.annotation
    kind = next((v for k, v in SCALARS.items() if k in getattr(annotation, "__args__", ())
                 or annotation is k), str)
    choices = getattr(annotation, "__args__", None)
    if getattr(annotation, "__origin__", None) is not None and choices and all(
            isinstance(c, str) for c in choices):
        kind = click.Choice(choices)
    kind = _range(kind, field)
    default = "computed" if field.default_factory else field.default
    settings: dict[str, Any] = {
        "type": kind, "default": None,
        "help": f"{(field.description or '').strip()} [env: {env_name(name, field, prefix)}; "
                f"default: {default}]"}
    decorator = click.option(f"--{(flag or name).replace('_', '-')}", name,
                             **(settings | kwargs))
    return decorator


def options(settings_cls: type[BaseSettings], fields: Iterable[str] | None = None, *,
            flags: Mapping[str, str] | None = None,
            overrides: Mapping[str, Mapping[str, Any]] | None = None) -> Callable[[F], F]:
    """A decorator adding the options of ``fields`` (default: every field) of
    ``settings_cls``, in that order in --help; SecretStr fields never become flags (secrets
    come from the environment or a *_file setting, never argv). ``flags`` renames a flag
    (field -> flag name); ``overrides`` adds click arguments per field."""
    prefix = str(settings_cls.model_config.get("env_prefix", ""))
    names = list(settings_cls.model_fields) if fields is None else list(fields)

    def apply(command: F) -> F:
        # a Command lists a new option last; a function's options are listed innermost first
        for name in names if isinstance(command, click.Command) else reversed(names):
            field = settings_cls.model_fields[name]
            if is_secret(field):
                continue
            command = option(name, field, prefix, (flags or {}).get(name),
                             **(overrides or {}).get(name, {}))(command)
        return command

    return apply
