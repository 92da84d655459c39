"""The alert and recording rules as an operator relies on them: Prometheus's own promtool
accepts every rule file and passes every unit test, each alert is named ``Tiered*``, says its
severity and layer, and points at a runbook section that exists, and each has a test where it
fires and one where it stays quiet."""

from __future__ import annotations

from pathlib import Path

from tests.unit.monitoring.promtool import (
    LAYERS,
    RULES,
    RUNBOOK,
    SEVERITIES,
    TESTS,
    alert_cases,
    alerts,
    anchor,
    anchors,
    run,
    tool,
)


def test_promtool_accepts_every_rule_file() -> None:
    assert RULES, "no rule files in monitoring/rules/"
    done = run(tool("promtool"), "check", "rules", *RULES)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_promtool_unit_test_passes() -> None:
    assert TESTS, "no promtool tests in monitoring/tests/"
    done = run(tool("promtool"), "test", "rules", *TESTS)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_check_fails_on_a_broken_rule(tmp_path: Path) -> None:
    """The check above can fail: an expression that does not parse is refused."""
    broken = tmp_path / "broken.yml"
    broken.write_text("groups:\n  - name: x\n    rules:\n      - alert: TieredX\n"
                      "        expr: rate(edge_rows_total[5m] > 0\n")
    done = run(tool("promtool"), "check", "rules", broken)
    assert done.returncode != 0 and "parse error" in (done.stdout + done.stderr)


def test_every_alert_is_named_tiered_with_a_severity_a_layer_and_three_annotations() -> None:
    wrong = []
    for rule in alerts():
        labels, notes = rule.get("labels", {}), rule.get("annotations", {})
        layer = labels.get("layer", "")
        if not rule["alert"].startswith("Tiered"):
            wrong.append(f"{rule['alert']}: not named Tiered*")
        if labels.get("severity") not in SEVERITIES:
            wrong.append(f"{rule['alert']}: severity {labels.get('severity')!r}")
        if layer not in LAYERS and "{{" not in layer:  # templated: checked by the tests below
            wrong.append(f"{rule['alert']}: layer {layer!r}")
        if {"summary", "description", "runbook"} - set(notes):
            wrong.append(f"{rule['alert']}: annotations {sorted(notes)}")
    assert not wrong, "\n".join(wrong)


def test_a_templated_layer_only_ever_renders_a_known_layer() -> None:
    """``layer: "{{ $labels.job }}"`` and the like: every value the unit tests saw rendered."""
    seen = {alert["exp_labels"]["layer"] for case in alert_cases()
            for alert in case.get("exp_alerts") or []}
    assert seen <= LAYERS, f"layers outside {sorted(LAYERS)}: {sorted(seen - LAYERS)}"


def test_every_runbook_link_names_a_section_of_docs_alerts_md() -> None:
    sections = anchors(RUNBOOK.read_text(encoding="utf-8"))
    wrong = []
    for rule in alerts():
        page, _, section = rule["annotations"]["runbook"].partition("#")
        if page != "docs/alerts.md" or section not in sections:
            wrong.append(f"{rule['alert']}: {rule['annotations']['runbook']}")
    assert not wrong, "runbook links to no section of docs/alerts.md:\n" + "\n".join(wrong)


def test_anchors_are_github_s() -> None:
    assert anchor("## TieredNodeDown") == "tierednodedown"
    assert anchor("## Where alerts go: editing the receiver") == (
        "where-alerts-go-editing-the-receiver")
    assert anchors("# A\n```\n## Not a heading\n```\n### B_c (d)\n") == {"a", "b_c-d"}


def test_every_alert_has_a_test_where_it_fires_and_one_where_it_does_not() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in alert_cases():
        (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {rule["alert"] for rule in alerts()}
    missing = [f"{name}: no test where it fires" for name in sorted(names - firing)]
    missing += [f"{name}: no test where it stays quiet" for name in sorted(names - quiet)]
    missing += [f"{name}: tested but no such alert" for name in sorted((firing | quiet) - names)]
    assert not missing, "\n".join(missing)
