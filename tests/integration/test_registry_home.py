"""Where a ``registry`` command reads and writes, as a user sees it: the home it used is said on
stderr (and in ``--json``), a folder that is not a registry is refused in one line instead of
becoming a new empty registry, ``registry init`` and ``publish --create`` make one on purpose,
and a running stack's registry is found from its clone's root and any folder below it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.processes import code_path
from registry.cli.home import locate

pytestmark = pytest.mark.integration


def registry(cwd: Path, *args: str, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "registry.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], "HOME": str(cwd), "COLUMNS": "80",
                               **code_path(), **(env or {})})


def stack_clone(root: Path, pid: int) -> Path:
    """A clone whose stack (``tiered up``) recorded its registry, run by ``pid``."""
    (root / ".git").mkdir(parents=True)
    home = root / "var" / "registry"
    state = root / "var" / "stack" / "stack.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"registry_home": str(home), "children": {
        "registry": {"pid": pid, "port": 1, "role": "registry"}}}))
    return home


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_folder_without_a_registry_is_refused_in_one_line_and_nothing_is_made(
        tmp_path: Path) -> None:
    done = registry(tmp_path, "list")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert f"{tmp_path / 'var' / 'registry'} (from the default ./var/registry) is not a " \
           f"registry" in lines[0]
    assert "REGISTRY_HOME" in lines[0] and "`registry init`" in lines[0]
    assert not (tmp_path / "var").exists()


def test_publish_into_a_wrong_folder_is_refused_before_any_work(tmp_path: Path) -> None:
    done = registry(tmp_path, "publish", "nowhere.pt", "--name", "m",
                    env={"REGISTRY_HOME": str(tmp_path / "typo")})
    assert done.returncode == 2 and "(from REGISTRY_HOME) is not a registry" in done.stderr
    assert not (tmp_path / "typo").exists()


def test_init_makes_the_home_once_and_says_what_it_made(tmp_path: Path) -> None:
    first = registry(tmp_path, "init")
    assert first.returncode == 0, first.stderr
    home = tmp_path / "var" / "registry"
    assert f"made registry.sqlite3, keys/signing.key in {home}" in first.stdout
    assert (home / "registry.sqlite3").is_file() and (home / "keys" / "signing.key").is_file()
    again = registry(tmp_path, "init", "--json")
    assert json.loads(again.stdout)["created"] == []
    assert json.loads(again.stdout)["home"] == str(home)
    listed = registry(tmp_path, "list")
    assert listed.returncode == 0
    assert listed.stderr.strip() == f"registry home: {home} (the default ./var/registry)"


def test_publish_create_makes_the_home_it_publishes_into(tmp_path: Path,
                                                         tiny_release: Path) -> None:
    home = tmp_path / "new"
    done = registry(tmp_path, "--home", str(home), "publish", str(tiny_release), "--name",
                    "tiny", "--create", "--min-fidelity", "0", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["home"] == str(home)
    assert f"registry home: {home} (--home)" in done.stderr


def test_a_running_stacks_registry_is_found_from_the_clone_root_and_below(
        tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    home = stack_clone(clone, os.getpid())
    for folder in (clone, clone / "examples" / "deep"):
        folder.mkdir(parents=True, exist_ok=True)
        found = locate(Path(os.path.abspath(folder / "var/registry")), flag=False, given=False,
                       cwd=folder)
        assert found.path == home
        assert found.describe() == (f"registry home: {home} (the running stack's, "
                                    f"{clone / 'var/stack/stack.json'})")


def test_a_stopped_stacks_state_is_not_followed(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    stack_clone(clone, dead_pid())
    found = locate(clone / "var/registry", flag=False, given=False, cwd=clone)
    assert found.stack is None and found.origin == "the default ./var/registry"


def test_outside_the_clone_registry_home_names_the_stacks_registry(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    home = stack_clone(clone, os.getpid())
    found = locate(home, flag=False, given=True, cwd=tmp_path)
    assert found.describe() == (f"registry home: {home} (REGISTRY_HOME; the running stack's, "
                                f"{clone / 'var/stack/stack.json'})")
    elsewhere = locate(tmp_path / "other", flag=False, given=True,
                       cwd=tmp_path)
    assert elsewhere.describe() == f"registry home: {tmp_path / 'other'} (REGISTRY_HOME)"


def test_the_stack_is_not_looked_for_above_the_clone_root(tmp_path: Path) -> None:
    stack_clone(tmp_path, os.getpid())  # a stack in the folder above
    inner = tmp_path / "other-clone"
    (inner / ".git").mkdir(parents=True)
    found = locate(inner / "var/registry", flag=False, given=False, cwd=inner)
    assert found.stack is None and found.path == inner / "var/registry"
