"""Settings every serving tier shares; ``center`` and ``edge`` subclass with their prefix."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ServingSettings(BaseSettings):
    model_config = SettingsConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Interface to listen on (0.0.0.0 in containers)."""

    port: int = Field(default=8000, ge=0, le=65535)
    """HTTP port of the V2 API and /metrics (0 = any free port)."""

    store: Path = Path("./var/model-store")
    """Model store folder (<store>/<model>/<version>/, CURRENT), filled by registry pull."""

    node_id: str = ""
    """Name of this node in logs, responses and the registry's status; must be unique per
    node (default: <host name>-<port>, so two tiers on one host differ)."""

    region: str = Field(default="local", pattern=r"^[a-z0-9][a-z0-9-]{0,31}$")
    """Region tag of this node (rollouts can target ``region:R``; routing prefers the nearest):
    lower-case letters, digits and hyphens (what discovery accepts from Consul)."""

    registry: str | None = None
    """host:port of ``registry serve`` to subscribe to for releases; unset = no sync (the store
    is filled by ``registry pull``)."""

    registry_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("registry_token", "REGISTRY_TOKEN"))
    """Bearer token for the registry (the same REGISTRY_TOKEN the registry serves with)."""

    registry_ca: Path | None = None
    """PEM CA certificate to verify the registry's TLS certificate; unset = plaintext."""

    release_key: Path | None = None
    """Public key (PEM, e.g. the registry's ``signing.pub``) that releases must be signed with:
    a release or store version whose signature is missing or does not verify is refused;
    unset = signatures are not checked (logged as a warning at start-up)."""

    min_fidelity: float | None = Field(default=None, ge=0.0, le=1.0)
    """Floor of top-1 agreement with the fp32 reference that a version must reach on this
    node's own hardware (its release probe, run at load) to be served; unset = the release's
    floor (``registry publish --min-fidelity``). Below it the version is refused and the
    previous one keeps serving."""

    consul_http_addr: str | None = Field(
        default=None, validation_alias=AliasChoices("consul_http_addr", "CONSUL_HTTP_ADDR"))
    """Consul agent (host:port) to register with and discover centers and the registry
    through; unset = no Consul (static settings apply)."""

    consul_http_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("consul_http_token", "CONSUL_HTTP_TOKEN"))
    """Consul ACL token."""

    advertise: str | None = None
    """Address registered in Consul for this node (default: host, or the host name when
    listening on 0.0.0.0)."""

    sync_backoff_max_s: float = Field(default=30.0, gt=0)
    """Longest wait between reconnects or retries of a failed release (exponential, jittered)."""

    max_batch_size: int = Field(default=32, ge=1, le=4096)
    """Most rows one model execution takes (Triton's max_batch_size)."""

    max_batch_delay_ms: float = Field(default=5.0, ge=0, le=10_000)
    """Longest a request waits for company before its batch runs (Triton's
    max_queue_delay_microseconds, in ms)."""

    max_queue_rows: int = Field(default=2048, ge=1)
    """Rows allowed to wait; beyond it requests get 503 with Retry-After at once."""

    max_request_rows: int = Field(default=256, ge=1)
    """Most rows in one inference request."""

    max_text_bytes: int = Field(default=64 * 1024, ge=1)
    """Longest single text (UTF-8 bytes) accepted before tokenization."""

    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    """Largest request body; larger ones get 413."""

    threads: int = Field(default=0, ge=0)
    """Intra-op threads of the model runtime (0 = the runtime's default)."""

    poll_interval_s: float = Field(default=2.0, gt=0)
    """How often the model store is checked for a new CURRENT version."""

    log_file: Path | None = None
    """JSON log file (rotated); logs always go to stderr too."""

    log_max_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    """Size at which the log file is rotated."""

    log_backups: int = Field(default=3, ge=0)
    """Rotated log files kept."""

    log_level: str = "INFO"
    """Python log level name."""

    @model_validator(mode="before")
    @classmethod
    def _default_node_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and not data.get("node_id"):
            port = data.get("port", cls.model_fields["port"].default)
            data = {**data, "node_id": f"{socket.gethostname()}-{port}"}
        return data

    @property
    def advertised(self) -> str:
        if self.advertise:
            return self.advertise
        return socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
