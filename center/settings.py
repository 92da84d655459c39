"""The center's settings: ``CENTER_*`` variables, ``center --flag`` overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from serving.settings import ServingSettings


class CenterSettings(ServingSettings):
    model_config = SettingsConfigDict(env_prefix="CENTER_", extra="forbid", frozen=True,
                                      use_attribute_docstrings=True)

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
