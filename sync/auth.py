"""Bearer-token authentication for the sync service and TLS credentials for both ends.

Every call must carry ``authorization: Bearer <REGISTRY_TOKEN>``; a wrong or missing token is
answered ``UNAUTHENTICATED`` and reported (the registry audits it). The standard gRPC health
service is left open: Consul's gRPC checks cannot send metadata.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

HEALTH_PREFIX = "/grpc.health.v1.Health/"
OnDenied = Callable[[str, str], Awaitable[None]]  # (method, peer)


def metadata(token: str | None) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {token}")] if token else []


def _presented(details: grpc.HandlerCallDetails) -> str:
    for key, value in details.invocation_metadata or ():
        if key == "authorization":
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            return text.removeprefix("Bearer ").strip()
    return ""


class TokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: str, on_denied: OnDenied) -> None:
        self.token = token.encode()
        self.on_denied = on_denied

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails],
                                                             Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if details.method.startswith(HEALTH_PREFIX) or handler is None:
            return handler
        if hmac.compare_digest(_presented(details).encode(), self.token):
            return handler
        return _refusal(handler, details.method, self.on_denied)


def _refusal(handler: Any, method: str, on_denied: OnDenied) -> Any:
    """A handler of the same streaming kind as ``handler`` that refuses the call."""

    async def refuse(_: Any, context: grpc.aio.ServicerContext) -> None:
        await on_denied(method, context.peer())
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token "
                            "(REGISTRY_TOKEN)")

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
    """A channel to ``host:port``: TLS against ``ca`` when given, else plaintext."""
    opts = options or []
    if ca is not None:
        return grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(ca.read_bytes()),
                                       options=opts)
    return grpc.aio.insecure_channel(target, options=opts)
