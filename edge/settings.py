"""The edge's settings: ``EDGE_*`` variables, ``edge --flag`` overrides."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from edge.centers import parse_list
from serving.config.settings import ServingSettings


class EdgeSettings(ServingSettings):
    model_config = SettingsConfigDict(env_prefix="EDGE_", extra="forbid", frozen=True,
                                      use_attribute_docstrings=True)
    TIER: ClassVar[str] = "edge"

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
    """PEM fleet CA (``registry tls``; the bundle's by default): when set, rows escalate only
    over HTTPS to centers whose certificate chains to it and carries the center's name: for a
    center found in Consul its own node's (``<service id>.center.tiered.invalid``), for a
    ``center_url`` the center role's. So an instance someone registered in Consul as a center,
    or a center's entry moved to another address, gets neither users' inputs nor a say in
    their answers; discovered centers are then called at https://. Unset = plain HTTP (one
    host, or a trusted network)."""

    center_tls_name: Literal["node", "role"] = "node"
    """With ``center_ca``, the name a discovered center's certificate must carry: ``node``, its
    own (``<service id>.center.tiered.invalid``, from its bundle), so an entry moved to another
    address fails; ``role``, any center's (``center.tiered.invalid``): only while centers
    still hold ``registry tls`` certificates, which name no node."""

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

    controller: Literal["auto", "off"] = "auto"
    """The cascade controller (docs/cascade.md): ``auto`` holds escalations to the budget the
    registry pushes (threshold between the accuracy floor and 1: spare capacity takes the
    unsure rows above the floor; rows below it beyond the budget come back ``edge-shed``);
    ``off`` always uses the release's calibrated threshold (or ``threshold``)."""

    floor_tolerance: float = Field(default=0.01, ge=0.0, le=1.0)
    """Accuracy floor: the controller never lowers the threshold below the lowest calibrated
    one whose cascade accuracy stays within this of center-only (0.01 = 1 point)."""

    budget_target: float = Field(default=0.9, gt=0.0, le=1.0)
    """Share of the escalation budget the threshold aims at; the rest absorbs bursts."""

    controller_window: int = Field(default=2000, ge=50, le=1_000_000)
    """Recent rows whose confidences set the threshold (its escalation share is within
    sqrt(ln 40 / (2 x window)) of the aim at 95%)."""

    controller_horizon_s: float = Field(default=5.0, gt=0, le=600)
    """Seconds over which the edge measures its own traffic (rows/s reaching the gate)."""

    burst_s: float = Field(default=1.0, gt=0, le=60)
    """Escalations may run ahead of the budget by this many seconds' worth, then rows shed."""

    audit_share: float = Field(default=0.01, ge=0.0, le=1.0)
    """Share of the rows the edge answers itself that are also sent to the center in the
    background, to estimate live agreement and accuracy (0 = no audit)."""

    audit_window: int = Field(default=2000, ge=10, le=1_000_000)
    """Audited rows the agreement, the accuracy estimate and the drift test look at."""

    audit_min_rows: int = Field(default=100, ge=1)
    """Audited rows before a drift verdict or an accuracy estimate."""

    drift_z: float = Field(default=3.0, gt=0)
    """Drift alarm: live agreement this many standard deviations below what the calibration
    split predicts for the same rows."""

    drift_psi: float = Field(default=0.05, gt=0)
    """Confidence drift: the last 2,000 rows' edge confidences must differ from the calibration
    split's by at least this population stability index (and significantly, p < 0.001)."""

    audit_in_flight: int = Field(default=4, ge=1, le=256)
    """Audit calls to the center at once; audit rows beyond them are skipped, never queued."""

    @model_validator(mode="after")
    def _centers_over_tls(self) -> EdgeSettings:
        plain = [c.url for c in parse_list(self.center_url) if not c.tls]
        if self.center_ca is not None and plain:
            raise ValueError(f"center_ca is set, so centers are reached over TLS only "
                             f"(https://, grpcs://); center_url lists {plain[0]}")
        return self
