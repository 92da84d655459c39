"""The serving exception tree; the app maps each to ``{"error": ...}`` with its status once."""

from __future__ import annotations


class ServingError(Exception):
    status = 500
    headers: dict[str, str] = {}  # noqa: RUF012 - class default, never mutated


class BadRequest(ServingError):
    status = 400


class ModelNotFound(ServingError):
    status = 404


class PayloadTooLarge(ServingError):
    status = 413


class NotReady(ServingError):
    status = 503


class Overloaded(ServingError):
    """The queue is past its bound: answered at once instead of waiting without limit."""

    status = 503

    def __init__(self, message: str, retry_after: int = 1) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": str(retry_after)}
