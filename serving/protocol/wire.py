"""Messages that do not parse: the sync service and the V2 gRPC transport answer them
``INVALID_ARGUMENT``.

gRPC deserializes a request before the servicer sees it; a ``DecodeError`` there reaches the
client as ``UNKNOWN`` with the Python exception in its details. ``ParseInterceptor`` gives
every handler a deserializer that returns ``Malformed`` instead of raising, and the servicer
refuses it cleanly.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError


@dataclass(frozen=True)
class Malformed:
    """Stands for a request message whose bytes did not parse."""

    method: str

    @property
    def details(self) -> str:
        return f"malformed message: not a valid request for {self.method}"


def _tolerant(deserialize: Callable[[bytes], Any], method: str) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError:
            return Malformed(method)

    return parse


class ParseInterceptor(grpc.aio.ServerInterceptor):
    """Only for the methods under ``prefix`` (``/package.Service/``), whose servicer checks
    for ``Malformed``; other services (gRPC health) keep their own deserializers."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    async def intercept_service(self, continuation: Callable[[grpc.HandlerCallDetails],
                                                             Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if handler is None or handler.request_deserializer is None or \
                not details.method.startswith(self.prefix):
            return handler
        return handler._replace(request_deserializer=_tolerant(handler.request_deserializer,
                                                               details.method))
