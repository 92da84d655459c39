"""What the TUF release metadata costs: bytes per release and per node at rest, and the time a
node takes to verify a push, as the number of releases grows.

A registry database and a node's TUF client (python-tuf's Updater, as the node runs it) in one
process, no network: what is measured is the metadata and its verification, not the stream.
Releases are published through the catalog as ``registry publish`` records them (a manifest
with four artifacts: center, edge, tokenizer, probe), each followed by the registry's
re-signing (``registry serve``'s step) and the push to the node. Per size of the targets
metadata (releases listed) it times, as medians of several pushes:

- a timestamp-only push (the re-signing every third of the expiry, nothing released);
- a push after a publish (timestamp, snapshot and targets: the node verifies all three);
- a root rotation (the new root checked against the old root's keys and its own).

    python -m bench.tuf [--markdown docs/bench/tuf.md] [--releases 10,100,1000]
"""

from __future__ import annotations

import hashlib
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from rich.console import Console
from rich.table import Table

from bench.kit import machine_line
from bench.markdown import Shown
from registry.releases.catalog import Catalog
from registry.store.db import connect, transaction
from registry.trust import tuf
from registry.trust.keys import Signer
from serving.release.manifest import (
    Artifact,
    Calibration,
    Fidelity,
    Manifest,
    Preprocessing,
    TensorSpec,
)
from serving.release.signing import Verifier
from serving.release.trust import NodeTrust

REPEATS = 7  # pushes timed per figure (median)


def manifest(name: str, n: int) -> Manifest:
    def artifact(role: str, fmt: str, size: int) -> Artifact:
        digest = hashlib.sha256(f"{name}/{n}/{role}".encode()).hexdigest()
        return Artifact(f"{role}-{digest[:12]}.{fmt}", digest, size, fmt)  # type: ignore[arg-type]

    return Manifest(name=name, version=0, labels=["negative", "positive"],
                    inputs=[TensorSpec("input_ids", "INT64", [-1, -1]),
                            TensorSpec("attention_mask", "INT64", [-1, -1])],
                    outputs=[TensorSpec("logits", "FP32", [-1, 2])],
                    preprocessing=Preprocessing(None, 128),
                    center=artifact("center", "pt", 90_000_000),
                    edge=artifact("edge", "onnx", 6_000_000),
                    tokenizer=artifact("tokenizer", "json", 466_000),
                    calibration=Calibration("labelled", 0.71),
                    fidelity=Fidelity(0.99, 200, 0.97, "calibration"), publisher="bench",
                    published_at="2026-12-05T00:00:00Z", source_sha256=str(n),
                    probe=artifact("probe", "json", 40_000))


class Bench:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.key = Signer(Ed25519PrivateKey.generate())
        self.catalog = Catalog(connect(folder / "registry.sqlite3"), "bench")
        tuf.ensure(self.catalog.db, self.key, self.key.key.public_key())
        self.node = NodeTrust(folder / "store", Verifier(self.key.key.public_key()))
        self.published = 0
        self.at = datetime.now(UTC)

    def advance(self) -> None:
        self.at += timedelta(seconds=1300)  # past a third of the hour: a new timestamp
        tuf.advance(self.catalog.db, self.key, 3600, self.at)

    def push(self) -> float:
        """Push what the registry holds now; the node's verify time in seconds."""
        p = tuf.published(self.catalog.db)
        assert p is not None
        started = time.perf_counter()
        self.node.update(p.roots_after(self.node.state().root_version), p.timestamp,
                         p.snapshot, p.targets)
        return time.perf_counter() - started

    def publish(self, count: int) -> None:
        for _ in range(count):
            self.published += 1
            self.catalog.create_version(manifest(f"model-{self.published % 20}",
                                                 self.published), signer=self.key)

    def sizes(self) -> dict[str, int]:
        p = tuf.published(self.catalog.db)
        assert p is not None
        return {"root": len(p.roots[-1][1]), "targets": len(p.targets),
                "snapshot": len(p.snapshot), "timestamp": len(p.timestamp)}

    def at_rest(self) -> int:
        return sum(f.stat().st_size for f in (self.folder / "store" / ".tuf").rglob("*")
                   if f.is_file() and not f.is_symlink())


