"""What a node downloads for a new version that changes little: chunked releases against whole
files and zstd alone, on the demo's quick release and five real kinds of change.

A real ``registry serve``, and for each change a real edge and center whose stores hold exactly
the base version (``registry pull``); the change is published (chunked: the default) and both
nodes install it over gRPC. Measured there: the compressed bytes each node received (its
``*_sync_bytes_received_total``) and the registry sent. Computed from the same two manifests and
blobs: what a whole-file node would have fetched (every file of its tier whose sha256 it does
not hold; files it holds are copied locally, as before chunks), and that again compressed whole
with zstd (level 3, what a registry that only compressed would send). The time on a 2 Mbit/s
link is the bytes at 2 Mbit/s (computed, not measured: ``make sites-test`` measures a shaped
link).

    python -m bench.delta [--markdown docs/bench/delta.md] [--json PATH]

The changes, each published on top of the base (the quick demo release: MiniLM's 6 layers +
a logistic head at the center, its first layer + a head at the edge, INT8 after publish):

- identical: the base folder published again;
- recalibrated: the same models, the calibration rows in another order (new threshold, probe);
- tokenizer: the same models, ``tokenizer.json`` with its normalizer's ``strip_accents`` made
  explicit (the uncased MiniLM strips accents anyway: the same tokens, other bytes);
- head only: both heads refitted on 2,000 of the 3,000 training rows (the encoder untouched);
- edge retrained: every edge weight moved (noise of 1% of each tensor's spread), as a retrain
  of the edge moves them all; the center the same.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import httpx
import torch
import zstandard
from rich.console import Console
from rich.table import Table

from bench.kit import ROOT, machine_line
from bench.markdown import Shown
from examples.sentiment.quick import QuickConfig, build_quick
from examples.sentiment.release import EDGE, TOKENIZER
from examples.sentiment.variants import recalibrated
from harness.metrics import metric
from harness.processes import RegistryProcess, TierProcess, start_registry, start_tier
from serving.model import torchscript
from serving.release import chunks
from tiered.commands import BIN

MODEL = "demo"
TOKEN = "bench-delta-token-0123456789"
LINK_MBIT_S = 2.0
GOAL_SMALL, GOAL_MOST = 0.05, 1.01  # changes that leave the encoder alone; any change
TIERS = ("edge", "center")
console = Console(highlight=False)


@dataclass
class Row:
    change: str
    tier: str
    full: int  # the tier's files of the new version
    received: int  # by chunks, measured at the node
    whole: int  # the files of the tier it did not hold, whole
    zstd: int  # those files, each compressed whole
    encoder_alone: bool

    @property
    def share(self) -> float:
        return self.received / self.full

    def link_s(self, nbytes: int) -> float:
        return nbytes * 8 / (LINK_MBIT_S * 1e6)

    def missed(self) -> str:
        goal = GOAL_SMALL if self.encoder_alone else GOAL_MOST
        return "" if self.share <= goal else f"over {goal:.0%}"


class Cli:
    def __init__(self, home: Path) -> None:
        self.home = home

    def __call__(self, *args: str | Path) -> str:
        done = subprocess.run([str(BIN / "registry"), *map(str, args)], capture_output=True,
                              text=True, timeout=600,
                              env={"PATH": str(BIN), "REGISTRY_HOME": str(self.home),
                                   "HOME": str(self.home), "REGISTRY_ACTOR": "bench@delta"})
        if done.returncode != 0:
            raise RuntimeError(f"registry {args} exited {done.returncode}: {done.stderr[-2000:]}")
        return done.stdout

    def manifest(self, version: int) -> dict[str, Any]:
        return dict(json.loads(self("show", f"{MODEL}@{version}", "--json"))["manifest"])


def variants(root: Path) -> dict[str, tuple[Path, bool]]:
    """Change -> (release folder, whether the encoder's weights are untouched)."""
    base = build_quick(root / "base")
    head = build_quick(root / "head", QuickConfig(train_rows=2000))
    tokenizer = _copy(base, root / "tokenizer")
    text = (tokenizer / TOKENIZER).read_text(encoding="utf-8")  # edited in place, as a
    edited = text.replace('"strip_accents":null', '"strip_accents":true', 1)  # person would
    if edited == text:
        raise RuntimeError(f"{tokenizer / TOKENIZER} has no strip_accents null to change")
    (tokenizer / TOKENIZER).write_text(edited, encoding="utf-8")
    retrained = _copy(base, root / "edge-retrained")
    module = torchscript.load(retrained / EDGE)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tensor in module.parameters():
            spread = float(tensor.std()) if tensor.numel() > 1 else 0.0
            tensor.add_(torch.randn(tensor.shape, generator=generator) * 0.01 * spread)
    torchscript.save(module, retrained / EDGE)
    return {"identical": (base, True),
            "recalibrated": (recalibrated(base, root / "recalibrated", shift=100), True),
            "tokenizer": (tokenizer, True), "head only": (head, True),
            "edge retrained": (retrained, False)}


def _copy(source: Path, out: Path) -> Path:
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(source, out)
    return out


def tier_files(manifest: dict[str, Any], tier: str) -> list[dict[str, Any]]:
    return [manifest[role] for role in (tier, "tokenizer", "probe") if manifest.get(role)]


def zstd_size(path: Path) -> int:
    return len(zstandard.ZstdCompressor(level=chunks.ZSTD_LEVEL).compress(path.read_bytes()))


def serves(url: str) -> int | None:
    try:
        r = httpx.get(f"{url}/v2/models/{MODEL}/ready", timeout=5)
    except httpx.HTTPError:
        return None
    return int(r.json()["version"]) if r.status_code == 200 else None


def wait(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.1)


def measure(root: Path) -> list[Row]:
    releases = variants(root / "releases")
    cli = Cli(root / "registry")
    shutil.rmtree(cli.home, ignore_errors=True)
    cli("publish", releases["identical"][0], "--name", MODEL, "--create")  # version 1, the base
    registry: RegistryProcess = start_registry(cli.home, root, TOKEN)
    rows: list[Row] = []
    try:
        for version, (change, (folder, alone)) in enumerate(releases.items(), start=2):
            console.print(f"[dim]{change}: holding version 1, publishing version {version}[/]")
            nodes: dict[str, TierProcess] = {}
            try:
                for tier in TIERS:
                    store = root / "stores" / change.replace(" ", "-") / tier
                    shutil.rmtree(store, ignore_errors=True)
                    cli("pull", f"{MODEL}@1", "--tier", tier, "--store", store)
                    nodes[tier] = start_tier(tier, store, root, "--registry", registry.target,
                                             "--sync-backoff-max-s", "1",
                                             env={"PATH": str(BIN), "HOME": str(root)},
                                             registry_secret=TOKEN)
                before = {t: metric(f"{n.url}/metrics", f"{t}_sync_bytes_received_total")
                          for t, n in nodes.items()}
                cli("publish", folder, "--name", MODEL)
                for tier, node in nodes.items():
                    wait(lambda n=node, v=version: serves(n.url) == v, 300,
                         f"the {tier} on version {version}")
                old, new = cli.manifest(1), cli.manifest(version)
                for tier, node in nodes.items():
                    held = {a["sha256"] for a in tier_files(old, tier)}
                    fresh = [a for a in tier_files(new, tier) if a["sha256"] not in held]
                    blobs = cli.home / "blobs" / "sha256"
                    received = metric(f"{node.url}/metrics", f"{tier}_sync_bytes_received_total")
                    rows.append(Row(change, tier, sum(a["size"] for a in tier_files(new, tier)),
                                    int(received - before[tier]),
                                    sum(a["size"] for a in fresh),
                                    sum(zstd_size(blobs / a["sha256"][:2] / a["sha256"])
                                        for a in fresh), alone))
            finally:
                for node in nodes.values():
                    node.stop()
            cli("promote", MODEL, "--version", "1")  # the next change starts from the base
    finally:
        registry.stop()
    return rows


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**20 else f"{nbytes / 1024:.1f} KiB"


def table(rows: list[Row]) -> Table:
    out = Table(title=f"Bytes a node downloads for a new version it holds the base of "
                      f"(time at {LINK_MBIT_S:g} Mbit/s, computed)")
    for header in ("change", "tier", "release", "by chunks", "% of release",
                   f"at {LINK_MBIT_S:g} Mbit/s", "whole files", "zstd alone", "goal"):
        out.add_column(header, justify="left" if header in ("change", "tier", "goal")
                       else "right")
    for r in rows:
        out.add_row(r.change, r.tier, mib(r.full), mib(r.received), f"{r.share:.1%}",
                    f"{r.link_s(r.received):.1f} s", f"{mib(r.whole)} ({r.whole / r.full:.0%})",
                    mib(r.zstd), r.missed() or "met")
    out.caption = (f"Goal: at most {GOAL_SMALL:.0%} of the release for every change that leaves "
                   f"the encoder's weights alone, never over {GOAL_MOST:.0%}. 'whole files': "
                   f"the files of the tier the node did not hold, as before chunks; 'zstd "
                   f"alone': those compressed whole.")
    return out


@click.command()
@click.option("--root", type=click.Path(path_type=Path), default=ROOT / "var" / "bench" / "delta")
@click.option("--markdown", type=click.Path(path_type=Path), default=None)
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
def main(root: Path, markdown: Path | None, json_path: Path | None) -> None:
    """Bytes per node for small changes: chunked releases, whole files, zstd alone."""
    started = time.monotonic()
    rows = measure(root)
    shown = Shown(console)
    shown(f"Gathered on {machine_line()}; {time.monotonic() - started:.0f} s in all.")
    shown(table(rows))
    if markdown:
        shown.write(markdown, "Chunked releases: bytes per change (`python -m bench.delta`)")
    if json_path:
        json_path.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")


if __name__ == "__main__":
    main()
