"""Every model of the fleet as ``tiered status`` shows it, read live from the registry's
database: what each node reports running (``registry status``'s rows: model, version, state),
what the registry's rollout plan wants each node to run, and every model its catalog knows.
Nothing is filtered to the demo's models: a model published into the running fleet shows on
every node as soon as the nodes report it, and one taken off the nodes stops showing."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.fleet.nodes import NodeBook
from registry.releases.catalog import Catalog
from registry.releases.plan import Plan, RolloutNode
from registry.store.db import connect
from tiered.views import registry_database


@dataclass(frozen=True)
class FleetModels:
    rollout: dict[tuple[str, str], dict[str, Any]]  # (node id, model) -> its status row
    plan: Plan
    catalog: list[str]  # the models the registry holds, by name

    @property
    def known(self) -> list[str]:
        """Every model the registry holds or a node reports."""
        return sorted(set(self.catalog) | {m for _, m in self.rollout})

    def desired(self, node: str, tier: str, region: str) -> dict[str, int]:
        """Model -> the version the registry wants ``node`` to run."""
        return {t.model: t.version for t in self.plan.desired(RolloutNode(node, tier, region))}

    def unknown(self, names: Iterable[str]) -> list[str]:
        return [n for n in names if n not in self.known]


def read(home: Path) -> FleetModels:
    catalog = Catalog(connect(registry_database(home)), "tiered")
    rows = NodeBook(catalog.db).status(catalog)
    # a model a node unloaded on ``registry retire`` (state RETIRED) is no longer on it
    return FleetModels({(r["node"], r["model"]): r for r in rows if r["state"] != "RETIRED"},
                       catalog.plan(),
                       [m["name"] for m in catalog.models()])


def names(values: Iterable[str]) -> list[str]:
    """``--model a --model b,c`` -> ``[a, b, c]`` (in order, once each)."""
    found: list[str] = []
    for value in values:
        for name in (n.strip() for n in value.split(",")):
            if name and name not in found:
                found.append(name)
    return found
