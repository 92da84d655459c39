"""A node that receives a release written for newer nodes refuses it by name, in its ack, and
keeps serving what it has."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from types import SimpleNamespace

import msgspec

from serving.config.settings import ServingSettings
from serving.release.manifest import SCHEMA, encode
from serving.release.store import ModelStore
from sync.gen import sync_pb2 as pb
from sync.node.converge import Converger
from tests.unit.serving.test_store import manifest


def desire(tmp_path: Path, raw: bytes) -> list[pb.NodeMessage]:
    sent: list[pb.NodeMessage] = []

    async def send(message: pb.NodeMessage) -> None:
        sent.append(message)

    repository = SimpleNamespace(store=ModelStore(tmp_path), tier="edge")
    converger = Converger(ServingSettings(store=tmp_path), repository,  # type: ignore[arg-type]
                          None, send)  # type: ignore[arg-type]
    release = pb.Release(model="sentiment", version=7, manifest=raw,
                         manifest_sha256=hashlib.sha256(raw).hexdigest())
    asyncio.run(converger.desire(release))
    return sent


def test_a_release_of_a_newer_schema_is_refused_with_its_reason(tmp_path: Path) -> None:
    newer = msgspec.json.encode({**msgspec.to_builtins(manifest(7)), "schema": SCHEMA + 1,
                                 "request": [{"kind": "audio", "rate": 16000}]})
    (message,) = desire(tmp_path, newer)
    ack = message.ack
    assert (ack.model, ack.version, ack.state) == ("sentiment", 7, pb.REFUSED)
    assert f"schema {SCHEMA + 1}: this node reads up to schema {SCHEMA}" in ack.reason


def test_a_release_of_this_schema_is_not_refused_for_it(tmp_path: Path) -> None:
    sent = desire(tmp_path, encode(manifest(7)))
    assert all("schema" not in m.ack.reason for m in sent)
