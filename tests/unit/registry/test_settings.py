from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from registry.settings import RegistrySettings


def test_defaults_env_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REGISTRY_HOME", "REGISTRY_GRPC_PORT", "REGISTRY_TOKEN", "REGISTRY_ACTOR"):
        monkeypatch.delenv(name, raising=False)
    defaults = RegistrySettings()
    assert defaults.home == Path("./var/registry") and defaults.grpc_port == 50051
    assert defaults.token is None and "@" in defaults.actor
    monkeypatch.setenv("REGISTRY_HOME", "/srv/registry")
    monkeypatch.setenv("REGISTRY_TOKEN", "s3cret")
    from_env = RegistrySettings()
    assert from_env.database == Path("/srv/registry/registry.sqlite3")
    assert from_env.token is not None and from_env.token.get_secret_value() == "s3cret"
    assert "s3cret" not in repr(from_env)
    assert RegistrySettings(home=Path("/flag")).home == Path("/flag")  # flags win over env


def test_invalid_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_GRPC_PORT", "99999")
    with pytest.raises(ValidationError):
        RegistrySettings()
