"""The names the catalog gives: a model's name (checked before anything is stored under it) and
the aliases that point at one of its versions."""

from __future__ import annotations

from registry.errors import InvalidName
from serving.release.manifest import is_valid_name

PRODUCTION = "production"
CANARY = "canary"
ALL_NODES = ["*"]  # the targets of an alias every node follows


def check_name(name: str) -> None:
    if not is_valid_name(name):
        raise InvalidName(f"invalid model name {name!r}: use lowercase ASCII letters, digits, "
                          f"'.', '_' and '-', starting with a letter or digit, at most 128 "
                          f"characters (no '..', no '/')")
