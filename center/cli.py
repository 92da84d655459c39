"""The ``center`` command: the only place that wires a center process."""

from __future__ import annotations

from center.build import build_service
from center.settings import CenterSettings
from serving.cli import tier_command
from serving.dataplane import DataPlane
from serving.fleet.node import Node
from serving.process import Process
from sync.node.subscriber import subscribe


def wire(settings: CenterSettings) -> Process:
    service = build_service(settings)
    node = Node(settings, service.repository, service.watches())
    subscribe(node, service.metrics)
    return Process(DataPlane.of(service), node)


cli = tier_command("center", CenterSettings, wire)


def main() -> None:
    cli(prog_name="center")
