"""A node checks the registry's own name, not only its CA: every node's certificate comes from the
fleet CA and lists the node's addresses, so a rogue registry presenting a stolen edge's
certificate (which lists 127.0.0.1) was accepted by a wiped edge as its registry. The channel
``sync.wire.auth.channel`` makes (nodes to the registry, a standby to the primary) now requires
``registry.tiered.invalid``, which only ``registry tls`` signs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from registry.trust import pki
from sync.wire import auth


async def answered(cert: Path, key: Path, ca: Path) -> bool:
    """Whether a health call over ``auth.channel`` reaches a TLS server presenting ``cert``."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_secure_port("127.0.0.1:0", auth.server_credentials(cert, key))
    await server.start()
    try:
        async with auth.channel(f"127.0.0.1:{port}", ca) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=5)
            return reply.status == health_pb2.HealthCheckResponse.SERVING
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
        return False
    finally:
        await server.stop(None)


def test_only_the_registrys_certificate_passes_for_the_registry(tmp_path: Path) -> None:
    registry_cert, registry_key = pki.server(tmp_path, "registry", ["127.0.0.1"])
    ca = tmp_path / "ca.pem"
    assert asyncio.run(answered(registry_cert, registry_key, ca))  # the real one still works
    for node_id, tier in (("edge-stolen", "edge"), ("center-1", "center")):
        cert, key = pki.node(tmp_path, node_id, tier, "eu", ("127.0.0.1", "localhost"))
        (tmp_path / f"{node_id}.pem").write_bytes(cert)
        (tmp_path / f"{node_id}.key").write_bytes(key)
        # same CA, and the certificate names the very address dialled: still refused
        assert not asyncio.run(answered(tmp_path / f"{node_id}.pem",
                                        tmp_path / f"{node_id}.key", ca)), tier


def test_a_center_role_certificate_is_no_registry_either(tmp_path: Path) -> None:
    cert, key = pki.server(tmp_path, "center", ["127.0.0.1"])
    assert not asyncio.run(answered(cert, key, tmp_path / "ca.pem"))


@pytest.mark.parametrize("tier", ["edge", "center"])
def test_the_name_checked_is_the_one_registry_tls_signs(tier: str) -> None:
    assert pki.role_name("registry") == auth.REGISTRY_TLS_NAME
    assert pki.node_name("registry", tier) != auth.REGISTRY_TLS_NAME
