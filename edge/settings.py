"""The edge's settings: ``EDGE_*`` variables, ``edge --flag`` overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from serving.settings import ServingSettings

# how a center URL says which protocol reaches it, and which of those are TLS
GRPC_SCHEMES = ("grpc://", "grpcs://")
TLS_SCHEMES = ("https://", "grpcs://")
CENTER_SCHEMES = ("http://", *TLS_SCHEMES, "grpc://")


class EdgeSettings(ServingSettings):
    model_config = SettingsConfigDict(env_prefix="EDGE_", extra="forbid", frozen=True,
                                      use_attribute_docstrings=True)

    port: int = Field(default=8200, ge=0, le=65535)
    """HTTP port of the V2 API and /metrics."""

    grpc_port: int = Field(default=8201, ge=0, le=65535)
    """gRPC port of the V2 API (``inference.GRPCInferenceService``, health, reflection);
    0 = no gRPC."""

    store: Path = Path("./var/edge")
    """Model store folder holding the INT8 ONNX artifacts (registry pull --tier edge)."""

    center_url: str | None = None
    """Center base URL(s), comma-separated, until discovery: http(s)://host:port for V2 REST,
    grpc(s)://host:port for gRPC V2 (e.g. http://127.0.0.1:8100, grpc://127.0.0.1:8101)."""

    escalation: Literal["http", "grpc"] = "http"
    """How discovered centers are called: V2 REST on their HTTP port, or gRPC V2 on the gRPC
    port they registered (a center without one is called over REST)."""

    center_ca: Path | None = None
    """PEM fleet CA (``registry tls``): when set, rows escalate only over HTTPS to centers whose
    certificate chains to it and carries the center role, so an instance someone registered
    in Consul as a center gets neither users' inputs nor a say in their answers; discovered
    centers are then called at https://. Unset = plain HTTP (one host, or a trusted network)."""

    center_timeout_s: float = Field(default=2.0, gt=0)
    """How long one escalation call may take before the rows are answered degraded."""

    threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    """Override of the release's calibrated threshold (rows below it escalate)."""

    breaker_failures: int = Field(default=3, ge=1)
    """Consecutive failed calls after which a center is skipped (circuit open)."""

    breaker_reset_s: float = Field(default=5.0, gt=0)
    """How long an open circuit waits before one probe call is let through."""

    cache_size: int = Field(default=10_000, ge=0)
    """Answers kept in the LRU response cache (0 disables it)."""

    cache_ttl_s: float = Field(default=300.0, gt=0)
    """How long a cached answer stays valid."""

    @model_validator(mode="after")
    def _centers_over_tls(self) -> EdgeSettings:
        urls = [u.strip() for u in (self.center_url or "").split(",") if u.strip()]
        unknown = [u for u in urls if not u.startswith(CENTER_SCHEMES)]
        if unknown:
            raise ValueError(f"center_url {unknown[0]!r}: expected http://, https://, grpc:// "
                             f"or grpcs:// and host:port")
        plain = [u for u in urls if not u.startswith(TLS_SCHEMES)]
        if self.center_ca is not None and plain:
            raise ValueError(f"center_ca is set, so centers are reached over TLS only "
                             f"(https://, grpcs://); center_url lists {plain[0]}")
        return self
