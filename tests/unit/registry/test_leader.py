"""The election's rules over what Consul holds, with Consul's answers given: the newest, then
longest history wins; a restarted registry ends its predecessor's check, sessions and candidate
entries, and nobody else's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from registry.ha import leader
from registry.settings import RegistrySettings

ID = "registry-b"
OURS = (2, 10)  # (history term, position)


class Kv:
    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries
        self.deleted: list[tuple[str, bool]] = []

    async def get(self, key: str, **_: Any) -> tuple[int, list[dict[str, Any]]]:
        return 1, [e for e in self.entries if e["Key"].startswith(key)]

    async def delete(self, key: str, recurse: bool | None = None) -> bool:
        self.deleted.append((key, bool(recurse)))
        return True


class Service:
    def __init__(self) -> None:
        self.deregistered: list[str] = []

    async def deregister(self, service_id: str) -> bool:
        self.deregistered.append(service_id)
        return True


class Agent:
    def __init__(self, services: dict[str, dict[str, Any]]) -> None:
        self.listed, self.service = services, Service()

    async def services(self) -> dict[str, dict[str, Any]]:
        return self.listed


class Sessions:
    def __init__(self, sessions: list[dict[str, Any]]) -> None:
        self.sessions = sessions
        self.destroyed: list[str] = []

    async def list(self, **_: Any) -> tuple[int, list[dict[str, Any]]]:
        return 1, self.sessions

    async def destroy(self, session_id: str) -> bool:
        self.destroyed.append(session_id)
        return True


class Consul:
    def __init__(self, entries: list[dict[str, Any]] | None = None,
                 services: dict[str, dict[str, Any]] | None = None,
                 sessions: list[dict[str, Any]] | None = None) -> None:
        self.kv, self.agent = Kv(entries or []), Agent(services or {})
        self.session = Sessions(sessions or [])


async def election(tmp_path: Path, consul: Consul) -> leader.LockSession:
    settings = RegistrySettings(home=tmp_path, ha=True, consul_http_addr="127.0.0.1:1")
    return leader.LockSession(settings, ID, consul)


def entry(registry_id: str, term: int, position: int, session: str | None = "s-1",
          key: str | None = None) -> dict[str, Any]:
    value = json.dumps({"registry_id": registry_id, "history_term": term, "position": position})
    return {"Key": key or f"tiered/registry/candidates/{registry_id}/0a1b2c3d",
            "Value": value.encode(), "Session": session}


@pytest.mark.parametrize(("peer", "wins"), [
    (entry("registry-c", 3, 1), True),  # a newer promotion beats more changes
    (entry("registry-c", 2, 11), True),  # same term: more changes
    (entry("registry-c", 1, 100), False),  # an older history, however long
    (entry("registry-c", 2, 9), False),
    (entry("registry-a", 2, 10), True),  # a tie: the smaller id
    (entry("registry-c", 2, 10), False),
    (entry("registry-c", 3, 1, session=None), False),  # no live session: a dead registry
    (entry(ID, 9, 99), False),  # a predecessor's entry (a restart): never a rival
])
def test_the_election_goes_to_the_newest_then_the_longest_history(
        tmp_path: Path, peer: dict[str, Any], wins: bool) -> None:
    async def better() -> str | None:
        return await (await election(tmp_path, Consul([peer]))).better(OURS)

    assert asyncio.run(better()) == (json.loads(peer["Value"])["registry_id"] if wins else None)


def test_a_restarted_registry_ends_its_predecessors_leftovers_and_nobody_else_s(
        tmp_path: Path) -> None:
    lock = leader.LOCK_SERVICE
    consul = Consul(
        services={f"{ID}-lock": {"Service": lock},  # before per-process check ids
                  f"{ID}-lock-0a1b2c3d": {"Service": lock},  # the process killed
                  f"{ID}-lock-x-lock-0a1b2c3d": {"Service": lock},  # registry "<id>-lock-x"
                  "registry-c-lock-0a1b2c3d": {"Service": lock},  # a peer on this agent
                  f"{ID}-lock-0a1b2c3d-extra": {"Service": "tiered-registry"}},  # not a lock
        sessions=[{"ID": "old", "Name": f"tiered registry {ID}"},
                  {"ID": "peer", "Name": "tiered registry registry-c"},
                  {"ID": "other", "Name": f"tiered registry {ID}-x"}])

    async def clear() -> leader.LockSession:
        ours = await election(tmp_path, consul)
        consul.agent.listed[ours.check_id] = {"Service": lock}  # this process's own
        await ours.clear_predecessors()
        return ours

    ours = asyncio.run(clear())
    assert consul.agent.service.deregistered == [f"{ID}-lock", f"{ID}-lock-0a1b2c3d"]
    assert consul.session.destroyed == ["old"]
    assert consul.kv.deleted == [(f"tiered/registry/candidates/{ID}/", True),
                                 (f"tiered/registry/candidates/{ID}", False)]
    # and this process's own check and entry are new ones, never a predecessor's
    assert ours.check_id.startswith(f"{ID}-lock-") and ours.check_id != f"{ID}-lock-0a1b2c3d"
    assert ours.candidate_key.startswith(f"tiered/registry/candidates/{ID}/")
