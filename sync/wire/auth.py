"""Who may talk to the registry: each node's own bearer token (``serving.config.tokens``), checked
on every call, and TLS credentials for both ends.

A token proves one node id: the Sync stream's hello must name that node, so a node cannot
connect, ack, report or subscribe as another. The registry's own secret is not a node token
and opens nothing. The standard gRPC health service is left open: Consul's gRPC checks cannot
send metadata.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from serving.config.tokens import NodeToken, TokenError, TokenVerifier, parse
from serving.fleet.discovery import REGISTRY_TLS_NAME

HEALTH_PREFIX = "/grpc.health.v1.Health/"
OnDenied = Callable[[str, str], Awaitable[None]]  # (method, peer)


def metadata(token: str | None) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")] if token else []


def presented(metadata: Any) -> str:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            return str(text).removeprefix("Bearer ").strip()
    return ""


def proven(context: grpc.aio.ServicerContext) -> NodeToken | None:
    """The node token the call carried (the interceptor has verified it)."""
    try:
        return parse(presented(context.invocation_metadata()))
    except TokenError:
        return None


class TokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, verifier: TokenVerifier, on_denied: OnDenied) -> None:
        self.verifier = verifier
        self.on_denied = on_denied

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails],
                                                             Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if details.method.startswith(HEALTH_PREFIX) or handler is None:
            return handler
        if self.verifier.node(presented(details.invocation_metadata)) is not None:
            return handler
        return _refusal(handler, details.method, self.on_denied)


def _refusal(handler: Any, method: str, on_denied: OnDenied) -> Any:
    """A handler of the same streaming kind as ``handler`` that refuses the call."""

    async def refuse(_: Any, context: grpc.aio.ServicerContext) -> None:
        await on_denied(method, context.peer())
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing, wrong or revoked node "
                            "token (`registry node token NODE_ID` prints a node's)")

    async def refuse_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await refuse(request, context)
        yield  # pragma: no cover - abort raised above; this makes it an async generator

    kind = (handler.request_streaming, handler.response_streaming)
    make = {(False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler}[kind]
    behaviour = refuse_stream if handler.response_streaming else refuse
    return make(behaviour, request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer)


def server_credentials(cert: Path, key: Path) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])


def channel(target: str, ca: Path | None, options: list[tuple[str, Any]] | None = None
            ) -> grpc.aio.Channel:
    """A channel to the registry at ``host:port``: TLS against ``ca`` when given, else
    plaintext. Over TLS the certificate must carry the registry's role name
    (``registry.tiered.invalid``), whatever address was dialled: every node's certificate
    comes from the same CA and lists the node's own addresses, so checking the address alone
    let a stolen edge's certificate pass for the registry's."""
    opts = options or []
    if ca is not None:
        return grpc.aio.secure_channel(
            target, grpc.ssl_channel_credentials(ca.read_bytes()),
            options=[*opts, ("grpc.ssl_target_name_override", REGISTRY_TLS_NAME)])
    return grpc.aio.insecure_channel(target, options=opts)

