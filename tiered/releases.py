"""Which demo release ``tiered up`` starts on, and the full one it trains behind it.

Serve first, train behind: on a machine without the full demo release, ``tiered up`` builds and
publishes the quick release (``examples.sentiment.quick``: pretrained MiniLM, logistic heads,
under a minute), starts the fleet on it, and trains the full release
(``examples.sentiment.build``, ~12 minutes on 2 cores) in a child process at the lowest CPU
priority. When that is done it is published like any release and the running fleet rolls it
out: the registry pushes it, every node verifies, probes and swaps it in without dropping a
request. A machine whose full release is already built starts on it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from tiered.children import JOB
from tiered.commands import BIN, registry_cli
from tiered.settings import TieredSettings
from tiered.stack import Stack

if TYPE_CHECKING:  # the registry is imported only when a release is chosen (tiered starts fast)
    from registry.releases.catalog import Catalog

QUICK, FULL = "quick", "full"
ROLLOUT_TIMEOUT_S = 600.0


class Start(Enum):
    FULL = "full"  # the full release is built: publish it (once) and serve it
    QUICK = "quick"  # nothing published: publish the quick release, train the full one behind
    PUBLISHED = "published"  # the registry's production release, whatever it is


@dataclass(frozen=True)
class Choice:
    start: Start
    train_behind: bool


@contextmanager
def opened(home: Path) -> Iterator[Catalog]:
    """The registry at ``home``, read by the launcher (closed after)."""
    from registry.releases.catalog import Catalog
    from registry.store.db import connect
    from tiered.views import registry_database

    catalog = Catalog(connect(registry_database(home)), "tiered")
    try:
        yield catalog
    finally:
        catalog.db.conn.close()


def choose(s: TieredSettings) -> Choice:
    """What to start on: the full release when it is built; else what is published (training
    the full one behind only when that is the quick release); else the quick release."""
    from examples.sentiment import build

    if build.is_trained(s.release):
        return Choice(Start.FULL, False)
    production = production_source(s.registry_home, s.model)
    if production is None:
        return Choice(Start.QUICK, s.train_behind)
    return Choice(Start.PUBLISHED, s.train_behind and production == source_digest(s.quick_release))


def production_source(home: Path, model: str) -> str | None:
    """The source digest of ``model``'s production release in the registry at ``home``."""
    from registry.errors import NotFound

    with opened(home) as catalog:
        try:
            if not any(m["name"] == model and m["production"] for m in catalog.models()):
                return None
            return catalog.resolve(model).manifest.source_sha256
        except NotFound:
            return None


def source_digest(folder: Path) -> str | None:
    """What ``registry publish`` records as a release folder's source digest (None: no such
    release folder)."""
    from registry.errors import InvalidRelease
    from registry.publish.source import load_source

    try:
        return load_source(folder).digest if (folder / "tiered.json").is_file() else None
    except InvalidRelease:
        return None


def kinds(s: TieredSettings, versions: list[int]) -> dict[int, str]:
    """``quick`` or ``full`` for each of ``model``'s versions published from the demo's
    folders (others are left out)."""
    from registry.errors import NotFound

    folders = {d: k for k, d in ((QUICK, source_digest(s.quick_release)),
                                 (FULL, source_digest(s.release))) if d}
    found: dict[int, str] = {}
    with opened(s.registry_home) as catalog:
        for version in versions:
            try:
                digest = catalog.resolve(s.model, str(version)).manifest.source_sha256
            except NotFound:
                continue
            if digest in folders:
                found[version] = folders[digest]
    return found


QUICK_BUILDER = "examples.sentiment.quick"


def build_argv(module: str, out: Path) -> list[str]:
    """``python -m MODULE --out OUT``: a release builder (``QUICK_BUILDER``, ``s.trainer``)."""
    return [str(BIN / "python"), "-m", module, "--out", str(out)]


def publish_argv(s: TieredSettings, folder: Path, model: str | None = None) -> list[str]:
    return registry_cli(s.registry_home, "publish", str(folder), "--name", model or s.model,
                        "--skip-existing", "--create")  # the stack's home, made on purpose


@dataclass(frozen=True)
class BehindRelease:
    """A release ``Behind`` builds and publishes: ``model`` from the folder ``release``."""

    model: str
    release: Path
    what: str  # how notes name it: "full release", "digits release"


def full(s: TieredSettings) -> BehindRelease:
    """The demo's full text release (``s.trainer`` into ``s.release``)."""
    return BehindRelease(s.model, s.release, "full release")


