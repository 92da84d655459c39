"""A registry that looks like a running fleet, written with the registry's own code (no server):
what the fleet console's tests, its browser test and its benchmark read. Twenty edges and a
center took part in a wave rollout of version 2 that halted at its first gate (live audit
agreement 0.55 against 0.90); ``edge-03`` then disconnected; ``edge-07`` failed an install
with the reason the caller gives, ``edge-12`` refused one (a bad signature); any further
nodes (up to ``size``) said hello running version 1 and reported on it, over three regions."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from registry.fleet import nodes as node_writes
from registry.fleet.nodes import Held, NodeBook
from registry.releases import steering, waves
from registry.releases.catalog import Catalog
from registry.releases.plan import RolloutNode
from registry.settings import RegistrySettings
from registry.store.db import connect
from registry.trust.anchor import audited
from serving.release.manifest import (
    Artifact,
    Calibration,
    Fidelity,
    Manifest,
    Preprocessing,
    TensorSpec,
)

MODEL = "sentiment"
REGIONS = ("eu", "us", "ap")
EDGES = [RolloutNode(f"edge-{i:02d}", "edge", REGIONS[i % 2]) for i in range(20)]
CENTER = RolloutNode("center-1", "center", "eu")
DOWN = "edge-03"
FAILED = "edge-07"
REFUSED = "edge-12"
HALTING = waves.WavePolicy((0.15, 0.5, 1.0), bake_s=10, min_audit_rows=100)


def manifest(name: str = MODEL, seed: int = 0, publisher: str = "harness") -> Manifest:
    """A small release's manifest (artifacts named by ``seed``), for the registry's own code."""
    def artifact(file: str, fmt: str) -> Artifact:
        return Artifact(file, f"{seed:02d}{fmt[:2]}".ljust(64, "0"), 10, fmt)  # type: ignore[arg-type]

    return Manifest(name=name, version=0, labels=["neg", "pos"],
                    inputs=[TensorSpec("input_ids", "INT64", [-1, -1])],
                    outputs=[TensorSpec("logits", "FP32", [-1, 2])],
                    preprocessing=Preprocessing(None, 32), center=artifact("c.pt", "torchscript"),
                    edge=artifact("e.onnx", "onnx"), tokenizer=None,
                    calibration=Calibration("default", 0.7),
                    fidelity=Fidelity(1.0, 1, 0.97, "generated"), publisher=publisher,
                    published_at="now", source_sha256=str(seed))


def report(version: int, agreement: float, rows: int = 300, shed: float = 0.0) -> dict[str, Any]:
    """A node's quality report as ``serving.telemetry.quality`` and the cascade send it."""
    return {"model": MODEL, "version": version, "requests": rows, "rows": rows,
            "audit_rows": rows, "audit_agreement": agreement, "p99_ms": 20.0, "drift": False,
            "confidence_drift": False, "escalation_rate": 0.12, "shed_rate": shed,
            "degraded_rate": 0.0, "budget_rows_s": 4.0, "estimated_accuracy": agreement - 0.02,
            "input_shift": 0.4}


def build(home: Path, size: int = 21, failed_reason: str = "bad artifact") -> Catalog:
    """The fleet in the registry at ``home`` (made), ``size`` nodes in all (at least 21)."""
    home.mkdir(parents=True, exist_ok=True)
    catalog = Catalog(connect(RegistrySettings.model_construct(home=home).database), "harness")
    book = NodeBook(catalog.db)
    catalog.create_version(manifest(seed=1))
    book.write([node_writes.hello(n, "peer", []) for n in EDGES])
    book.write([node_writes.hello(CENTER, "peer", [Held(MODEL, [1], 1)])])
    new = catalog.create_version(manifest(seed=2), rollout=HALTING)
    at = time.time()
    for _ in range(10):
        at += 6
        with audited(catalog.db, None) as conn:
            steering.tick(conn, at, "registry:waves")
        _settle(catalog, book, new)
    edge = {n.node_id: n for n in EDGES}
    book.write([node_writes.ack(edge[FAILED], MODEL, new, "FAILED", failed_reason),
                node_writes.ack(edge[REFUSED], MODEL, new, "REFUSED", "bad signature"),
                node_writes.goodbye(DOWN)])
    _more(book, size - len(EDGES) - 1)
    return catalog


def _settle(catalog: Catalog, book: NodeBook, new: int) -> None:
    """Every edge acks what it is desired to run and reports on it: the new version worse."""
    for node in EDGES:
        want = next((t.version for t in catalog.desired(node) if t.model == MODEL), None)
        if want is not None:
            book.write([node_writes.ack(node, MODEL, want, "ACTIVE", ""),
                        node_writes.quality(node.node_id, MODEL,
                                            report(want, 0.55 if want == new else 0.9))])


def _more(book: NodeBook, count: int) -> None:
    """``count`` more edges running version 1, in batches of one transaction each."""
    batch: list[node_writes.Write] = []
    for i in range(count):
        node = RolloutNode(f"sim-{i:05d}", "edge", REGIONS[i % len(REGIONS)])
        batch += [node_writes.hello(node, "peer", [Held(MODEL, [1], 1)]),
                  node_writes.quality(node.node_id, MODEL,
                                      report(1, 0.9, shed=0.01 if i % 10 == 0 else 0.0))]
        if len(batch) >= 2000:
            book.write(batch)
            batch = []
    book.write(batch)
