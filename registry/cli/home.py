"""Which registry home a command uses, and why (docs/models.md, "Where publish writes").

The home is ``--home``, else ``REGISTRY_HOME``, else the registry of a stack running in this
clone (``make up``/``tiered up`` record it in ``var/stack/stack.json``, ``tiered sites`` in
``var/stack/sites/stack.json``: found from the clone root or any folder below it, and only
while the stack's registry process is alive), else ``./var/registry``. A home is made only
on purpose (``registry init``, ``publish --create``, ``registry serve``): a command pointed at
a folder without a registry database says so, instead of starting an empty registry there
that no node ever sees.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from registry.errors import RegistryError

DATABASE = "registry.sqlite3"
STATES = (Path("var/stack/stack.json"), Path("var/stack/sites/stack.json"))


class NoRegistry(RegistryError):
    """The home names a folder without a registry database, and nothing asked to create one."""

    exit_code = 2


@dataclass(frozen=True)
class Home:
    path: Path  # absolute
    origin: str  # how it was chosen: "--home", "REGISTRY_HOME", "the default ./var/registry"
    stack: Path | None = None  # the stack.json of the running stack whose registry it is

    def describe(self) -> str:
        """``registry home: /abs (REGISTRY_HOME; the running stack's, var/stack/stack.json)``."""
        how = self.origin
        if self.stack is not None:
            how = f"{how}; the running stack's, {self.stack}" if how else \
                f"the running stack's, {self.stack}"
        return f"registry home: {self.path} ({how})"

    def require(self) -> None:
        if not (self.path / DATABASE).is_file():
            raise NoRegistry(
                f"{self.path} (from {self.origin or 'the running stack'}) is not a registry: "
                f"no {DATABASE} there; point at the stack's (REGISTRY_HOME=/path/to/clone/var/"
                f"registry, or run from the clone root) or create one (`registry init`)")


def locate(configured: Path, flag: bool, given: bool, cwd: Path | None = None) -> Home:
    """The home a command uses: ``configured`` (the settings' home) when ``given`` (by
    ``flag``, else by ``REGISTRY_HOME``), else a running stack's found from ``cwd`` up, else
    ``configured``."""
    cwd = cwd or Path.cwd()
    path = Path(os.path.abspath(cwd / configured))  # as the settings make it: symlinks kept
    if flag or given:
        return Home(path, "--home" if flag else "REGISTRY_HOME", _stack_of(path.resolve()))
    found = _running_stack(cwd)
    if found is not None:
        return Home(found[0], "", found[1])
    return Home(path, "the default ./var/registry")


def _running_stack(start: Path) -> tuple[Path, Path] | None:
    """The registry home and state file of a running stack of the clone holding ``start``:
    looked for from ``start`` up to the clone root (the first folder with ``.git``)."""
    for folder in (start, *start.parents):
        for state in STATES:
            home = _alive_home(folder, state)
            if home is not None:
                return home, folder / state
        if (folder / ".git").exists():
            return None
    return None


def _stack_of(home: Path) -> Path | None:
    """The state file of the running stack whose registry ``home`` is, if any (looked for in
    the folders above ``home``: ``<clone>/var/registry`` belongs to ``<clone>``)."""
    for folder in home.parents:
        for state in STATES:
            if _alive_home(folder, state) == home:
                return folder / state
        if (folder / ".git").exists():
            return None
    return None


def _alive_home(root: Path, state: Path) -> Path | None:
    """The registry home the state file ``root/state`` names, while that stack's registry
    runs."""
    try:
        data = json.loads((root / state).read_text())
        home = root / data["registry_home"]
        pids = [int(c["pid"]) for c in data.get("children", {}).values()
                if c.get("role") == "registry"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return home.resolve() if any(_alive(pid) for pid in pids) else None


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True
