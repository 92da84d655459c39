"""``tiered status`` at 80 columns: every node id and state in full, never ``…``; ``--json``
holds the same rows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from rich.console import Console

from serving.fleet.discovery import SERVICES
from tiered import cli
from tiered.views import (
    SHOWN,
    demo_view,
    registry_database,
    status_rows,
    status_view,
    summary_view,
)

STATES = ["DOWNLOADING", "ACTIVE", "FAILED", "REFUSED", "ACK_STATE_UNSPECIFIED"]
NODES = [f"edge-eu-west-1-store-{i:04d}" for i in range(42, 42 + len(STATES))]
MODEL = "sentiment-multilingual-distilled"


def entry(node: str, port: int, region: str, status: str = "passing") -> dict[str, Any]:
    return {"Service": {"ID": node, "Address": "10.200.100.123", "Port": port,
                        "Meta": {"region": region}},
            "Checks": [{"ServiceID": node, "Status": status}, {"Status": "passing"}]}


def health() -> dict[str, list[dict[str, Any]]]:
    return {SERVICES["registry"]: [entry("registry-central-europe-1", 50051, "-")],
            SERVICES["registry-standby"]: [entry("registry-central-europe-2", 50051, "-")],
            SERVICES["center"]: [entry("center-gpu-frankfurt-0001", 8100, "local", "critical")],
            SERVICES["edge"]: [entry(n, 8200 + i, "eu-west-1") for i, n in enumerate(NODES)]}


def rollout() -> dict[tuple[str, str], dict[str, Any]]:
    return {(n, MODEL): {"version": 1234, "desired": 1235, "state": state,
                         "escalation_rate": 0.123, "p99_ms": 45.6}
            for n, state in zip(NODES, STATES, strict=True)}


def render(renderable: Any, width: int = 80) -> str:
    console = Console(width=width, record=True, highlight=False)
    console.print(renderable)
    return console.export_text()


@pytest.mark.parametrize("width", [60, 80, 100])
def test_status_at_narrow_widths_shows_every_value_in_full(width: int) -> None:
    rows = status_rows(health(), rollout())
    text = render(status_view(rows, "127.0.0.1:8500", width), width)
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    for value in [*NODES, *STATES, "registry-central-europe-1", "center-gpu-frankfurt-0001",
                  SERVICES["registry"], SERVICES["center"], SERVICES["edge"],
                  "10.200.100.123:50051", "eu-west-1", "critical", "1235", "45.6 ms"]:
        assert value in text, value


def test_status_is_a_table_when_wide_enough() -> None:
    rows = status_rows(health(), rollout())
    text = render(status_view(rows, "127.0.0.1:8500", 240), 240)
    assert "┃ service" in text and "…" not in text and MODEL in text
    assert all(n in text for n in NODES)


def test_status_rows_join_consul_and_the_registry() -> None:
    rows = status_rows(health(), rollout())
    edge = next(r for r in rows if r["node"] == NODES[3])
    assert edge == {"service": SERVICES["edge"], "node": NODES[3],
                    "address": "10.200.100.123:8203", "site": "-", "region": "eu-west-1",
                    "health": "passing", "model": MODEL, "version": 1234, "desired": 1235,
                    "state": "REFUSED",
                    "escalation_rate": 0.123, "p99_ms": 45.6}
    center = next(r for r in rows if r["service"] == SERVICES["center"])
    assert center["health"] == "critical" and center["state"] is None


def test_status_names_each_instances_site_from_its_agents_node_meta() -> None:
    """``tiered sites`` tags every Consul agent with its site; a value that is not a site
    name (node meta is written by whoever reaches Consul) shows as "?"."""
    found = health()
    sites = ["eu", "eu-west-1\x1b[31m", ["us"]]
    for e, site in zip(found[SERVICES["edge"]], sites, strict=False):
        e["Node"] = {"Node": "eu-gw", "Meta": {"tiered_site": site}}
    rows = {r["node"]: r for r in status_rows(found, rollout())}
    assert [rows[n]["site"] for n in NODES[:4]] == ["eu", "?", "?", "-"]
    text = render(status_view(list(rows.values()), "127.0.0.1:8500", 240), 240)
    assert "┃ site" in text and "\x1b" not in text


class Answer:
    status_code = 200
    text = ""

    def __init__(self, data: Any) -> None:
        self.data = data

    def json(self) -> Any:
        return self.data


def test_status_command_json_and_text_hold_the_same_rows(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    answers = health() | {SERVICES["registry-standby"]: []}  # no standby in this fleet
    asked: list[str] = []

    def get(url: str, **_: Any) -> Answer:
        service = url.rsplit("/", 1)[1]
        asked.append(service)
        return Answer(answers[service])

    monkeypatch.setattr(httpx, "get", get)
    monkeypatch.setenv("TIERED_ROOT", str(tmp_path / "stack"))
    monkeypatch.setenv("REGISTRY_HOME", str(tmp_path / "registry"))
    (tmp_path / "registry").mkdir()
    monkeypatch.setenv("TIERED_MODEL", MODEL)
    console = Console(width=80, record=True, highlight=False)
    monkeypatch.setattr(cli, "out", console)

    result = CliRunner().invoke(cli.cli, ["status", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert sorted(asked) == sorted(SERVICES.values())
    assert rows == status_rows(answers, {})  # an empty registry: no rollout yet
    assert registry_database(tmp_path / "registry").is_file()  # where the registry keeps it

    result = CliRunner().invoke(cli.cli, ["status"])
    assert result.exit_code == 0, result.output
    text = console.export_text()
    assert "…" not in text
    for row in rows:
        assert row["node"] in text and row["address"] in text and row["health"] in text


def test_registry_database_is_the_registry_settings_one(tmp_path: Path) -> None:
    from registry.settings import RegistrySettings

    assert registry_database(tmp_path) == RegistrySettings(home=tmp_path).database


def test_summary_and_demo_fold_long_values() -> None:
    url = "http://127.0.0.1:8080/v2/models/sentiment-multilingual-distilled/infer"
    text = render(summary_view(12.0, [("entry (nginx)", url)]))
    assert url in text.replace("\n", "").replace("│", "").replace(" ", "")  # folded, whole
    assert "…" not in text
    data = {"url": url, "sent": 10, "failed": 0, "accuracy": 0.9, "rows_by_tier": {"edge": 10},
            "by_node": {NODES[0]: 10}, "p50_ms": 1.0, "p99_ms": 2.0, "seconds": 1.0,
            "errors": {}}
    text = render(demo_view(data))
    assert "…" not in text and NODES[0] in text


def test_escape_sequences_in_the_catalog_never_reach_the_terminal() -> None:
    """Anyone holding a role's Consul token writes an entry's id, address and region: a
    terminal's escape sequences there (clear screen, set the title) are shown escaped."""
    clear, title = "\x1b[2J", "\x1b]0;pwned\x07"
    found = health()
    found[SERVICES["edge"]] = [{
        "Service": {"ID": f"edge-{clear}", "Address": f"10.0.0.1{title}", "Port": 8200,
                    "Meta": {"region": f"eu{clear}"}},
        "Checks": [{"ServiceID": "x", "Status": f"passing{title}"}]}]
    rows = status_rows(found, {})
    console = Console(width=200, file=None, force_terminal=True, color_system=None,
                      record=True, highlight=False)
    with console.capture() as captured:
        console.print(status_view(rows, "127.0.0.1:8500", 200))
    shown = captured.get()
    assert "\x1b" not in shown and "\x07" not in shown
    assert "edge-\\x1b[2J" in shown and "\\x1b]0;pwned\\x07" in shown  # visible, escaped
    (edge,) = [r for r in rows if r["service"] == SERVICES["edge"]]
    assert edge["health"] != "passing"  # a status that only starts with "passing" is not it


def test_a_catalog_value_is_cut_to_a_bound() -> None:
    found = {SERVICES["edge"]: [entry("e" * 5000, 8200, "r" * 5000)]}
    (row,) = status_rows(found, {})
    assert len(row["node"]) == SHOWN and len(row["region"]) == SHOWN
    found = {SERVICES["edge"]: [entry("e" * SHOWN, 8200, "eu")]}
    assert status_rows(found, {})[0]["node"] == "e" * SHOWN  # just inside: whole
