"""The whole compose stack, for real: every image built, every container run on a private
dockerd (``scripts/docker_here.sh``), the flow a user follows end to end.

compose up → containers and Consul healthy → ``registry publish`` inside the primary registry's
container → the center and both edges ACTIVE → JSON and gRPC through nginx, escalations answered
by the center → an edge's process SIGKILLed under load (clients retrying once see no failure; the
container restarts and syncs) → the primary registry's container killed: the standby takes over,
a publish through it reaches every container (they follow the primary through Consul) →
``compose down -v``.

The release is a tiny one (``examples/sentiment/tiny.py``: the demo's architecture and
tokenizer, trained in ~20 s while the images build), so no ``make demo`` is needed. Needs root,
Debian's docker.io and mmdebstrap (the script installs them) and a few minutes: run by ``make
compose-test``, skipped without ``--containers``. The figures (image sizes, build, start,
failover and rollout times) are printed and written to var/docker/compose-test.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

# A cold run builds every image first (bases, torch twice): far beyond the suite's 600 s.
pytestmark = [pytest.mark.containers, pytest.mark.slow, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts/docker_here.sh"
STATE = ROOT / "var/docker"
RELEASE = STATE / "release"  # under var/, readable by the containers' user (pytest's tmp is 0700)
REGISTRIES = ("registry", "registry-standby")  # compose services = the addresses they advertise
# INT8 agreement of the tiny edge depends on the CPU (as in tests/conftest.py's TEST_FLOOR)
PUBLISH = ("registry", "publish", "/release", "--name", "sentiment", "--min-fidelity", "0.9")
PROJECT_LABEL = "com.docker.compose.project=tiered"  # docker-compose.yml's `name:`
SERVICES = ("consul", *REGISTRIES, "center", "edge-eu", "edge-us", "nginx", "prometheus-targets",
            "prometheus", "alertmanager")
NODES = {"center-eu-1", "edge-eu-1", "edge-us-1"}
IMAGES = ("tiered/registry:0.1.0", "tiered/center:0.1.0-cpu", "tiered/edge:0.1.0",
          "tiered/nginx:0.1.0", "tiered/monitoring:0.1.0")
TEXTS = ["a wonderful, moving film", "dull and far too long", "it was fine, I guess",
         "the best thing I saw this year", "not my cup of tea", "an uneven but charming story"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Stack:
    env: dict[str, str]
    http: str
    grpc_port: int
    consul: str
    secrets: dict[str, str]
    figures: dict[str, Any] = field(default_factory=dict)
    prometheus: str = ""  # Prometheus's loopback port on the host
    primary: str = "registry"  # the registry service holding the lock (``wait_primary``)

    def compose(self, *args: str, timeout: float = 600) -> str:
        return _script(self.env, "compose", *args, timeout=timeout).stdout

    def docker(self, *args: str) -> str:
        proc = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, f"docker {args}: {proc.stderr}"
        return proc.stdout

    def container(self, service: str) -> dict[str, Any]:
        """The service's container, found by compose's labels (polled every second: no compose
        run, no wheel server for each look)."""
        ids = self.docker("ps", "-a", "-q", "--filter", f"label={PROJECT_LABEL}", "--filter",
                          f"label=com.docker.compose.service={service}").split()
        assert len(ids) == 1, f"containers for {service}: {ids}"
        return dict(json.loads(self.docker("inspect", ids[0]))[0])

    def health(self, service: str) -> str:
        state = self.container(service)["State"]
        return str(state.get("Health", {}).get("Status", state["Status"]))

    def status(self) -> dict[str, dict[str, Any]]:
        rows = json.loads(self.compose("exec", "-T", self.primary, "registry", "status",
                                       "--json"))
        return {row["node"]: row for row in rows if row["model"] == "sentiment"}

    def wait_active(self, version: int, timeout: float = 240) -> float:
        started = time.monotonic()
        while True:
            rows = self.status()
            if set(rows) >= NODES and all(rows[n]["state"] == "ACTIVE" and rows[n]["version"]
                                          == version and rows[n]["connected"] for n in NODES):
                return time.monotonic() - started
            assert time.monotonic() - started < timeout, rows
            time.sleep(1)

    def wait_healthy(self, services: tuple[str, ...], timeout: float = 300) -> float:
        started = time.monotonic()
        while True:
            states = {s: self.health(s) for s in services}
            if set(states.values()) == {"healthy"}:
                return time.monotonic() - started
            assert time.monotonic() - started < timeout, states
            time.sleep(1)

    def wait_primary(self, among: tuple[str, ...] = REGISTRIES, timeout: float = 120) -> float:
        """Wait until one of ``among`` is the primary (the passing ``tiered-registry`` instance
        in Consul, registered under its service name) and make it ``primary``."""
        started = time.monotonic()
        token = {"X-Consul-Token": self.secrets["CONSUL_MANAGEMENT_TOKEN"]}
        while True:
            entries = httpx.get(f"{self.consul}/v1/health/service/tiered-registry?passing=1",
                                headers=token, timeout=10).json()
            found = [e["Service"]["Address"] for e in entries]
            if len(found) == 1 and found[0] in among:
                self.primary = found[0]
                return time.monotonic() - started
            assert time.monotonic() - started < timeout, found
            time.sleep(0.5)

    def infer(self, client: httpx.Client, text: str, **parameters: Any) -> httpx.Response:
        body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": [text]}],
                "parameters": parameters}
        return client.post(f"{self.http}/v2/models/sentiment/infer", json=body, timeout=30)


def _script(env: dict[str, str], *args: str,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``scripts/docker_here.sh ARGS``; it must succeed."""
    proc = subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, f"{args}: {proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc


