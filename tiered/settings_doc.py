"""The settings tables of the docs, generated from the settings classes so they cannot drift.

Each table lives in one page, between ``<!-- settings: NAME -->`` and ``<!-- /settings -->``:
center and edge, Consul and the launcher in ``docs/operations.md``, the registry in
``docs/registry.md``. A row is a field: its environment variable(s), its flag where a command
has one, its attribute docstring and its default, read from the class that validates it.

    .venv/bin/python -m tiered.settings_doc          # rewrite the tables in place
    .venv/bin/python -m tiered.settings_doc --check  # exit 1 if a table differs (the tests do)
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path

import click
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from center.settings import CenterSettings
from edge.settings import EdgeSettings
from registry.settings import RegistrySettings
from serving.config.flags import env_name
from serving.config.settings import ConsulSettings
from tiered.settings import TieredSettings

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- settings: (\w+) -->\n)(.*?)(<!-- /settings -->)", re.DOTALL)
PAGES = ("docs/operations.md", "docs/registry.md")


def prefix(cls: type[BaseSettings]) -> str:
    return str(cls.model_config.get("env_prefix", ""))


def own_fields(cls: type[BaseSettings]) -> dict[str, FieldInfo]:
    """The fields of ``cls`` without Consul's (one table of their own, shared by every role)."""
    return {name: field for name, field in cls.model_fields.items()
            if name not in ConsulSettings.model_fields or cls is ConsulSettings}


def meaning(field: FieldInfo) -> str:
    """The attribute docstring on one line, reST literals as Markdown code, pipes escaped."""
    text = " ".join((field.description or "").split())
    return text.replace("``", "`").replace("|", "\\|")


def default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return "computed"
    value = field.default
    if value is None or value == "":
        return "none"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, bool):
        value = str(value).lower()
    if isinstance(value, Path) and not value.is_absolute():
        return f"`./{value}`"
    return f"`{value}`"


def table(header: list[str], rows: Iterator[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def code(name: str) -> str:
    return f"`{name}`"


def serving_table() -> str:
    """Center and edge side by side: a field both have is one row."""
    center, edge = own_fields(CenterSettings), own_fields(EdgeSettings)
    names = list(dict.fromkeys([*center, *edge]))

    def row(name: str) -> list[str]:
        c, e = center.get(name), edge.get(name)
        shown = [f"`{env_name(name, f, prefix(cls))}`" if f else "—"
                 for f, cls in ((c, CenterSettings), (e, EdgeSettings))]
        defaults = {default(f) for f in (c, e) if f}
        both = (" / ".join(default(f) for f in (c, e) if f) if len(defaults) > 1
                else defaults.pop())
        said = {meaning(f) for f in (c, e) if f}
        text = (said.pop() if len(said) == 1
                else f"Center: {meaning(center[name])} Edge: {meaning(edge[name])}")
        return [*shown, text, both]

    return table(["center", "edge", "meaning", "default"], (row(n) for n in names))


def registry_flags() -> dict[str, str]:
    """Environment variable -> the registry command flags that set it (``serve --port``)."""
    from registry.cli.main import cli  # the whole CLI: only when the table is made

    found: dict[str, list[str]] = {}

    def walk(command: click.Command, path: str) -> None:
        for param in command.params:
            if isinstance(param, click.Option) and param.help and "[env: " in param.help:
                variable = param.help.split("[env: ", 1)[1].split(";", 1)[0]
                found.setdefault(variable, []).append(f"{path} {param.opts[0]}".strip())
        if isinstance(command, click.Group):
            for name, sub in sorted(command.commands.items()):
                walk(sub, f"{path} {name}".strip())

    walk(cli, "")
    return {variable: ", ".join(f"`{flag}`" for flag in flags)
            for variable, flags in found.items()}


def single_table(cls: type[BaseSettings], flags: Callable[[], dict[str, str]] | None = None
                 ) -> str:
    flag_of = flags() if flags else {}

    def row(name: str, field: FieldInfo) -> list[str]:
        variable = env_name(name, field, prefix(cls))
        cells = [code(variable)]
        if flags:
            cells.append(flag_of.get(variable, "—"))
        return [*cells, meaning(field), default(field)]

    header = ["variable", *(["flag"] if flags else []), "meaning", "default"]
    return table(header, (row(n, f) for n, f in own_fields(cls).items()))


TABLES: dict[str, Callable[[], str]] = {
    "serving": serving_table,
    "consul": lambda: single_table(ConsulSettings),
    "tiered": lambda: single_table(TieredSettings),
    "registry": lambda: single_table(RegistrySettings, registry_flags),
}


def render(text: str) -> str:
    """``text`` with every settings block replaced by its generated table."""

    def fill(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in TABLES:
            raise KeyError(f"unknown settings table {name!r} (known: {', '.join(TABLES)})")
        return match.group(1) + TABLES[name]() + match.group(4)

    return BLOCK.sub(fill, text)


def stale(root: Path = ROOT) -> list[str]:
    """The pages whose tables differ from the settings classes."""
    return [page for page in PAGES
            if render(text := (root / page).read_text(encoding="utf-8")) != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tiered.settings_doc",
                                     description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true",
                        help="only check: exit 1 naming the pages whose tables differ")
    args = parser.parse_args(argv)
    if args.check:
        pages = stale()
        for page in pages:
            print(f"{page}: settings tables differ from the settings classes; run "
                  f"`.venv/bin/python -m tiered.settings_doc`", file=sys.stderr)
        return 1 if pages else 0
    for page in PAGES:
        path = ROOT / page
        path.write_text(render(path.read_text(encoding="utf-8")), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
