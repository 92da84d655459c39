"""The sync service fed malformed and hostile input over real gRPC: every call ends with a
clean status (never UNKNOWN or INTERNAL), and the registry keeps serving normal fetches.

Complements test_sync.py (wrong token, bad sha256, offset -1 / size+1, invalid node id)."""

from __future__ import annotations

import hashlib
import math
import random
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.processes import RegistryProcess, start_registry
from serving.config.tokens import node_token
from sync.gen import sync_pb2 as pb
from tests import streams
from tests.conftest import RegistryCli

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOKEN = "fuzz-token-0123456789"


def auth(node: str = "fuzz-node") -> list[tuple[str, str]]:
    """The bearer token of ``node``, an edge in region ``local`` (a hello must name the node,
    tier and region its token proves)."""
    return [("authorization", f"Bearer {node_token(TOKEN, node, 'edge', 'local')}")]


FETCHER = "fuzz-fetcher"  # holds a Sync stream for the module: Fetch serves what was pushed
AUTH = auth(FETCHER)
FETCH, SYNC = "/tiered.sync.v1.Sync/Fetch", "/tiered.sync.v1.Sync/Sync"
CLEAN = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
         grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.RESOURCE_EXHAUSTED,
         grpc.StatusCode.UNAUTHENTICATED}


@dataclass
class Registry:
    cli: RegistryCli
    server: RegistryProcess
    channel: grpc.Channel
    sha: str  # the edge artifact of tiny@1
    size: int

    def fetch(self, request: bytes, metadata: list[tuple[str, str]] | None = None
              ) -> list[bytes]:
        call = self.channel.unary_stream(FETCH)  # no serializers: raw bytes both ways
        return list(call(request, metadata=AUTH if metadata is None else metadata, timeout=5))

    def sync(self, messages: list[bytes], node: str = "fuzz-node") -> list[bytes]:
        return list(self.channel.stream_stream(SYNC)(iter(messages), metadata=auth(node),
                                                     timeout=5))


