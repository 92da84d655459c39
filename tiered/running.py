"""A fleet while it runs: its children started through one seam (``spawn``), kept going, watched
until every service passes in Consul and every nginx entry routes, recorded in ``stack.json``
for ``tiered status``, and stopped newest first.
"""

from __future__ import annotations

import json
import threading
from abc import abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from serving.release.store import write_durably
from tiered.children import Child, Children
from tiered.fleet_config import FleetConfig

STATE = "stack.json"


@dataclass(kw_only=True)
class RunningFleet(FleetConfig):
    """The running part every fleet shares. A subclass says where each child runs (``spawn``,
    ``env``), which nginx entries clients use (``entries``) and what must be up
    (``expected``)."""

    children: Children = field(init=False)
    notes: dict[str, dict[str, str]] = field(default_factory=dict)  # e.g. the full release
    # trained behind the quick one: shown by ``tiered status`` (stack.json)
    _saving: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.children = Children(self.root / "logs", self.echo)

    @abstractmethod
    def entries(self) -> list[str]:
        """Every nginx entry clients use: each must route before the fleet counts as up."""

    @abstractmethod
    def expected(self) -> dict[str, int]:
        """How many passing instances of each Tiered service the fleet counts as up."""

    @property
    def url(self) -> str:
        """The nginx entry clients use first."""
        return self.entries()[0]

    def spawn(self, name: str, argv: list[str], port: int | None = None,
              role: str = "", env: dict[str, str] | None = None) -> Child:
        return self.children.start(name, argv, port or 0, role,
                                   self.env(name, role) | (env or {}), self.root)

    def revive(self, name: str) -> Child:
        """Start child ``name`` again as it was (same place, argv, port, data)."""
        child = self.children[name]
        return self.spawn(name, child.argv, child.port, child.role)

    def supervise(self, interval: float = 0.2) -> threading.Thread:
        """Bring back a registry, center or edge that exits while the stack runs (same
        name, port, store and flags: compose's ``restart: unless-stopped``). Consul or nginx
        exiting is not repaired: ``children.dead()`` reports it."""
        def again(child: Child) -> Child:
            fresh = self.revive(child.name)
            self.save()
            return fresh

        return self.children.supervise(again, interval)

    def passing(self) -> dict[str, list[str]]:
        """Consul's view: the ids of the passing instances of each Tiered service."""
        found = {}
        for service in self.expected():
            rows = httpx.get(f"http://{self.consul}/v1/health/service/{service}",
                             params={"passing": "1"}, headers=self.consul_headers(),
                             timeout=2).json()
            found[service] = sorted(r["Service"]["ID"] for r in rows)
        return found

    def wait_healthy(self, timeout: float) -> None:
        def healthy() -> bool:
            passing = self.passing()
            if any(len(passing[s]) < n for s, n in self.expected().items()):
                return False
            return all(httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200
                       for url in self.entries())

        self.children.wait(healthy, timeout, "every service passing in Consul and every "
                                             "nginx entry routing")

    def state(self) -> dict[str, Any]:
        """What ``tiered status`` and ``tiered demo`` read back (``stack.json``)."""
        return {"url": self.url, "consul": self.consul,
                "consul_token_file": str(self.acl.token_file) if self.consul_acl else None,
                "registry_home": str(self.registry_home),
                "children": {n: {"pid": c.pid, "port": c.port, "role": c.role}
                             for n, c in self.children.items()},
                "notes": self.notes}

    def save(self) -> None:
        with self._saving:  # the supervisor and the release trained behind both save
            # whole or not at all: `tiered status` may read it at any moment
            write_durably(self.root / STATE, json.dumps(self.state(), indent=2).encode())

    def stop(self) -> None:
        """Every child by PID, newest first (a restart in progress finishes first)."""
        self.children.stop()
        (self.root / STATE).unlink(missing_ok=True)


def load_state(root: Path) -> dict[str, Any] | None:
    path = root / STATE
    return json.loads(path.read_text()) if path.is_file() else None
