"""A registry home is private whatever command makes it and whatever the umask: its folders
0700, its files 0600 (a home first made by ``registry publish`` had its database at 0644 and
``blobs/`` at 0755: any local user could read the center's artifacts)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from tests.conftest import RegistryCli

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("permissive_umask")]




def readable_by_others(root: Path) -> dict[str, str]:
    """Every path under ``root`` (and itself) that its group or others may use, with its mode."""
    return {str(p.relative_to(root.parent)): oct(stat.S_IMODE(p.lstat().st_mode))
            for p in (root, *root.rglob("*")) if stat.S_IMODE(p.lstat().st_mode) & 0o077}


def test_a_home_first_made_by_publish_is_private(tmp_path: Path, tiny_release: Path) -> None:
    cli = RegistryCli(tmp_path / "new" / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    home = cli.home
    made = {str(p.relative_to(home)) for p in home.rglob("*")}
    assert {"registry.sqlite3", "blobs", "keys/signing.key", "keys/signing.pub"} <= made
    assert len([p for p in (home / "blobs" / "sha256").rglob("*") if p.is_file()]) == 4
    assert readable_by_others(home) == {}
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    assert stat.S_IMODE((home / "registry.sqlite3").stat().st_mode) == 0o600
    cli("tls", "--out", home / "tls")  # the fleet CA and certificates it signs
    cli("backup", tmp_path / "backup")
    assert {"ca.key", "ca.pem"} <= {p.name for p in (home / "tls").iterdir()}
    assert readable_by_others(home) == {}
    assert readable_by_others(tmp_path / "backup") == {}
    restored = RegistryCli(tmp_path / "restored")
    restored("restore", tmp_path / "backup")
    assert (restored.home / "registry.sqlite3").is_file()
    assert readable_by_others(restored.home) == {}


def test_a_home_first_made_by_a_reading_command_is_private(tmp_path: Path) -> None:
    cli = RegistryCli(tmp_path / "registry")
    assert cli("list", "--json").json() == []
    assert "registry.sqlite3" in {p.name for p in cli.home.iterdir()}
    assert readable_by_others(cli.home) == {}


def test_a_home_made_before_homes_were_private_is_tightened(tmp_path: Path) -> None:
    cli = RegistryCli(tmp_path / "registry")
    cli("list")
    for path in (cli.home, cli.home / "registry.sqlite3"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    cli("list")
    assert readable_by_others(cli.home) == {}
