from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from registry.settings import RegistrySettings


def test_defaults_env_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("REGISTRY_HOME", "REGISTRY_GRPC_PORT", "REGISTRY_TOKEN", "REGISTRY_ACTOR"):
        monkeypatch.delenv(name, raising=False)
    defaults = RegistrySettings()
    assert defaults.home == Path("./var/registry").absolute() and defaults.grpc_port == 50051
    assert defaults.token is None and "@" in defaults.actor
    monkeypatch.setenv("REGISTRY_HOME", "/srv/registry")
    monkeypatch.setenv("REGISTRY_TOKEN", "s3cret-0123456789abcdef")
    from_env = RegistrySettings()
    assert from_env.database == Path("/srv/registry/registry.sqlite3")
    assert from_env.token is not None
    assert from_env.token.get_secret_value() == "s3cret-0123456789abcdef"
    assert "s3cret-0123456789abcdef" not in repr(from_env)
    assert RegistrySettings(home=Path("/flag")).home == Path("/flag")  # flags win over env


@pytest.mark.parametrize("secret", ["", "   ", "fifteen-chars!!"])
def test_an_empty_or_short_secret_is_refused(monkeypatch: pytest.MonkeyPatch,
                                             secret: str) -> None:
    monkeypatch.setenv("REGISTRY_TOKEN", secret)
    with pytest.raises(ValidationError, match="at least 16 characters") as refused:
        RegistrySettings()
    if secret.strip():  # the refusal never echoes the almost-right secret
        assert secret not in str(refused.value)


def test_the_secret_can_come_from_a_file(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REGISTRY_TOKEN", raising=False)
    secret = tmp_path / "secret"
    secret.write_text("from-a-file-0123456789\n")
    settings = RegistrySettings(token_file=secret)
    assert settings.token is not None
    assert settings.token.get_secret_value() == "from-a-file-0123456789"
    secret.write_text("")
    with pytest.raises(ValidationError, match="is empty"):
        RegistrySettings(token_file=secret)


def test_invalid_values_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGISTRY_GRPC_PORT", "99999")
    with pytest.raises(ValidationError):
        RegistrySettings()
