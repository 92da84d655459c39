"""Tier and registry processes on loopback for the tests and the benchmarks: start
``center``/``edge``/``registry serve`` on a free port, wait until it answers ready, stop it by
PID (the launcher's own children are ``tiered.processes``)."""

from __future__ import annotations

import os
import ssl
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
import httpx

from tiered.commands import (
    BIN,
    console_argv,
    region_of,
    registry_argv,
    registry_env,
    tier_argv,
    tier_env,
)
from tiered.processes import RunningProcess, free_port

__all__ = [
    "BIN",
    "RegistryProcess",
    "RunningProcess",
    "TierProcess",
    "free_port",
    "start_console",
    "start_registry",
    "start_tier",
]


P = TypeVar("P", bound=RunningProcess)


@dataclass
class TierProcess(RunningProcess):
    scheme: str = "http"
    node: str = ""  # its node id, when not <tier>-<port>

    @property
    def tier(self) -> str:
        return self.name

    @property
    def node_id(self) -> str:
        return self.node or f"{self.name}-{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"


@dataclass
class RegistryProcess(RunningProcess):
    metrics_port: int

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


def code_path() -> dict[str, str]:
    """``PYTHONPATH`` when the tests run with one (a worktree ahead of the installed copy): the
    registry they start runs the same code as they do."""
    return {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}


def start_registry(home: Path, log_dir: Path, token: str, *flags: str, port: int | None = None,
                   timeout: float = 30, env: dict[str, str] | None = None,
                   ca: Path | None = None) -> RegistryProcess:
    """Run ``registry serve``; return once its gRPC health check answers SERVING (over TLS
    verified against ``ca`` when given)."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc  # grpc only where it is used

    port = port or free_port()
    metrics_port = free_port()
    log = log_dir / f"registry-{port}.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            registry_argv(home, port, metrics_port, *flags), stdout=out,
            stderr=subprocess.STDOUT,
            env=registry_env({"PATH": str(BIN), **code_path(), **(env or {})}, token))
    server = RegistryProcess("registry", port, process, log, metrics_port)
    channel = (grpc.secure_channel(server.target, grpc.ssl_channel_credentials(ca.read_bytes()))
               if ca else grpc.insecure_channel(server.target))
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)

        def serving() -> bool:
            try:
                return bool(stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status ==
                            health_pb2.HealthCheckResponse.SERVING)
            except grpc.RpcError:
                return False

        return _ready(server, serving, timeout)


def _ready(server: P, ready: Callable[[], bool], timeout: float) -> P:
    """Return ``server`` once ``ready()``; stop it and raise (with its log) if it exits first
    or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.name} exited {server.process.returncode}: "
                               f"{server.log.read_text()[-2000:]}")
        if ready():
            return server
        time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"{server.name} not ready after {timeout}s: "
                       f"{server.log.read_text()[-2000:]}")


def start_tier(tier: str, store: Path, log_dir: Path, *flags: str, timeout: float = 60,
               env: dict[str, str] | None = None, until: str = "ready",
               registry_secret: str | None = None, ca: Path | None = None,
               node_id: str | None = None) -> TierProcess:
    """Run ``tier`` on a free 127.0.0.1 port; return once /v2/health/``until`` answers 200
    (``live`` for a node with an empty store: it is not ready until sync installs a model).
    With ``registry_secret`` the node gets its own token (derived for its node id) in
    REGISTRY_TOKEN; with ``ca`` it serves HTTPS and readiness is checked against ``ca``."""
    port = free_port()
    node_id = node_id or f"{tier}-{port}"
    log = log_dir / f"{tier}-{port}.log"
    if registry_secret is not None:
        base = env if env is not None else os.environ
        env = tier_env(base, tier, node_id, registry_secret,
                       region=region_of(flags, base, tier))
    with log.open("wb") as out:
        process = subprocess.Popen(tier_argv(tier, port, store, node_id, *flags), stdout=out,
                                   stderr=subprocess.STDOUT, env=env)
    server = TierProcess(tier, port, process, log, "https" if ca is not None else "http", node_id)
    verify = ssl.create_default_context(cafile=str(ca)) if ca is not None else True

    def ready() -> bool:
        try:
            return httpx.get(f"{server.url}/v2/health/{until}", timeout=1,
                             verify=verify).status_code == 200
        except httpx.HTTPError:
            return False

    return _ready(server, ready, timeout)


def start_console(home: Path, log_dir: Path, credential: Path, *flags: str,
                  timeout: float = 30) -> TierProcess:
    """Run ``tiered console`` on a free port over the registry at ``home``; return once its
    /console/healthz answers."""
    port = free_port()
    log = log_dir / f"console-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(console_argv(home, port, credential, *flags), stdout=out,
                                   stderr=subprocess.STDOUT,
                                   env={"PATH": str(BIN), **code_path()})
    server = TierProcess("console", port, process, log)

    def ready() -> bool:
        try:
            return httpx.get(f"{server.url}/console/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    return _ready(server, ready, timeout)
