"""A test's own Sync stream, as a node holds one: the registry serves a node's Fetch only for
releases pushed to its open stream, so a test that fetches by hand says hello first."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc

from serving.config.tokens import node_token
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from sync.wire import auth


@dataclass
class Stream:
    """An open Sync stream: what the registry sent on it so far (``messages``) and the
    metadata that proves its node (for Fetch calls on the same channel)."""

    stub: pb_grpc.SyncStub
    metadata: list[tuple[str, str]]
    received: queue.Queue[Any] = field(default_factory=queue.Queue)
    messages: list[pb.ServerMessage] = field(default_factory=list)

    def next(self, timeout: float = 10, trust: bool = False,
             witness: bool = False) -> pb.ServerMessage:
        """The next message the registry sends (a grpc.RpcError if the stream ended so).
        TUF metadata and audit witnesses (``trust`` and ``witness`` messages, sent on every
        stream and whenever they change) are kept in ``messages`` but skipped unless asked
        for."""
        while True:
            item = self.received.get(timeout=timeout)
            if isinstance(item, BaseException):
                raise item
            self.messages.append(item)
            kind = item.WhichOneof("kind")
            if (kind != "trust" or trust) and (kind != "witness" or witness):
                return item

    def releases(self) -> dict[str, int]:
        return {m.release.model: m.release.version for m in self.messages
                if m.WhichOneof("kind") == "release"}

    def fetch(self, request: pb.FetchRequest, timeout: float = 30) -> Any:
        return self.stub.Fetch(request, metadata=self.metadata, timeout=timeout)


def token(secret: str, node_id: str, tier: str = "edge", region: str = "local") -> str:
    return node_token(secret, node_id, tier, region)


@contextmanager
def stream(target: str, secret: str, node_id: str, tier: str = "edge", region: str = "local",
           hello: pb.Hello | None = None, credential: str | None = None) -> Iterator[Stream]:
    """A Sync stream to ``target`` as ``node_id`` (its token made from ``secret``, or
    ``credential``), open until the block ends; ``hello``: said instead of the node's own.
    ``next()`` gives what the registry sends, its welcome first (or raises its refusal)."""
    metadata = auth.metadata(credential or token(secret, node_id, tier, region))
    said = hello or pb.Hello(node_id=node_id, tier=tier, region=region)
    done = threading.Event()

    def requests() -> Iterator[pb.NodeMessage]:
        yield pb.NodeMessage(hello=said)
        done.wait()

    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.SyncStub(channel)
        opened = Stream(stub, metadata)
        call = stub.Sync(requests(), metadata=metadata)

        def read() -> None:
            try:
                for message in call:
                    opened.received.put(message)
            except grpc.RpcError as exc:
                opened.received.put(exc)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            yield opened
        finally:
            done.set()
            call.cancel()
            reader.join(10)


class Acking:
    """A simulated node for fleet tests: holds its Sync stream open in a thread and acks each
    release it is pushed ACTIVE at once, as if installed from a shared cache (no download,
    no model run); ``versions``: model -> the version it acked last."""

    def __init__(self, target: str, secret: str, node_id: str, tier: str = "edge",
                 region: str = "local") -> None:
        self.node_id = node_id
        self.versions: dict[str, int] = {}
        self.error: BaseException | None = None
        self._outbox: queue.Queue[pb.NodeMessage | None] = queue.Queue()
        self._outbox.put(pb.NodeMessage(hello=pb.Hello(node_id=node_id, tier=tier,
                                                       region=region)))
        self._channel = grpc.insecure_channel(target)
        self._call = pb_grpc.SyncStub(self._channel).Sync(
            iter(self._outbox.get, None), metadata=auth.metadata(token(secret, node_id, tier,
                                                                       region)))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        try:
            for message in self._call:
                if message.WhichOneof("kind") == "release":
                    r = message.release
                    self._outbox.put(pb.NodeMessage(ack=pb.Ack(
                        model=r.model, version=r.version, state=pb.ACTIVE)))
                    self.versions[r.model] = r.version
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:
                self.error = exc

    def close(self) -> None:
        self._outbox.put(None)
        self._call.cancel()
        self._reader.join(10)
        self._channel.close()