def _timed(env: dict[str, str], *args: str, timeout: float) -> float:
    started = time.monotonic()
    _script(env, *args, timeout=timeout)
    return time.monotonic() - started


def _tiny_release() -> float:
    """Train the tiny release into RELEASE (mounted at /release), readable by the containers'
    user whatever the umask; the seconds it took."""
    from examples.sentiment.tiny import build_tiny_release

    started = time.monotonic()
    shutil.rmtree(RELEASE, ignore_errors=True)
    build_tiny_release(RELEASE)
    for path in (RELEASE, *RELEASE.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return time.monotonic() - started


def _leftover_mounts() -> list[str]:
    """Mounts of the private dockerd (its data root, its exec root's netns) still in place."""
    exec_root = "/run/tiered-docker-" + hashlib.sha256(str(STATE).encode()).hexdigest()[:8]
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    return [p for p in points if p.startswith((exec_root, str(STATE / "data")))]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if os.geteuid() != 0:
        pytest.skip("a private dockerd needs root")
    folder = tmp_path_factory.mktemp("compose")
    http_port, grpc_port, consul_port = _free_port(), _free_port(), _free_port()
    prometheus_port, alertmanager_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DOCKER_", "COMPOSE_"))}
    env.update(TIERED_COMPOSE_ENV=str(folder / "compose.env"), TIERED_HTTP_PORT=str(http_port),
               TIERED_GRPC_PORT=str(grpc_port), TIERED_CONSUL_PORT=str(consul_port),
               TIERED_PROMETHEUS_PORT=str(prometheus_port),
               TIERED_ALERTMANAGER_PORT=str(alertmanager_port),
               TIERED_RELEASE=str(RELEASE))
    pidfile = STATE / "dockerd.pid"
    already = pidfile.is_file() and Path(f"/proc/{pidfile.read_text().strip()}").exists()
    figures: dict[str, Any] = {}
    figures["dockerd_start_s"] = _timed(env, "start", timeout=300)
    started_pid = None if already else int(pidfile.read_text())
    training = ThreadPoolExecutor(1).submit(_tiny_release)  # beside the image builds
    try:
        for item in _script(env, "env", timeout=60).stdout.split()[1:]:
            key, _, value = item.partition("=")
            env[key] = value
        figures["bases_s"] = _timed(env, "bases", timeout=900)
        figures["build_s"] = _timed(env, "build", timeout=1800)
        figures["tiny_release_s"] = round(training.result(timeout=600), 1)
        secrets = dict(line.split("=", 1) for line in
                       (folder / "compose.env").read_text().splitlines() if "=" in line)
        stack = Stack(env, f"http://127.0.0.1:{http_port}", grpc_port,
                      f"http://127.0.0.1:{consul_port}", secrets, figures,
                      prometheus=f"http://127.0.0.1:{prometheus_port}")
        try:
            yield stack
        finally:
            _script(env, "compose", "down", "-v", "--remove-orphans", "--timeout", "20",
                    timeout=300)
            left = {kind: stack.docker(kind, "ls", "-q", "--filter", f"label={PROJECT_LABEL}",
                                       *(["-a"] if kind == "container" else [])).split()
                    for kind in ("container", "volume", "network")}
            assert left == {"container": [], "volume": [], "network": []}, left
    finally:
        if started_pid is not None:
            _script(env, "stop", timeout=120)
            assert not Path(f"/proc/{started_pid}").exists()
            assert _leftover_mounts() == []
        figures_file = STATE / "compose-test.json"
        figures_file.parent.mkdir(parents=True, exist_ok=True)
        figures_file.write_text(json.dumps(figures, indent=2) + "\n")
        print("\ncompose test figures:\n" + json.dumps(figures, indent=2))


class Load:
    """Clients through nginx, each retrying a failed request (5xx or no answer) once."""

    def __init__(self, stack: Stack, clients: int = 2) -> None:
        self.stack, self.stop = stack, threading.Event()
        self.ok = self.retried = 0
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True)
                        for i in range(clients)]

    def attempt(self, client: httpx.Client, text: str) -> str | None:
        try:
            answer = self.stack.infer(client, text)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        if answer.status_code != 200:
            return f"{answer.status_code}: {answer.text[:200]}"
        return None

    def run(self, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client() as client:
            while not self.stop.is_set():
                text = rng.choice(TEXTS)
                error = self.attempt(client, text)
                if error is not None:
                    with self.lock:
                        self.retried += 1
                    error = self.attempt(client, text)
                with self.lock:
                    if error is None:
                        self.ok += 1
                    else:
                        self.failures.append(error)
                time.sleep(0.02)

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=60)


