"""One command line (and environment) per role: ``registry serve``, a tier (``center`` or
``edge``), the nginx renderer, and the registry's one-shot commands. ``harness.processes``
(the tests' and benchmarks' launcher) and ``tiered.stack`` (``tiered up``) both build theirs
here, so a role starts the same way whoever starts it. Secrets go in the environment, never in argv
(``ps`` shows argv to anyone)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from serving.config.tokens import node_token

BIN = Path(sys.executable).parent
LOOPBACK = "127.0.0.1"


def registry_cli(home: Path, *args: str) -> list[str]:
    """``registry --home HOME ARGS…``."""
    return [str(BIN / "registry"), "--home", str(home), *args]


def registry_argv(home: Path, port: int, metrics_port: int, *flags: str) -> list[str]:
    """``registry serve`` on ``port`` (gRPC) with its /metrics on ``metrics_port``."""
    return registry_cli(home, "serve", "--port", str(port), "--metrics-port",
                        str(metrics_port), *flags)


def registry_env(base: Mapping[str, str], secret: str,
                 tls: Path | None = None) -> dict[str, str]:
    """``base`` plus the registry's secret and, with ``tls`` (a folder made by
    ``registry tls``), its certificate and key."""
    env = {**base, "REGISTRY_TOKEN": secret}
    if tls is not None:
        env |= {"REGISTRY_TLS_CERT": str(tls / "registry.pem"),
                "REGISTRY_TLS_KEY": str(tls / "registry.key")}
    return env


def tier_argv(tier: str, port: int, store: Path, node_id: str, *flags: str,
              release_key: Path | None = None, region: str | None = None,
              grpc_port: int = 0) -> list[str]:
    """``center``/``edge`` on 127.0.0.1:``port`` (and gRPC on ``grpc_port``; 0: none) serving
    ``store`` as ``node_id``; ``flags`` last (they win over what is set here)."""
    argv = [str(BIN / tier), "--host", LOOPBACK, "--port", str(port), "--grpc-port",
            str(grpc_port), "--store", str(store), "--node-id", node_id]
    if release_key is not None:
        argv += ["--release-key", str(release_key)]
    if region is not None:
        argv += ["--region", region]
    return [*argv, *flags]


def region_of(argv: Sequence[str], env: Mapping[str, str], tier: str) -> str:
    """The region a tier started with ``argv`` and ``env`` runs in: its last ``--region``,
    else ``<TIER>_REGION``, else ``local`` (the settings' default)."""
    region = env.get(f"{tier.upper()}_REGION", "local")
    for i, arg in enumerate(argv):
        if arg == "--region" and i + 1 < len(argv):
            region = argv[i + 1]
        elif arg.startswith("--region="):
            region = arg.partition("=")[2]
    return region


def tier_env(base: Mapping[str, str], tier: str, node_id: str, secret: str | None,
             ca: Path | None = None, region: str = "local") -> dict[str, str]:
    """``base`` plus, with the registry's ``secret``, the node's own token (derived for
    ``node_id``, ``tier`` and ``region``: it proves that node and no other) and, with ``ca``,
    the CA its registry must prove itself with (``<TIER>_REGISTRY_CA``)."""
    env = dict(base)
    if secret is not None:
        env["REGISTRY_TOKEN"] = node_token(secret, node_id, tier, region)
    if ca is not None:
        env[f"{tier.upper()}_REGISTRY_CA"] = str(ca)
    return env


def nginx_argv(prefix: Path, listen: str, *flags: str,
               grpc_listen: str | None = None) -> list[str]:
    """The Consul-fed nginx renderer, running nginx under ``prefix`` on ``listen`` (and gRPC
    on ``grpc_listen``)."""
    grpc = ["--grpc-listen", grpc_listen] if grpc_listen else []
    return [sys.executable, "-m", "nginx.render", "--prefix", str(prefix), "--listen", listen,
            *grpc, "--run-nginx", *flags]


def console_argv(home: Path, port: int, credential: Path, *flags: str) -> list[str]:
    """The fleet console on 127.0.0.1:``port`` reading the registry at ``home`` read-only,
    its operator secret in ``credential`` (made, 0600, when missing); ``flags``:
    ``--prometheus URL``, ``--alertmanager URL``, ``--consul-ui URL``. The entry nginx passes
    /console/ to it with ``--console 127.0.0.1:PORT``."""
    return [str(BIN / "tiered"), "console", "--registry-home", str(home), "--listen",
            f"{LOOPBACK}:{port}", "--credential-file", str(credential), *flags]
