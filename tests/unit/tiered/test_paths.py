"""Path settings are made absolute once, against the folder the command was started in: the
children ``tiered up`` spawns run in ``<root>``, and a relative path handed to them named
another folder there (the full release was published into a second registry under
``var/stack/var/registry``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from center.settings import CenterSettings
from edge.settings import EdgeSettings
from registry.settings import RegistrySettings
from tiered import releases
from tiered.settings import TieredSettings


def test_every_path_setting_is_absolute_against_the_starting_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("REGISTRY_HOME", "elsewhere/../var/registry")
    s = TieredSettings()
    assert (s.root, s.release, s.quick_release, s.registry_home) == (
        tmp_path / "var" / "stack", tmp_path / "var" / "demo" / "release",
        tmp_path / "var" / "demo" / "quick", tmp_path / "var" / "registry")
    assert RegistrySettings().home == tmp_path / "var" / "registry"
    assert RegistrySettings(signing_key=Path("k/signing.key")).signing_key == \
        tmp_path / "k" / "signing.key"
    assert EdgeSettings().store == tmp_path / "var" / "edge"
    assert CenterSettings(store=Path("s")).store == tmp_path / "s"
    assert EdgeSettings(release_key=Path("/etc/key.pub")).release_key == Path("/etc/key.pub")
    # what tiered up hands its children: nothing that depends on their working folder
    monkeypatch.chdir("/")
    argv = releases.publish_argv(s, s.release)
    assert str(tmp_path / "var" / "registry") in argv and str(s.release) in argv
    assert releases.build_argv(s.trainer, s.release)[-2:] == ["--out", str(s.release)]
    assert all(not a.startswith(("var/", "./")) for a in argv)

