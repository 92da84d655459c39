"""One command line per role: what ``tiered up`` (the stack) and the tests' launcher start."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from serving.config import bundle
from serving.config.tokens import node_token
from tiered import bundles, commands
from tiered.cli import tracing_env
from tiered.commands import BIN
from tiered.fleet_config import EDGE_TLS
from tiered.settings import TieredSettings
from tiered.stack import Stack

SECRET = "stack-secret-0123456789"


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_registry_serve_argv_and_env() -> None:
    argv = commands.registry_argv(Path("/r/home"), 50051, 9300, "--host", "0.0.0.0")
    assert argv == [str(BIN / "registry"), "--home", "/r/home", "serve", "--port", "50051",
                    "--metrics-port", "9300", "--host", "0.0.0.0"]
    env = commands.registry_env({"PATH": "/bin"}, SECRET, Path("/tls"))
    assert env == {"PATH": "/bin", "REGISTRY_TOKEN": SECRET,
                   "REGISTRY_TLS_CERT": "/tls/registry.pem",
                   "REGISTRY_TLS_KEY": "/tls/registry.key"}
    assert commands.registry_env({}, SECRET) == {"REGISTRY_TOKEN": SECRET}


def test_tier_argv_puts_extra_flags_last_and_secrets_only_in_env() -> None:
    argv = commands.tier_argv("edge", 8201, Path("/s/edge-eu-1"), "edge-eu-1", "--port", "9",
                              release_key=Path("/k/signing.pub"), region="eu")
    assert argv[0] == str(BIN / "edge")
    assert flag(argv, "--host") == "127.0.0.1" and flag(argv, "--store") == "/s/edge-eu-1"
    assert flag(argv, "--node-id") == "edge-eu-1" and flag(argv, "--region") == "eu"
    assert flag(argv, "--release-key") == "/k/signing.pub"
    assert argv[-2:] == ["--port", "9"]  # a caller's flag wins over the builder's (click: last)
    env = commands.tier_env({"PATH": "/bin"}, "edge", "edge-eu-1", SECRET, Path("/tls/ca.pem"),
                            region="eu")
    assert env == {"PATH": "/bin", "REGISTRY_TOKEN": node_token(SECRET, "edge-eu-1", "edge",
                                                                "eu"),
                   "EDGE_REGISTRY_CA": "/tls/ca.pem"}
    assert not any(SECRET in a or env["REGISTRY_TOKEN"] in a for a in argv)
    bare = commands.tier_argv("center", 8100, Path("/s/c"), "center-8100")
    assert "--release-key" not in bare and "--region" not in bare
    assert commands.tier_env({"A": "1"}, "center", "center-8100", None) == {"A": "1"}


def test_a_tiers_region_is_its_last_flag_else_its_variable() -> None:
    assert commands.region_of(["--x", "1"], {}, "edge") == "local"
    assert commands.region_of([], {"EDGE_REGION": "us"}, "edge") == "us"
    assert commands.region_of([], {"EDGE_REGION": "us"}, "center") == "local"
    assert commands.region_of(["--region", "eu", "--region=ap"], {"EDGE_REGION": "us"},
                              "edge") == "ap"


def test_nginx_argv() -> None:
    argv = commands.nginx_argv(Path("/root/nginx"), "127.0.0.1:8080", "--x")
    assert argv[1:] == ["-m", "nginx.render", "--prefix", "/root/nginx", "--listen",
                        "127.0.0.1:8080", "--run-nginx", "--x"]


class Spawned(Stack):
    """A stack that records what it would start instead of starting it."""

    def spawn(self, name: str, argv: list[str], port: int | None = None,  # type: ignore[override]
              role: str = "") -> tuple[list[str], dict[str, str]]:
        return argv, self.env(name, role)


def test_the_stack_starts_each_role_as_it_did(tmp_path: Path) -> None:
    stack = Spawned(tmp_path, tmp_path / "registry", SECRET, http_port=8080, consul_port=8500,
                    release_key=tmp_path / "signing.pub", tier_flags=("--log-level", "debug"),
                    consul_acl=False)
    argv, env = stack.start_registry()  # type: ignore[misc]
    assert argv[:5] == [str(BIN / "registry"), "--home", str(tmp_path / "registry"), "serve",
                        "--port"]
    assert "--metrics-port" in argv
    assert env["REGISTRY_TOKEN"] == SECRET and env["CONSUL_HTTP_ADDR"] == "127.0.0.1:8500"
    assert env["REGISTRY_TLS_CERT"] == str(tmp_path / "tls" / "registry.pem")
    assert env["REGISTRY_HOME"] == str(tmp_path / "registry")

    argv, env = stack.start_edge("edge-eu-west-1-store-0042", "eu")  # type: ignore[misc]
    assert argv[0] == str(BIN / "edge")
    for name, value in {"--release-key": str(tmp_path / "signing.pub"), "--host": "127.0.0.1",
                        "--store": str(tmp_path / "stores" / "edge-eu-west-1-store-0042"),
                        "--node-id": "edge-eu-west-1-store-0042", "--region": "eu",
                        "--sync-backoff-max-s": "2", "--log-level": "debug"}.items():
        assert flag(argv, name) == value, name
    # its bundle: its own token, certificate and the CA, no secret in argv or env
    edge = bundle.load(Path(env["EDGE_BUNDLE"]))
    assert (edge.node_id, edge.tier, edge.region) == ("edge-eu-west-1-store-0042", "edge", "eu")
    assert edge.token == bundles.token(SECRET, "edge-eu-west-1-store-0042", "edge", "eu")
    assert edge.ca == (tmp_path / "tls" / "ca.pem").read_text()
    assert "REGISTRY_TOKEN" not in env and edge.token not in " ".join(argv)
    assert env.get("EDGE_SERVE_TLS") == (None if EDGE_TLS else "false")

    argv, env = stack.start_center("center-1")  # type: ignore[misc]
    assert flag(argv, "--region") == "local" and flag(argv, "--node-id") == "center-1"
    center = bundle.load(Path(env["CENTER_BUNDLE"]))
    assert (center.node_id, center.tier) == ("center-1", "center")
    assert "CENTER_SERVE_TLS" not in env  # centers serve HTTPS from their bundle

    # without provisioning: a token and the CA, as before
    plain = Spawned(tmp_path, tmp_path / "registry", SECRET, consul_acl=False, provision=False,
                    release_key=tmp_path / "signing.pub")
    _, env = plain.start_edge("edge-eu-1", "eu")  # type: ignore[misc]
    assert env["REGISTRY_TOKEN"] == node_token(SECRET, "edge-eu-1", "edge", "eu")
    assert env["EDGE_REGISTRY_CA"] == str(tmp_path / "tls" / "ca.pem")

    argv, env = stack.start_nginx()  # type: ignore[misc]
    assert flag(argv, "--listen") == "127.0.0.1:8080"
    assert flag(argv, "--prefix") == str(tmp_path / "nginx") and "--run-nginx" in argv
    assert "REGISTRY_TOKEN" not in env


def test_tiered_up_points_only_the_tiers_at_the_collector(tmp_path: Path) -> None:
    settings = TieredSettings(otlp_endpoint="http://127.0.0.1:4317")
    tracing = tracing_env(settings, {"OTEL_SERVICE_NAME": "ignored with the flag"})
    assert tracing == {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317",
                       "OTEL_EXPORTER_OTLP_INSECURE": "true"}
    # without the flag: the OTEL_* variables tiered runs with, and nothing else
    passed = tracing_env(TieredSettings(), {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4317",
                                            "OTEL_EXPORTER_OTLP_HEADERS": "a=b", "HOME": "/x"})
    assert passed == {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4317",
                      "OTEL_EXPORTER_OTLP_HEADERS": "a=b"}
    stack = Spawned(tmp_path, tmp_path / "registry", SECRET, consul_acl=False, tracing=tracing)
    _, edge = stack.start_edge("edge-1", "eu")  # type: ignore[misc]
    _, center = stack.start_center("center-1")  # type: ignore[misc]
    _, registry = stack.start_registry()  # type: ignore[misc]
    _, nginx = stack.start_nginx()  # type: ignore[misc]
    assert edge["OTEL_EXPORTER_OTLP_ENDPOINT"] == center["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert not any(k.startswith("OTEL_") for k in {**registry, **nginx})


@pytest.mark.parametrize("endpoint", ["127.0.0.1:4317", "http://c:4317/\nx", "ftp://c",
                                      "http://c:4317\n", "http://c:4317 --flag"])
def test_a_collector_endpoint_must_be_a_plain_url(endpoint: str) -> None:
    with pytest.raises(ValidationError):
        TieredSettings(otlp_endpoint=endpoint)