def measure(sizes: list[int]) -> list[dict[str, float]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-tuf-") as tmp:
        bench = Bench(Path(tmp))
        bench.advance()
        bench.push()
        for size in sizes:
            bench.publish(size - bench.published - REPEATS)
            release_s = []
            for _ in range(REPEATS):  # the last REPEATS releases, one push each
                bench.publish(1)
                bench.advance()
                release_s.append(bench.push())
            stamp_s = []
            for _ in range(REPEATS):
                bench.advance()
                stamp_s.append(bench.push())
            at_rest = bench.at_rest()
            rotate_s = []
            for _ in range(3):
                new = Signer(Ed25519PrivateKey.generate())
                with transaction(bench.catalog.db) as conn:
                    tuf.rotate(conn, "root", [new.key.public_key()], 1, [bench.key, new])
                    tuf.rotate(conn, "root", [bench.key.key.public_key()], 1, [new, bench.key])
                bench.advance()
                rotate_s.append(bench.push())
            shown = bench.sizes()
            rows.append({"releases": bench.published, **{f"{k}_bytes": v for k, v in
                                                         shown.items()},
                         "per_release_bytes": shown["targets"] / bench.published,
                         "at_rest_bytes": at_rest,
                         "timestamp_push_ms": statistics.median(stamp_s) * 1000,
                         "release_push_ms": statistics.median(release_s) * 1000,
                         "rotation_push_ms": statistics.median(rotate_s) * 1000})
        shutil.rmtree(Path(tmp) / "store", ignore_errors=True)
    return rows


@click.command()
@click.option("--markdown", type=click.Path(path_type=Path), default=None)
@click.option("--releases", default="10,100,1000", show_default=True,
              help="Sizes of the targets metadata (releases listed) to measure at.")
def main(markdown: Path | None, releases: str) -> None:
    sizes = sorted(int(n) for n in releases.split(","))
    if sizes[0] <= REPEATS:
        raise click.UsageError(f"each size must be above {REPEATS}")
    console = Console()
    started = time.monotonic()
    rows = measure(sizes)
    shown = Shown(console)
    table = Table(title="TUF metadata: bytes and a node's verify time per push (median of "
                        f"{REPEATS})")
    for column in ("releases listed", "targets", "per release", "snapshot", "timestamp", "root",
                   "node at rest", "timestamp push", "release push", "root rotation push"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(f"{r['releases']:.0f}", f"{r['targets_bytes'] / 1024:.1f} KiB",
                      f"{r['per_release_bytes']:.0f} B", f"{r['snapshot_bytes']:.0f} B",
                      f"{r['timestamp_bytes']:.0f} B", f"{r['root_bytes']:.0f} B",
                      f"{r['at_rest_bytes'] / 1024:.1f} KiB",
                      f"{r['timestamp_push_ms']:.1f} ms", f"{r['release_push_ms']:.1f} ms",
                      f"{r['rotation_push_ms']:.1f} ms")
    shown(table)
    shown("Per release: the targets metadata grows by one manifest and four artifacts (path, "
          "length, sha256). A timestamp push carries only the timestamp (the node holds the "
          "snapshot and targets it names); a release push carries timestamp, snapshot and "
          "targets, and its verify time grows with the targets (parsed and its signature "
          "checked whole). At rest (measured before the rotations): root, timestamp, snapshot "
          "and targets, once each.")
    shown(f"Gathered on {machine_line()}; {time.monotonic() - started:.0f} s in all.")
    if markdown:
        shown.write(markdown, "TUF release metadata: bytes and verify time (`python -m "
                              "bench.tuf`)")


if __name__ == "__main__":
    main()
