"""One tier process, read top to bottom: start (the data plane serves what the store holds,
the other transports open, then the node joins the fleet), serve (the transports), drain and
stop (the node leaves the fleet first, the transports finish their calls, then the data plane
drains its batchers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from serving.dataplane import DataPlane
from serving.fleet.node import Node


class Transport(Protocol):
    """A transport besides HTTP (which serves the process itself): gRPC."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass
class Process:
    plane: DataPlane
    node: Node
    transports: list[Transport] = field(default_factory=list)

    async def start(self) -> None:
        await self.plane.start()
        for transport in self.transports:
            await transport.start()
        await self.node.start()

    async def stop(self) -> None:
        await self.node.stop()
        for transport in self.transports:
            await transport.stop()
        await self.plane.stop()
