"""The ``edge`` command: the only place that wires an edge process."""

from __future__ import annotations

from edge.build import build_service
from edge.settings import EdgeSettings
from serving.cli import tier_command
from serving.dataplane import DataPlane
from serving.fleet.node import Node
from serving.process import Process
from sync.node.subscriber import subscribe


def wire(settings: EdgeSettings) -> Process:
    service = build_service(settings)
    node = Node(settings, service.repository, service.watches())
    subscribe(node, service.metrics, service.policy.set_budget)
    return Process(DataPlane.of(service), node)


cli = tier_command("edge", EdgeSettings, wire)


def main() -> None:
    cli(prog_name="edge")
