"""The center's settings: ``CENTER_*`` variables, ``center --flag`` overrides."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from serving.config.settings import ServingSettings


class CenterSettings(ServingSettings):
    model_config = SettingsConfigDict(env_prefix="CENTER_", extra="forbid", frozen=True,
                                      use_attribute_docstrings=True)
    TIER: ClassVar[str] = "center"

    port: int = Field(default=8100, ge=0, le=65535)
    """HTTP port of the V2 API (the escalation API) and /metrics."""

    grpc_port: int = Field(default=8101, ge=0, le=65535)
    """gRPC port of the V2 API (``inference.GRPCInferenceService``, health, reflection);
    0 = no gRPC."""

    store: Path = Path("./var/center")
    """Model store folder holding the TorchScript artifacts (registry pull --tier center)."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where models run: auto picks CUDA when a GPU is present, else CPU."""

    precision: Literal["fp32", "fp16", "bf16"] = "fp32"
    """Weights and activations on CUDA (fp16/bf16 halve memory and usually time); CPU is
    always fp32."""

    capacity_rows_s: float | None = Field(default=None, gt=0)
    """Rows per second this center offers to escalations (reported to the registry, which
    splits it into the edges' budgets); unset = measured from its batches: the rows per second
    of the largest batch that computes within half of ``latency_target_ms``, x
    ``capacity_headroom``."""

    capacity_headroom: float = Field(default=0.8, gt=0, le=1)
    """Share of the measured throughput offered: below 1 so the queue, and the latency, stay
    short at the budget."""

    latency_target_ms: float = Field(default=1000.0, gt=0)
    """Escalation latency the measured capacity is held to (a batch computes within half of
    it while the next one waits); keep it under the edges' ``center_timeout_s``."""
