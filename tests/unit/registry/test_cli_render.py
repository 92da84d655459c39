"""The registry's tables at 80 columns: node ids, states, model names and versions in full,
never cut short with ``…``."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from registry.cli import tables
from registry.store.chain import Record

STATES = ["DOWNLOADING", "ACTIVE", "FAILED", "REFUSED"]
NODES = [f"edge-eu-west-1-store-{i:04d}" for i in range(42, 42 + len(STATES))]
MODEL = "sentiment-multilingual-distilled"


def node_row(node: str, state: str) -> dict[str, Any]:
    return {"model": MODEL, "node": node, "tier": "edge", "region": "eu-west-1",
            "connected": state != "FAILED", "version": 1234, "desired": 1235, "state": state,
            "reason": "signature does not verify" if state == "REFUSED" else "",
            "lagging": True, "last_seen": "2026-12-01T10:30:36.123456+00:00",
            "escalation_rate": 0.123, "p99_ms": 45.6, "fidelity": 0.991,
            "fidelity_version": 1234, "cpu_features": ["avx2", "avx512f", "avx512_vnni"]}


def column(text: str, index: int) -> str:
    """The cells of column ``index`` of a table, its folded lines joined."""
    return "".join(line.split("│")[index + 1].strip() for line in text.splitlines()
                   if line.count("│") > index + 1)


def printed(width: int, draw: Any) -> str:
    console = Console(width=width, record=True, highlight=False)
    draw(console)
    return console.export_text()


@pytest.mark.parametrize("width", [80, 100])
def test_registry_status_at_narrow_widths(width: int) -> None:
    rows = [node_row(n, s) for n, s in zip(NODES, STATES, strict=True)]
    text = printed(width, lambda c: tables.status_tables(c, rows))
    assert "…" not in text
    assert max(len(line) for line in text.splitlines()) <= width
    for value in [*NODES, *STATES, MODEL, "1234", "1235", "signature does not verify",
                  "2026-12-01T10:30:36.123456+00:00", "avx512_vnni", "(offline)"]:
        assert value in text, value


def test_registry_status_is_a_table_when_wide() -> None:
    rows = [node_row(NODES[0], "ACTIVE")]
    text = printed(250, lambda c: tables.status_tables(c, rows))
    assert "┃ node" in text and NODES[0] in text and "…" not in text


def test_list_and_audit_fold_instead_of_cutting() -> None:
    models = [{"name": f"{MODEL}-{i}", "versions": 12345, "latest": 12345, "production": 12344,
               "canary": 12345, "created_at": "2026-12-01T10:30:36.123456+00:00"}
              for i in range(3)]
    text = printed(80, lambda c: tables.models_table(c, models))
    assert "…" not in text
    assert all(m["name"] in column(text, 0) for m in models)
    records = [Record(7, "2026-12-01T10:30:36.123456+00:00", "operator@build-host-0042",
                      "promote", MODEL, 12345, None, "{}", "0" * 64, "f" * 64)]
    text = printed(80, lambda c: tables.audit_table(c, records))
    assert "…" not in text and MODEL in column(text, 4) and "12345" in column(text, 5)
    assert "operator@build-host-0042" in column(text, 2)
