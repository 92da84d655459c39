"""What a client gets for an exception, written once for both transports.

A :class:`ServingError` answers with its status, message and headers (``Retry-After`` when
overloaded); Litestar's own ``HTTPException`` (no such route, a method the route does not take)
with its status, detail and headers; anything else with 500 and a fixed message, the exception
going to the server log only (clients never see its text). REST sends ``body`` with ``headers``;
gRPC turns ``status`` into its code (``serving/transport/rpc.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from litestar.exceptions import HTTPException

from serving.errors import ServingError
from serving.protocol import v2

INTERNAL = "internal error; see the server log for the request id"


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """An HTTP status, the error's message and the headers that go with it."""

    status: int
    message: str
    headers: Mapping[str, str]

    @property
    def body(self) -> bytes:
        """The V2 error JSON: ``{"error": message}``."""
        return v2.ENCODER.encode({"error": self.message})


def error_response(exc: Exception, log: logging.Logger) -> ErrorResponse:
    """The answer to ``exc``; an unexpected one is logged to ``log`` with its traceback."""
    if isinstance(exc, ServingError):
        return ErrorResponse(exc.status, str(exc), exc.headers)
    if isinstance(exc, HTTPException):
        return ErrorResponse(exc.status_code, str(exc.detail), exc.headers or {})
    log.error("unhandled error", exc_info=exc)
    return ErrorResponse(500, INTERNAL, {})
