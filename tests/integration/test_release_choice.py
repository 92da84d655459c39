"""Which demo release ``tiered up`` starts on (``tiered.releases.choose``), against a real
registry: the full release when it is built; else what is published, training the full one
behind only when that is the quick release; else the quick release."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from examples.sentiment import build
from tests.conftest import RegistryCli
from tiered.releases import Start, choose
from tiered.settings import TieredSettings

pytestmark = [pytest.mark.integration]


def settings(tmp_path: Path, quick: Path, **extra: object) -> TieredSettings:
    return TieredSettings(model="tiny", registry_home=tmp_path / "registry",
                          quick_release=quick, release=tmp_path / "full", **extra)


def test_nothing_published_starts_on_the_quick_release_and_trains_behind(
        tmp_path: Path, tiny_release: Path) -> None:
    choice = choose(settings(tmp_path, tiny_release))
    assert (choice.start, choice.train_behind) == (Start.QUICK, True)
    off = choose(settings(tmp_path, tiny_release, train_behind=False))
    assert (off.start, off.train_behind) == (Start.QUICK, False)


def test_a_published_quick_release_is_served_and_the_full_one_trained_again(
        tmp_path: Path, registry_cli: RegistryCli, tiny_release: Path,
        tiny_release_b: Path) -> None:
    registry_cli("publish", tiny_release, "--name", "tiny")
    quick = settings(tmp_path, tiny_release)  # the published release is "the quick one"
    assert (choose(quick).start, choose(quick).train_behind) == (Start.PUBLISHED, True)
    # any other release (the user's own) is served as it is: nothing trains over it
    other = settings(tmp_path, tiny_release_b)
    assert (choose(other).start, choose(other).train_behind) == (Start.PUBLISHED, False)


def test_a_built_full_release_is_started_on_whatever_is_published(
        tmp_path: Path, registry_cli: RegistryCli, tiny_release: Path) -> None:
    registry_cli("publish", tiny_release, "--name", "tiny")
    s = settings(tmp_path, tiny_release)
    shutil.copytree(tiny_release, s.release)
    assert choose(s).start is Start.PUBLISHED  # a folder alone is no trained full release
    (s.release / build.TRAIN_MARKER).write_text(build.train_key(build.BuildConfig()) + "\n")
    assert (choose(s).start, choose(s).train_behind) == (Start.FULL, False)
    (s.release / build.TRAIN_MARKER).write_text("trained by other code\n")
    assert choose(s).start is Start.PUBLISHED