def images(s: TieredSettings) -> BehindRelease:
    """The image demo (``examples.digits.build`` into ``s.image_release``)."""
    return BehindRelease(s.image_model, s.image_release, f"{s.image_model} release")


IMAGE_BUILDER = "examples.digits.build"


class Behind(threading.Thread):
    """Builds a release in a child process (``nice -n 19``): by default the full one trained
    behind the quick one, or the image demo served beside the text one; publishes it, then
    follows the rollout in the registry until every node of the stack runs it. Its children
    are the stack's (logged, echoed with a prefix, stopped by PID with the stack); its
    progress is in ``stack.json`` for ``tiered status``."""

    def __init__(self, stack: Stack, s: TieredSettings, build: list[str] | None = None,
                 publish_env: dict[str, str] | None = None,
                 target: BehindRelease | None = None) -> None:
        """``build``: the command that writes the release into ``target.release`` (default:
        ``s.trainer`` into ``s.release``), run at the lowest CPU priority; ``publish_env``:
        extra REGISTRY_* settings for its publish."""
        self.target = target or full(s)
        super().__init__(name=f"behind-{self.target.model}", daemon=True)
        self.stack, self.s = stack, s
        self.build = build or build_argv(s.trainer, s.release)
        self.publish_env = publish_env or {}

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # reported; the stack keeps serving
            self.note("failed", f"{type(exc).__name__}: {exc}")

    def _run(self) -> None:
        t = self.target
        prefix = "trainer" if t.model == self.s.model else f"{t.model}-builder"
        self.note("training", f"the {t.what}, at low priority (log: "
                              f"{self.stack.root / 'logs' / (prefix + '.log')})")
        build = self.stack.spawn(prefix, ["nice", "-n", "19", *self.build], role=JOB)
        if build.process.wait() != 0:
            if not self.stack.children.stopping.is_set():
                self.note("failed", f"training exited with status {build.process.returncode}")
            return
        self.note("publishing", f"the {t.what}")
        publish = self.stack.spawn(f"{prefix}-publisher" if prefix != "trainer" else
                                   "publisher", publish_argv(self.s, t.release, t.model),
                                   role=JOB, env=self.publish_env)
        if publish.process.wait() != 0:
            if not self.stack.children.stopping.is_set():
                self.note("failed", f"publish exited with status {publish.process.returncode}")
            return
        version = published_version(self.s, t)
        self.note("rolling out", f"version {version}, the {t.what}")
        started = time.monotonic()
        while not self.stack.children.stopping.wait(1.0):
            behind = self.lagging(version)
            if not behind:
                self.note("live", f"version {version}, the {t.what}, on every node in "
                                  f"{time.monotonic() - started:.0f} s")
                return
            if time.monotonic() - started > ROLLOUT_TIMEOUT_S:
                self.note("stalled", f"version {version} not active on {', '.join(behind)}")
                return

    def lagging(self, version: int) -> list[str]:
        """The stack's centers and edges not yet serving ``version``."""
        from registry.fleet.nodes import NodeBook

        with opened(self.s.registry_home) as catalog:
            active = {r["node"] for r in NodeBook(catalog.db).status(catalog)
                      if r["model"] == self.target.model and r["version"] == version
                      and r["state"] == "ACTIVE"}
        nodes = [c.name for c in self.stack.children.values() if c.role in ("center", "edge")]
        return [n for n in nodes if n not in active]

    def note(self, state: str, detail: str) -> None:
        if self.stack.children.stopping.is_set():
            return
        what = self.target.what
        self.stack.notes[what] = {"state": state, "detail": detail,
                                  "since": time.strftime("%H:%M:%S")}
        self.stack.save()
        if self.stack.echo is not None:
            self.stack.echo("tiered", f"{what}: {state}: {detail}")


def published_version(s: TieredSettings, target: BehindRelease | None = None) -> int:
    """The version a release folder (default: the full one) was published as (the newest from
    its source)."""
    t = target or full(s)
    digest = source_digest(t.release)
    with opened(s.registry_home) as catalog:
        rows = catalog.db.execute("SELECT MAX(version) FROM versions WHERE model = ? AND "
                                  "source_sha256 = ?", [t.model, digest]).fetchone()
    if not rows or rows[0] is None:
        raise RuntimeError(f"the registry has no {t.model} version from {t.release}")
    return int(rows[0])
