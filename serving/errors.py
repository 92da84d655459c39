"""Every exception the serving package raises. ``ServingError`` and its subclasses reach
clients: ``serving/transport/responses.py`` answers each with its status, headers and
``{"error": ...}``, for REST and gRPC alike. The others are the node's own (store, signatures,
probe, discovery, tokens) and never leave it as such; ``FidelityRefused`` lives beside the probe
it reports on (``serving.release.probe``).

Standard library only: ``serving/config/tokens.py`` runs under the system Python too.
"""

from __future__ import annotations


class ServingError(Exception):
    status = 500
    headers: dict[str, str] = {}  # noqa: RUF012 - class default, never mutated
    reason = ""  # set: a guard refused the request; counted and logged by it (dataplane)


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


class InputRefused(BadRequest):
    """An input past a bound checked before any work is spent on it: an image's scans,
    segments, chunks or metadata (``serving.inputs.structure``). ``reason`` names the bound."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ParseBusy(Overloaded):
    """Every parse thread is busy and the parse queue is full (``parse_queue``)."""

    reason = "busy"


class ParseDeadline(ServingError):
    """Parsing (decoding) the request took longer than ``parse_deadline_s``; what was left of
    it was not done."""

    status = 503
    reason = "deadline"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.headers = {"Retry-After": "1"}


class ClientGone(ServingError):
    """The client went away before its request was parsed: the rest is not done. Nobody
    reads the answer; 499 is nginx's status for it, in the logs."""

    status = 499
    reason = "gone"


class SigningError(Exception):
    """A key file is missing or unreadable, or a signature is missing or does not verify."""


class StoreError(Exception):
    """A store folder is missing, incomplete, or does not match its manifest."""


class ProbeError(ValueError):
    """The probe file is not a probe this node can run."""


class ModelFailed(ValueError):
    """A model run over fixed inputs (``serving.model.runner``) failed on them, or answered what
    no classifier may: not a logits tensor, the wrong shape, NaN or infinite values."""


class InvalidInstance(ValueError):
    """A service entry from Consul with a value outside what Tiered registers."""


class TokenError(ValueError):
    """A token that cannot be a node token (wrong shape, or for another node)."""
