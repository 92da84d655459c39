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


@pytest.mark.parametrize("command", ["tiered"])
def test_placeholders_say_not_yet(command: str) -> None:
    result = subprocess.run([str(BIN / command)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "not yet implemented" in result.stderr


def test_invalid_setting_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run([str(REGISTRY), "list"], capture_output=True, text=True, timeout=60,
                            env={"REGISTRY_HOME": str(tmp_path), "REGISTRY_MIN_FIDELITY": "2"})
    assert result.returncode == 2 and "invalid settings" in result.stderr
