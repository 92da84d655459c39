"""The registry's flags come from RegistrySettings: their env variables, defaults and ranges
are the settings', stated once."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from registry.cli import main as rcli
from registry.cli.home import Home
from registry.settings import RegistrySettings
from registry.store.db import connect
from serving.config.flags import options

FLAGS = [([], "--home", "home"), ([], "--actor", "actor"), ([], "--signing-key", "signing_key"),
         (["publish"], "--min-fidelity", "min_fidelity"),
         (["publish"], "--tolerance", "tolerance"), (["publish"], "--confidence", "confidence"),
         (["serve"], "--host", "host"), (["serve"], "--port", "grpc_port"),
         (["serve"], "--metrics-port", "metrics_port"), (["serve"], "--tls-cert", "tls_cert"),
         (["serve"], "--tls-key", "tls_key")]


def help_of(args: list[str], flag: str) -> str:
    """``flag``'s entry in ``registry ARGS --help``, its wrapped lines joined."""
    result = CliRunner().invoke(rcli.cli, [*args, "--help"])
    assert result.exit_code == 0, result.output
    options = result.output.split("Options:")[1]
    entries = re.split(r"\n  (?=-)", options)
    entry = next(e for e in entries if e.strip().startswith(flag + " "))
    return re.sub(r"\s+", " ", entry)


@pytest.mark.parametrize(("args", "flag", "field"), FLAGS)
def test_help_states_the_settings_env_and_default(args: list[str], flag: str,
                                                   field: str) -> None:
    info = RegistrySettings.model_fields[field]
    default = "computed" if info.default_factory else info.default
    text = help_of(args, flag)
    assert f"[env: REGISTRY_{field.upper()}; default: {default}]" in text
    assert (info.description or "").split()[0] in text  # the field's docstring is the help


def test_help_shows_the_documented_defaults() -> None:
    assert "default: var/registry" in help_of([], "--home")
    assert "REGISTRY_GRPC_PORT; default: 50051" in help_of(["serve"], "--port")
    assert "default: 0.97]" in help_of(["publish"], "--min-fidelity")


def test_secrets_never_become_flags() -> None:
    result = CliRunner().invoke(rcli.cli, ["serve", "--help"])
    assert "--token " not in result.output


def test_env_sets_a_value_and_the_flag_wins(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[RegistrySettings] = []

    class Recording(rcli.Context):
        def __init__(self, settings: RegistrySettings, home: Home | None = None) -> None:
            super().__init__(settings, home)
            seen.append(self.settings)

    monkeypatch.setattr(rcli, "Context", Recording)
    for made in ("from-env", "flag"):  # registries both: a folder that is not one is refused
        connect(tmp_path / made / "registry.sqlite3").conn.close()
    env = {"REGISTRY_ACTOR": "alice@ci", "REGISTRY_HOME": str(tmp_path / "from-env")}
    result = CliRunner().invoke(rcli.cli, ["list", "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert seen[-1].actor == "alice@ci" and seen[-1].home == tmp_path / "from-env"
    result = CliRunner().invoke(rcli.cli, ["--actor", "bob@ci", "--home", str(tmp_path / "flag"),
                                           "list", "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert seen[-1].actor == "bob@ci" and seen[-1].home == tmp_path / "flag"


@pytest.mark.parametrize(("args", "value"), [(["publish", "x", "--name", "m", "--min-fidelity"],
                                              "1.5"),
                                             (["publish", "x", "--name", "m", "--confidence"],
                                              "1"),
                                             (["serve", "--port"], "70000"),
                                             (["serve", "--metrics-port"], "-1")])
def test_out_of_range_is_refused_by_the_settings_bounds(args: list[str], value: str,
                                                        tmp_path: Path) -> None:
    result = CliRunner().invoke(rcli.cli, ["--home", str(tmp_path), *args, value])
    assert result.exit_code == 2 and "range" in result.output, result.output


def test_generated_options_follow_field_order_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    got: dict[str, object] = {}

    @click.command()
    @options(RegistrySettings, ("tolerance", "grpc_port"), flags={"grpc_port": "port"})
    def command(**flags: object) -> None:
        got.update(RegistrySettings(**{k: v for k, v in flags.items() if v is not None})
                   .model_dump(include={"tolerance", "grpc_port"}))

    assert [p.name for p in command.params] == ["tolerance", "grpc_port"]
    monkeypatch.setenv("REGISTRY_TOLERANCE", "0.02")
    assert CliRunner().invoke(command, ["--port", "6000"]).exit_code == 0
    assert got == {"tolerance": 0.02, "grpc_port": 6000}
