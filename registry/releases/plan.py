"""What each node should run: per model, production, a canary for the nodes it targets, or the
version of a wave rollout for the edges it admitted; read once for every node of the fleet."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from registry.releases import waves
from registry.releases.names import CANARY, PRODUCTION
from registry.releases.reads import CatalogReads
from serving.release.signing import decode_signature


@dataclass(frozen=True)
class RolloutNode:
    """A subscriber as rollouts see it: canary targets name node ids, ``region:R`` or ``tier:T``."""

    node_id: str
    tier: str
    region: str

    def matches(self, targets: list[str]) -> bool:
        wanted = {"*", self.node_id, f"region:{self.region}", f"tier:{self.tier}"}
        return any(target in wanted for target in targets)


@dataclass(frozen=True)
class Target:
    """The release a node should run for one model: the stored manifest, byte for byte."""

    model: str
    version: int
    alias: str
    manifest: bytes
    manifest_sha256: str
    signature: bytes = b""  # Ed25519 over ``manifest``; empty: published unsigned
    key_id: str = ""


@dataclass(frozen=True)
class ModelPlan:
    """Who runs what of one model: production, a canary for named targets, a wave rollout for
    the edges whose position is under its cutoff (``registry.releases.waves``)."""

    model: str
    production: Target | None
    canary: Target | None = None
    canary_targets: list[str] = field(default_factory=list)
    wave: Target | None = None
    cutoff: float = 0.0

    def desired(self, node: RolloutNode) -> Target | None:
        if self.canary is not None and node.matches(self.canary_targets):
            return self.canary
        if self.wave is not None:
            if node.tier == "edge" and waves.admitted(self.model, node.node_id, self.cutoff):
                return self.wave
            if node.tier != "edge" and self.production is None:
                return self.wave  # a first release: the centers have nothing to judge it by
        return self.production


@dataclass(frozen=True)
class Plan:
    """Every model's ``ModelPlan``, read once: what each of many nodes should run; and the
    retired models, which no node should run (model -> its newest version)."""

    models: list[ModelPlan]
    retired: dict[str, int] = field(default_factory=dict)

    def desired(self, node: RolloutNode) -> list[Target]:
        return [t for m in self.models if (t := m.desired(node)) is not None]


def read_plan(catalog: CatalogReads) -> Plan:
    """What every node should run, per model; a retired model is no node's to run."""
    models = [row["name"] for row in catalog.db.query(
        "SELECT name FROM models WHERE name NOT IN (SELECT model FROM retirements)")]
    retired = {row[0]: int(row[1]) for row in catalog.db.execute(
        "SELECT r.model, MAX(v.version) FROM retirements r JOIN versions v ON v.model = "
        "r.model GROUP BY r.model")}
    return Plan([_model_plan(catalog, model) for model in models], retired)


def _model_plan(catalog: CatalogReads, model: str) -> ModelPlan:
    plan = ModelPlan(model, _target(catalog, model, catalog.alias(model, PRODUCTION), PRODUCTION))
    canary = catalog.alias(model, CANARY)
    if canary is not None:
        plan = ModelPlan(model, plan.production, _target(catalog, model, canary, CANARY),
                         _canary_targets(catalog, model, canary))
    rollout = waves.latest(catalog.db.conn, model)
    if rollout is not None and rollout.state in waves.ACTIVE:
        plan = ModelPlan(model, plan.production, plan.canary, plan.canary_targets,
                         _target(catalog, model, rollout.version, waves.ALIAS), rollout.cutoff)
    return plan


def _target(catalog: CatalogReads, model: str, version: int | None,
            alias: str) -> Target | None:
    if version is None:
        return None
    row = catalog.db.execute(
        "SELECT v.manifest, v.manifest_sha256, s.signature, s.key_id FROM versions v "
        "LEFT JOIN signatures s ON s.model = v.model AND s.version = v.version "
        "WHERE v.model = ? AND v.version = ?", [model, version]).fetchone()
    signature = decode_signature(row[2]) if row[2] else b""
    return Target(model, version, alias, row[0].encode(), row[1], signature, row[3] or "")


def _canary_targets(catalog: CatalogReads, model: str, version: int) -> list[str]:
    row = catalog.db.execute("SELECT targets FROM rollouts WHERE model = ? AND alias = ? AND "
                             "version = ? ORDER BY id DESC LIMIT 1",
                             [model, CANARY, version]).fetchone()
    return list(json.loads(row[0])) if row else []
