"""The Alertmanager configuration a user edits (``monitoring/alertmanager.yml``): amtool accepts
it as shipped and with its commented e-mail and chat examples turned on, and alerts reach the
receivers its comments promise."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.monitoring.promtool import MONITORING, run, tool

CONFIG = MONITORING / "alertmanager.yml"
# A commented-out line of configuration: `# key: ...`, `# - key: ...` (prose starts otherwise)
EXAMPLE = re.compile(r"^(\s*)# ( *(?:- )?[a-z_]+:(?: .*)?)$")


def uncommented(text: str) -> str:
    """``text`` with its commented configuration lines turned on."""
    return "\n".join(EXAMPLE.sub(r"\1\2", line) for line in text.splitlines()) + "\n"


def receivers(config: Path, *labels: str) -> str:
    done = run(tool("amtool"), "config", "routes", "test", "--config.file", config, *labels)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip()


def test_amtool_accepts_the_configuration_as_shipped() -> None:
    done = run(tool("amtool"), "check-config", CONFIG)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_goes_to_the_webhook_on_the_local_listener_until_edited() -> None:
    assert "url: http://127.0.0.1:9095/alerts" in CONFIG.read_text()
    assert receivers(CONFIG, "alertname=TieredCenterUnreachable", "layer=center",
                     "severity=page") == "webhook"
    assert receivers(CONFIG, "alertname=TieredInputDrift", "layer=edge",
                     "severity=ticket") == "webhook"


def test_the_commented_examples_turned_on_are_valid_and_route_as_their_comments_say(
        tmp_path: Path) -> None:
    edited = tmp_path / "alertmanager.yml"
    edited.write_text(uncommented(CONFIG.read_text()))
    done = run(tool("amtool"), "check-config", edited)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 receivers" in done.stdout  # webhook, email and chat
    assert receivers(edited, "alertname=TieredRolloutHalted", "severity=ticket") == "email"
    assert receivers(edited, "alertname=TieredTierDown", "severity=page") == "chat"


def test_amtool_refuses_a_route_to_a_receiver_that_does_not_exist(tmp_path: Path) -> None:
    """The checks above can fail: a route naming a receiver left commented out is refused."""
    broken = tmp_path / "alertmanager.yml"
    broken.write_text(CONFIG.read_text().replace("receiver: webhook\n  group_by",
                                                 "receiver: email\n  group_by"))
    done = run(tool("amtool"), "check-config", broken)
    assert done.returncode != 0 and "email" in done.stdout + done.stderr


def test_uncommenting_turns_on_configuration_lines_only() -> None:
    text = ("  # For the e-mail receiver below (uncomment both):\n  # smtp_from: a@b.org\n"
            "    #   receiver: email\n      # a pager bridge, a chat relay\n")
    assert uncommented(text) == ("  # For the e-mail receiver below (uncomment both):\n"
                                 "  smtp_from: a@b.org\n      receiver: email\n"
                                 "      # a pager bridge, a chat relay\n")
