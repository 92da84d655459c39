"""The docs' settings tables are generated from the settings classes and cannot drift: a
table that differs fails here, and so does a variable a page names that nothing reads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from serving.config.flags import env_name
from tiered import settings_doc
from tiered.settings_doc import ROOT, render, stale

# a variable as the docs write it: in backticks, with one of the roles' prefixes
VARIABLE = re.compile(r"`[^`\n]*?\b((?:CENTER|EDGE|REGISTRY|TIERED|CONSUL)_[A-Z0-9_]*[A-Z0-9])\b")
# where the variables that are not settings are defined: the compose files and scripts (build
# arguments, per-role Consul tokens) and what a supervisor sets for its workers
DEFINED_ELSEWHERE = ["docker-compose.yml", "docker-compose.cpu.yml", "deploy", "docker",
                     "scripts", "serving/config/environment.py"]


def settings_variables() -> set[str]:
    classes = (settings_doc.CenterSettings, settings_doc.EdgeSettings,
               settings_doc.RegistrySettings, settings_doc.TieredSettings,
               settings_doc.ConsulSettings)
    return {env_name(name, field, settings_doc.prefix(cls))
            for cls in classes for name, field in cls.model_fields.items()}


def defined_elsewhere() -> str:
    texts = []
    for name in DEFINED_ELSEWHERE:
        path = ROOT / name
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        texts += [f.read_text(encoding="utf-8", errors="replace") for f in files]
    return "\n".join(texts)


def test_every_settings_table_in_the_docs_is_what_the_settings_classes_generate() -> None:
    assert stale() == [], ("run `.venv/bin/python -m tiered.settings_doc` to regenerate the "
                           "settings tables of the pages listed")


def test_each_table_has_one_home() -> None:
    homes: dict[str, list[str]] = {}
    for page in settings_doc.PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        for match in settings_doc.BLOCK.finditer(text):
            homes.setdefault(match.group(2), []).append(page)
    assert sorted(homes) == sorted(settings_doc.TABLES)
    assert all(len(pages) == 1 for pages in homes.values()), homes


def test_a_changed_docstring_or_default_shows_up_as_a_stale_table(tmp_path: Path) -> None:
    for page in settings_doc.PAGES:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        text = (ROOT / page).read_text(encoding="utf-8")
        (tmp_path / page).write_text(text.replace("`./var/center` / `./var/edge`",
                                                  "`./var/center` / `./var/old`"))
    assert stale(tmp_path) == ["docs/operations.md"]
    rendered = render((tmp_path / "docs/operations.md").read_text(encoding="utf-8"))
    assert "`./var/center` / `./var/edge`" in rendered and "./var/old" not in rendered


def test_the_tables_carry_each_variable_its_meaning_and_default() -> None:
    serving = settings_doc.serving_table()
    assert ("| `CENTER_PORT` | `EDGE_PORT` | HTTP port of the V2 API (the escalation API) and "
            "/metrics." not in serving)  # a center-only docstring is labelled as the center's
    assert "| — | `EDGE_CACHE_SIZE` | Answers kept in the LRU response cache (0 disables it). " \
           "| `10000` |" in serving
    assert "| `CENTER_DEVICE` | — |" in serving
    registry = settings_doc.TABLES["registry"]()
    assert "| `REGISTRY_GRPC_PORT` | `serve --port` |" in registry
    assert "| `REGISTRY_MIN_FIDELITY` | `publish --min-fidelity` |" in registry


def test_an_unknown_table_name_is_refused() -> None:
    with pytest.raises(KeyError, match="unknown settings table"):
        render("<!-- settings: nonsense -->\n<!-- /settings -->")


def test_every_variable_the_docs_name_is_read_by_something() -> None:
    known = settings_variables()
    elsewhere = defined_elsewhere()
    unknown = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for match in VARIABLE.finditer(page.read_text(encoding="utf-8")):
            name = match.group(1)
            if name not in known and name not in elsewhere:
                unknown.append(f"{page.relative_to(ROOT)}: {name}")
    assert not unknown, "variables no settings class reads:\n" + "\n".join(unknown)
