"""The edge's settings: ``EDGE_*`` variables, ``edge --flag`` overrides."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from serving.settings import ServingSettings


class EdgeSettings(ServingSettings):
    model_config = SettingsConfigDict(env_prefix="EDGE_", extra="forbid", frozen=True,
                                      use_attribute_docstrings=True)

    port: int = Field(default=8200, ge=0, le=65535)
    """HTTP port of the V2 API and /metrics."""

    store: Path = Path("./var/edge")
    """Model store folder holding the INT8 ONNX artifacts (registry pull --tier edge)."""

    center_url: str | None = None
    """Center base URL(s), comma-separated, e.g. http://127.0.0.1:8100 (until discovery)."""

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