def status(call: Any, *args: Any) -> grpc.StatusCode:
    """The status a call ended with (OK when it returned normally)."""
    try:
        call(*args)
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def hello(node_id: str = "fuzz-node", **fields: Any) -> bytes:
    message = pb.NodeMessage(hello=pb.Hello(**{"node_id": node_id, "tier": "edge",
                                               "region": "local", **fields}))
    return message.SerializeToString()


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Registry]:
    root = tmp_path_factory.mktemp("sync-fuzz")
    cli = RegistryCli(root / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    manifest = cli("show", "tiny@1", "--json").json()["manifest"]
    server = start_registry(cli.home, root, TOKEN)
    channel = grpc.insecure_channel(server.target)
    try:
        with streams.stream(server.target, TOKEN, FETCHER) as held:
            assert held.next().WhichOneof("kind") == "welcome"
            yield Registry(cli, server, channel, manifest["edge"]["sha256"],
                           manifest["edge"]["size"])
    finally:
        channel.close()
        server.stop()


def assert_healthy(registry: Registry) -> None:
    health = health_pb2_grpc.HealthStub(registry.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
        health_pb2.HealthCheckResponse.SERVING
    chunks = [pb.Chunk.FromString(c) for c in registry.fetch(
        pb.FetchRequest(sha256=registry.sha).SerializeToString())]
    assert hashlib.sha256(b"".join(c.data for c in chunks)).hexdigest() == registry.sha


def test_random_bytes_get_a_clean_status(registry: Registry) -> None:
    rng = random.Random(20240611)
    seen: dict[grpc.StatusCode, int] = {}
    for i in range(300):
        data = rng.randbytes(rng.randint(0, 96))
        metadata = AUTH if i % 10 else []  # every tenth call without the token
        for code in (status(registry.fetch, data, metadata),
                     status(registry.sync, [data]) if metadata else grpc.StatusCode.OK):
            seen[code] = seen.get(code, 0) + 1
    assert set(seen) <= CLEAN | {grpc.StatusCode.OK}, seen
    assert seen[grpc.StatusCode.INVALID_ARGUMENT] > 400  # most of them do not even parse
    assert seen[grpc.StatusCode.UNAUTHENTICATED] == 30
    assert_healthy(registry)


def test_truncated_requests_and_odd_fields(registry: Registry) -> None:
    whole = pb.FetchRequest(sha256=registry.sha, offset=3).SerializeToString()
    without_offset = len(pb.FetchRequest(sha256=registry.sha).SerializeToString())
    for cut in range(1, len(whole)):  # every prefix: a cut field fails to parse or names no sha
        expected = {grpc.StatusCode.OK} if cut == without_offset else CLEAN
        assert status(registry.fetch, whole[:cut]) in expected, cut
    cases = {
        "A" * 64: grpc.StatusCode.INVALID_ARGUMENT,  # uppercase hex is not what we store
        registry.sha.upper(): grpc.StatusCode.INVALID_ARGUMENT,
        registry.sha + "\n": grpc.StatusCode.INVALID_ARGUMENT,
        "é" * 64: grpc.StatusCode.INVALID_ARGUMENT,
        "0" * 64: grpc.StatusCode.NOT_FOUND,
    }
    for sha, code in cases.items():
        assert status(registry.fetch, pb.FetchRequest(sha256=sha).SerializeToString()) == code
    for offset in (-(2 ** 63), -registry.size, registry.size + 1, 2 ** 63 - 1):
        request = pb.FetchRequest(sha256=registry.sha, offset=offset).SerializeToString()
        assert status(registry.fetch, request) == grpc.StatusCode.OUT_OF_RANGE, offset
    at_end = pb.FetchRequest(sha256=registry.sha, offset=registry.size).SerializeToString()
    assert registry.fetch(at_end) == []  # nothing left to send: an empty, successful stream
    assert_healthy(registry)


def test_oversized_messages_are_refused(registry: Registry) -> None:
    huge = "0" * (2 << 20)  # twice the server's 1 MiB receive limit
    assert status(registry.fetch, pb.FetchRequest(sha256=huge).SerializeToString()) == \
        grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status(registry.sync, [hello(region=huge)]) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert_healthy(registry)


def test_sync_protocol_violations_end_the_stream_invalid_argument(registry: Registry) -> None:
    ack = pb.NodeMessage(ack=pb.Ack(model="tiny", version=1, state=pb.ACTIVE))
    violations = {"ack before hello": [ack.SerializeToString()],
                  "hello twice": [hello(), hello()],
                  "garbage after hello": [hello(), b"\xff\xff\xff\xff"],
                  "empty message first": [b""]}
    for what, messages in violations.items():
        assert status(registry.sync, messages) == grpc.StatusCode.INVALID_ARGUMENT, what
    assert_healthy(registry)


def test_unknown_ack_state_is_ignored_not_fatal(registry: Registry) -> None:
    """An ack whose enum value this registry does not know (proto3 enums are open) used to
    end the stream, dropping the acks after it."""
    odd = pb.NodeMessage(ack=pb.Ack(model="tiny", version=1, state=99))  # type: ignore[arg-type]
    good = pb.NodeMessage(ack=pb.Ack(model="tiny", version=1, state=pb.ACTIVE))
    node = "fuzz-acker"
    # it says at hello that it holds tiny v1: an ack is taken for a release pushed to the
    # stream or held (the push may come after these acks are read)
    held = [pb.Held(model="tiny", versions=[1], active=1)]
    assert status(registry.sync, [hello(node, held=held), odd.SerializeToString(),
                                  good.SerializeToString()], node) == grpc.StatusCode.OK
    rows = {r["node"]: r for r in registry.cli("status", "--json").json()}
    assert rows[node]["state"] == "ACTIVE" and rows[node]["version"] == 1


def _random_stream(rng: random.Random, i: int) -> list[bytes]:
    def text(limit: int) -> str:
        return "".join(chr(rng.choice([rng.randint(32, 126), rng.randint(0x80, 0xD7FF)]))
                       for _ in range(rng.randint(0, limit)))

    def number() -> float:
        return rng.choice([math.nan, math.inf, -math.inf, -1.0, 0.0, rng.uniform(-1e9, 1e9)])

    def int64() -> int:
        return rng.choice([0, 1, -1, 2 ** 63 - 1, -(2 ** 63), rng.randint(-1000, 1000)])

    held = [pb.Held(model=rng.choice(["tiny", text(8)]), versions=[int64()], active=int64())
            for _ in range(rng.randint(0, 3))]
    node_id = f"fz{i}" if rng.random() < 0.8 else text(20)
    messages = [pb.NodeMessage(hello=pb.Hello(node_id=node_id, tier=rng.choice(
        ["edge", "edge", "edge", "center", text(6)]), region=rng.choice(["local", "local",
                                                                         text(80)]),
        held=held))]
    for _ in range(rng.randint(0, 4)):
        model = rng.choice(["tiny", text(10)])
        if rng.random() < 0.5:
            state = rng.choice([0, 1, 2, 3, rng.randint(4, 2 ** 31 - 1)])
            messages.append(pb.NodeMessage(ack=pb.Ack(model=model, version=int64(), state=state,
                                                      reason=text(200))))
        else:
            report = pb.QualityReport(
                model=model, version=int64(), window_s=number(),
                requests=rng.randint(0, 2 ** 64 - 1), rows=rng.randint(0, 2 ** 64 - 1),
                escalation_rate=number(),
                degraded_rate=number(), mean_tokens=number(), length_drift=number(),
                p50_ms=number(), p99_ms=number(),
                confidence=[pb.Bucket(le=number(), count=rng.randint(0, 99))])
            messages.append(pb.NodeMessage(report=report))
    return [m.SerializeToString() for m in messages]


def test_random_field_values_never_break_the_server(registry: Registry) -> None:
    rng = random.Random(7)
    seen: dict[grpc.StatusCode, int] = {}
    for i in range(60):
        code = status(registry.sync, _random_stream(rng, i), f"fz{i}")
        seen[code] = seen.get(code, 0) + 1
    # a random node id that is valid but not the token's, or a tier or region not the
    # token's: PERMISSION_DENIED
    assert set(seen) <= {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT,
                         grpc.StatusCode.PERMISSION_DENIED}, seen
    assert seen.get(grpc.StatusCode.OK, 0) > 10
    assert_healthy(registry)
    assert registry.cli("status", "--json").code == 0  # what was recorded still reads back


def test_metrics_server_leaks_no_traceback(registry: Registry) -> None:
    port = registry.server.metrics_port
    answers = []
    for raw in (b"GARBAGE\r\n\r\n", b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n",
                b"POST /metrics HTTP/1.1\r\nContent-Length: -5\r\n\r\n", b"\x00\xff\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(raw)
            answers.append(s.recv(65536).decode("latin-1"))
    for path in ("/metrics?name[]=%ff", "/%00", "/../../etc/passwd"):
        answers.append(httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5).text)
    for answer in answers:
        assert "Traceback" not in answer and ".py" not in answer, answer[:500]
