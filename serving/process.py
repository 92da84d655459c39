"""One tier process, read top to bottom: start (the data plane serves what the store holds,
then the node joins the fleet), serve (the transports), drain and stop (the node leaves the
fleet first, then the data plane drains its batchers)."""

from __future__ import annotations

from dataclasses import dataclass

from serving.dataplane import DataPlane
from serving.node import Node


@dataclass
class Process:
    plane: DataPlane
    node: Node

    async def start(self) -> None:
        await self.plane.start()
        await self.node.start()

    async def stop(self) -> None:
        await self.node.stop()
        await self.plane.stop()
