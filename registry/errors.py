"""The registry's exception tree; the CLI maps each to a message and an exit status once."""

from __future__ import annotations

import re


class RegistryError(Exception):
    """Base class: a failure the user can act on. ``exit_code`` is the CLI's exit status."""

    exit_code = 1


class InvalidRelease(RegistryError):
    """The thing to publish is missing, unreadable, or not a valid release."""

    exit_code = 2


class InvalidName(RegistryError):
    exit_code = 2


class FidelityTooLow(RegistryError):
    """INT8 edge predictions disagree with the fp32 edge model more than allowed."""

    exit_code = 3


class BackupRefused(RegistryError):
    """``registry backup``/``restore`` refused before writing anything: the destination or
    home is taken, or the folder is not a backup (``registry.ha.backup``)."""

    exit_code = 2


class NotFound(RegistryError):
    exit_code = 4


class AuditChainBroken(RegistryError):
    exit_code = 1


class IntegrityError(RegistryError):
    """A stored blob or a materialized file does not match its recorded sha256."""

    exit_code = 5


class SigningKeyError(RegistryError):
    """The signing key is missing, unreadable, not Ed25519, or would be overwritten."""

    exit_code = 2


class AnchorError(RegistryError):
    """The audit chain's signed head cannot be read, or the database does not hold the chain
    it signs (``registry.trust.anchor``)."""

    exit_code = 1


class NotPrimary(RegistryError):
    """A write to a registry that is a standby, or a primary whose lease ran out
    (``registry.ha.changes``)."""

    exit_code = 6



def brief(exc: BaseException, limit: int = 300) -> str:
    """An exception raised by a library (torch, onnx, numpy) as one short line for a refusal
    that quotes it: torch's carry a trace and code excerpts, their last ``XError: ...`` line
    says what went wrong; others, their first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    said = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    text = said[-1] if said else lines[0] if lines else type(exc).__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"
