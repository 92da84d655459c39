from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import REGISTRY

pytestmark = pytest.mark.integration
BIN = REGISTRY.parent


@pytest.mark.parametrize("command", ["registry", "center", "edge", "tiered"])
def test_every_command_has_help(command: str) -> None:
    result = subprocess.run([str(BIN / command), "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0 and "Usage:" in result.stdout


@pytest.mark.parametrize("command", [["registry", "serve"], ["registry", "status"],
                                     ["tiered", "up"], ["tiered", "demo"], ["tiered", "status"]])
def test_every_subcommand_has_help(command: list[str]) -> None:
    result = subprocess.run([str(BIN / command[0]), *command[1:], "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "Usage:" in result.stdout


def test_registry_serve_refuses_to_run_without_a_token(tmp_path: Path) -> None:
    result = subprocess.run([str(REGISTRY), "--home", str(tmp_path), "serve"],
                            capture_output=True, text=True, timeout=60,
                            env={"PATH": str(BIN), "HOME": str(tmp_path)})
    assert result.returncode == 2 and "REGISTRY_TOKEN" in result.stderr


def test_invalid_setting_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run([str(REGISTRY), "list"], capture_output=True, text=True, timeout=60,
                            env={"REGISTRY_HOME": str(tmp_path), "REGISTRY_MIN_FIDELITY": "2"})
    assert result.returncode == 2 and "invalid settings" in result.stderr
