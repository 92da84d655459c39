"""What the monitoring tests share: where the files are, the tools (Debian's prometheus and
prometheus-alertmanager, installed by ``scripts/install_tools.sh``), and reading the rules."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
MONITORING = ROOT / "monitoring"
RULES = sorted((MONITORING / "rules").glob("*.yml"))
TESTS = sorted((MONITORING / "tests").glob("*.yml"))
RUNBOOK = ROOT / "docs" / "alerts.md"
LAYERS = {"edge", "center", "registry", "sync", "fleet", "monitoring"}
SEVERITIES = {"page", "ticket"}


def tool(name: str) -> str:
    """The path of ``name``; a missing tool fails the test (``make test`` installs them)."""
    found = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/bin") / name, Path("/usr/sbin") / name) if p.is_file()), None)
    assert found, f"{name} is not installed: run scripts/install_tools.sh (Debian's prometheus " \
                  "and prometheus-alertmanager packages)"
    return found


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, check=False)


def alerts() -> list[dict[str, Any]]:
    """Every alerting rule of ``monitoring/rules/``, with the file it is in (``file``)."""
    found = []
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            found += [{**rule, "file": path.name} for rule in group["rules"] if "alert" in rule]
    return found


def alert_cases() -> list[dict[str, Any]]:
    """Every ``alert_rule_test`` case of ``monitoring/tests/``."""
    cases = []
    for path in TESTS:
        for test in yaml.safe_load(path.read_text())["tests"]:
            cases += test.get("alert_rule_test", [])
    return cases


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped (but ``-`` and
    ``_``), spaces to hyphens."""
    text = re.sub(r"^#+\s*", "", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The anchors of a page's headings, code blocks left out."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    return {anchor(line) for line in text.splitlines() if re.match(r"^#{1,6} ", line)}