def test_the_compose_stack_end_to_end(stack: Stack) -> None:
    figures = stack.figures
    figures["images_mb"] = {
        image: round(int(stack.docker("image", "inspect", "-f", "{{.Size}}", image)) / 1e6)
        for image in IMAGES}
    # A CPU edge carries no torch, no compiler, no test tools.
    edge_has = stack.docker("run", "--rm", "--entrypoint", "sh", "tiered/edge:0.1.0", "-c",
                            "python -c 'import torch' 2>/dev/null && echo torch; "
                            "command -v gcc cc 2>/dev/null; pip list 2>/dev/null | "
                            "grep -i -E '^(pytest|faker|polyfactory|huggingface)' || true")
    assert edge_has.strip() == "", edge_has

    # compose up: the infrastructure healthy, the tiers up and waiting for a release (their
    # readiness answers 503 until one is active)
    started = time.monotonic()
    stack.compose("up", "-d", timeout=600)
    stack.wait_healthy(("consul", *REGISTRIES, "nginx"))
    figures["up_to_infrastructure_healthy_s"] = round(time.monotonic() - started, 1)
    for job in ("consul-acl", "signing-key"):
        assert stack.container(job)["State"]["ExitCode"] == 0, job
    stack.wait_primary(("registry",))  # the standby joins (REGISTRY_JOIN): it never leads first

    # publish inside the primary's container; every node downloads, verifies and activates it
    started = time.monotonic()
    out = stack.compose("exec", "-T", stack.primary, *PUBLISH, timeout=900)
    figures["publish_s"] = round(time.monotonic() - started, 1)
    assert "cascade accuracy" in out
    stack.wait_active(1)
    figures["publish_to_all_active_s"] = round(time.monotonic() - started, 1)
    stack.wait_healthy(SERVICES)
    figures["publish_to_all_healthy_s"] = round(time.monotonic() - started, 1)

    # every service passing in Consul (HTTP and gRPC checks of each tier, the registry's)
    token = {"X-Consul-Token": stack.secrets["CONSUL_MANAGEMENT_TOKEN"]}
    deadline = time.monotonic() + 60
    while True:
        checks = httpx.get(f"{stack.consul}/v1/health/state/any", headers=token,
                           timeout=10).json()
        names = {c["ServiceName"] for c in checks if c["ServiceName"]}
        failing = [(c["ServiceID"], c["Name"], c["Status"]) for c in checks
                   if c["Status"] != "passing"]
        if not failing and {"tiered-edge", "tiered-center", "tiered-registry"} <= names:
            break
        assert time.monotonic() < deadline, (failing, names)
        time.sleep(1)
    edge_checks = [c for c in checks if c["ServiceName"] == "tiered-edge"]
    assert len({c["ServiceID"] for c in edge_checks}) == 2
    assert {c["Type"] for c in edge_checks} >= {"http", "grpc"}

    # Prometheus found every node through Consul (prometheus-targets) and scrapes it
    def scraped() -> dict[str, str]:
        found = httpx.get(f"{stack.prometheus}/api/v1/targets", timeout=10).json()
        return {t["labels"].get("node", t["labels"]["job"]): t["health"]
                for t in found["data"]["activeTargets"]}

    deadline = time.monotonic() + 90
    while not (set(scraped()) >= NODES and set(scraped().values()) == {"up"}):
        assert time.monotonic() < deadline, scraped()
        time.sleep(2)
    figures["prometheus_targets"] = sorted(scraped())

    # JSON through nginx: confident rows at an edge, unsure ones answered by the center
    with httpx.Client() as client:
        answer = stack.infer(client, TEXTS[0])
        assert answer.status_code == 200, answer.text
        outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
        assert outputs["label"][0] in ("fresh", "rotten")
        escalated = stack.infer(client, TEXTS[2], threshold=1.0)
        assert escalated.status_code == 200, escalated.text
        body = escalated.json()
        assert {o["name"]: o["data"] for o in body["outputs"]}["tier"] == ["center"]
        assert body["parameters"]["escalated"] == 1 and body["parameters"]["degraded"] == 0
        assert body["parameters"]["center_version"] == "1"

    # gRPC V2 through nginx's HTTP/2 entry, the real Triton client
    import numpy as np
    import tritonclient.grpc as triton_grpc

    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
    assert grpc.is_server_ready() and grpc.is_model_ready("sentiment")
    text = triton_grpc.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in TEXTS[:2]], dtype=object))
    result = grpc.infer("sentiment", [text], parameters={"threshold": 1.0})
    assert [v.decode() for v in result.as_numpy("tier")] == ["center", "center"]
    assert result.as_numpy("confidence").shape == (2,)

    # An edge crashes under load (SIGKILL to its process, by PID: `docker kill` would count as
    # a manual stop, which restart policies leave alone): clients that retry once see no
    # failure; the container restarts (restart: unless-stopped), syncs, is ACTIVE and healthy
    edge = stack.container("edge-eu")
    restarts = edge["RestartCount"]
    with Load(stack) as load:
        time.sleep(3)
        killed = time.monotonic()
        os.kill(edge["State"]["Pid"], signal.SIGKILL)
        while stack.container("edge-eu")["RestartCount"] == restarts:
            assert time.monotonic() - killed < 60, "edge-eu was not restarted"
            time.sleep(0.5)
        figures["kill_to_restarted_s"] = round(time.monotonic() - killed, 1)
        stack.wait_active(1)
        stack.wait_healthy(("edge-eu",), timeout=120)
        figures["kill_to_edge_healthy_s"] = round(time.monotonic() - killed, 1)
        time.sleep(3)
    figures["load_during_kill"] = {"answered": load.ok, "retried_once": load.retried,
                                   "failed_after_retry": len(load.failures)}
    assert load.failures == [], load.failures[:5]
    assert load.ok > 50

    # The primary registry's container is killed (a manual stop: it stays down). The standby
    # takes the Consul lock and registers as tiered-registry; a second publish (version 2),
    # through it, reaches every container: they follow the primary through Consul.
    lost = stack.primary
    killed = time.monotonic()
    stack.docker("kill", stack.container(lost)["Id"])
    stack.wait_primary(tuple(r for r in REGISTRIES if r != lost))
    figures["primary_killed_to_standby_primary_s"] = round(time.monotonic() - killed, 1)
    started = time.monotonic()
    stack.compose("exec", "-T", stack.primary, *PUBLISH, timeout=900)
    stack.wait_active(2)
    figures["publish_through_standby_to_all_active_s"] = round(time.monotonic() - started, 1)
    with httpx.Client() as client:
        for text in TEXTS[:3]:
            answer = stack.infer(client, text, threshold=1.0).json()
            assert answer["model_version"] == "2"
            assert answer["parameters"]["center_version"] == "2"
    grpc.close()
