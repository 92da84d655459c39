"""Tiered on Docker Swarm (``deploy/swarm/stack.yml``): the secrets a stack needs, and, for the
swarm test and its benchmark, a swarm of real ``dockerd`` nodes on one machine.

``provision(out, home)`` (``tiered swarm provision``) makes, in a 0700 folder, every file the
stack mounts as a Docker secret or config: the registry's secret, its Ed25519 signing key, the
fleet CA and the registry's TLS certificate (naming the services ``registry`` and
``registry-standby``), one provisioning bundle per node of the stack (its token, certificate and
key, made with ``registry node provision`` against the registry's own home, so the audit chain
records each and their directive floors are the chain's), the Consul tokens per role and the
gossip key. Nothing is printed; a value received from a network never reaches these files.

``Cluster`` (root): a node per network namespace (``tiered.netns``), each running its own
``dockerd`` in new UTS, PID and mount namespaces (``nsenter --net`` + ``unshare``; ``ip netns
exec`` remounts /sys and the daemon then finds no devices cgroup). The daemon is PID 1 of its
PID namespace, so killing it takes every process of that node with it (containers, shims,
proxies: a lost host), and its mounts vanish with its mount namespace. Images are copied from
another engine with ``docker save | docker load``; no registry is asked for anything.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from registry.trust import keys, pki
from serving.config.tokens import write_secret
from tiered.commands import BIN, registry_cli
from tiered.netns import Host, Network

ROOT = Path(__file__).resolve().parent.parent
STACK = ROOT / "deploy" / "swarm" / "stack.yml"
IMAGE_UID = 10001  # the images' user `tiered`: it owns the registry's home
# The stack's nodes (deploy/swarm/stack.yml names a service and a bundle secret for each):
# node id -> (tier, region).
NODES = {"center-1": ("center", "center"), "edge-eu-1": ("edge", "eu"),
         "edge-eu-2": ("edge", "eu"), "edge-us-1": ("edge", "us")}
REGISTRY_NAMES = ("registry", "registry-standby")  # what the nodes dial; the certificate's SANs
CONSUL_ROLES = ("management", "agent", "registry", "center", "edge", "reader", "prometheus")


class SwarmError(RuntimeError):
    """A docker command or a node that failed; the message says which and why."""


# -- provisioning --------------------------------------------------------------------------


def provision(out: Path, home: Path, nodes: dict[str, tuple[str, str]] | None = None,
              owner: int | None = IMAGE_UID) -> list[Path]:
    """Every secret file of the stack in ``out`` (made 0700; refused when it already holds a
    registry secret: new keys would orphan the fleet's releases and bundles) and the
    registry's home ``home`` with each node provisioned (owned by ``owner`` when root, the
    user the registry's container runs as). The paths written."""
    if (out / "registry-token").exists():
        raise SwarmError(f"{out} already holds a fleet's secrets; provision into a new folder "
                         f"(or `registry node provision` one more node against {home})")
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o700)
    home.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []

    def secret(name: str, data: bytes) -> None:
        write_secret(out / name, data)
        made.append(out / name)

    secret("registry-token", secrets.token_urlsafe(32).encode())
    keys_dir = out / "keys"
    keys_dir.mkdir(mode=0o700, exist_ok=True)
    public = keys.keygen(keys_dir)
    secret("signing.key", public.private_path.read_bytes())
    (out / "signing.pub").write_bytes(public.public_path.read_bytes())
    made.append(out / "signing.pub")
    shutil.rmtree(keys_dir)
    tls = out / "tls"  # the fleet CA (ca.key stays here: it makes more nodes' certificates)
    pki.fleet(tls, [*REGISTRY_NAMES, "localhost", "127.0.0.1"])
    secret("registry.pem", (tls / "registry.pem").read_bytes())
    secret("registry.key", (tls / "registry.key").read_bytes())
    shutil.copyfile(tls / "ca.pem", out / "ca.pem")
    made.append(out / "ca.pem")
    # a clean environment: none of the caller's REGISTRY_* settings reach this registry
    env = {"PATH": f"{BIN}:/usr/sbin:/usr/bin:/bin", "HOME": str(out),
           "REGISTRY_TOKEN_FILE": str(out / "registry-token"),
           "REGISTRY_SIGNING_KEY": str(out / "signing.key")}
    _run(registry_cli(home, "init"), env=env)  # the registry's home, made here on purpose
    for node_id, (tier, region) in (nodes or NODES).items():
        bundle = out / f"{node_id}.bundle"
        _run(registry_cli(home, "node", "provision", node_id, "--tier", tier, "--region",
                          region, "--ca", str(tls), "--host", node_id, "--out", str(bundle)),
             env=env)
        made.append(bundle)
    tokens = {role: str(uuid.uuid4()) for role in CONSUL_ROLES}
    for role, token in tokens.items():
        secret(f"consul-{role}-token", f"{token}\n".encode())
    gossip = base64.b64encode(secrets.token_bytes(32)).decode()
    acl: dict[str, Any] = {"enabled": True, "default_policy": "deny",
                           "down_policy": "extend-cache"}
    # "master": Consul 1.8's name, which 1.11+ still reads (as initial_management)
    secret("consul-server.json", json.dumps({
        "encrypt": gossip, "acl": {**acl, "tokens": {"master": tokens["management"],
                                                     "agent": tokens["agent"]}}}).encode())
    secret("consul-client.json", json.dumps({
        "encrypt": gossip, "acl": {**acl, "tokens": {"agent": tokens["agent"]}}}).encode())
    if owner is not None and os.geteuid() == 0:
        for path in [home, *home.rglob("*")]:
            os.chown(path, owner, owner, follow_symlinks=False)
    return made


def stack_env(out: Path, home: Path, **extra: str) -> dict[str, str]:
    """The variables ``docker stack deploy -c deploy/swarm/stack.yml`` reads: where the
    secrets and the registry's home are (and ``extra``, e.g. the images)."""
    return {"TIERED_SWARM_SECRETS": str(out.resolve()), "TIERED_REGISTRY_HOME": str(home.resolve()),
            **extra}


def _run(argv: list[str], env: dict[str, str] | None = None, input: bytes | None = None,
         timeout: float = 300) -> str:
    done = subprocess.run(argv, env=env, input=input, capture_output=True, timeout=timeout)
    if done.returncode != 0:
        what = " ".join(argv[:6])
        raise SwarmError(f"{what}: {done.stderr.decode(errors='replace').strip()[-800:]}")
    return done.stdout.decode(errors="replace")


# -- a swarm on one machine ----------------------------------------------------------------


@dataclass
class Engine:
    """One node: a ``dockerd`` in ``host``'s network namespace, its own host name, PID and
    mount namespaces, its state under ``state`` and its runtime files under ``/run``."""

    host: Host
    state: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def sock(self) -> Path:
        return self.state / "docker.sock"

    @property
    def exec_root(self) -> Path:
        # containerd's sockets live here: keep it short (unix socket paths are limited)
        return Path("/run") / f"tsw-{self.host.netns}"

    def start(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        # a killed daemon leaves its pidfile and its runtime folder (containerd's pidfile and
        # sockets among them), naming PIDs of its old namespace that a new one may reuse: a
        # host's /run is empty after a reboot, and so is this node's
        (self.state / "dockerd.pid").unlink(missing_ok=True)
        shutil.rmtree(self.exec_root, ignore_errors=True)
        daemon = (f"hostname {self.name} && exec dockerd --data-root {self.state / 'data'} "
                  f"--exec-root {self.exec_root} --pidfile {self.state / 'dockerd.pid'} "
                  f"-H unix://{self.sock} --iptables=false --ip-masq=false --bridge=none")
        log = (self.state / "dockerd.log").open("ab")
        self.proc = subprocess.Popen(
            ["nsenter", f"--net=/var/run/netns/{self.host.netns}", "unshare", "--uts",
             "--pid", "--mount", "--fork", "--mount-proc", "sh", "-c", daemon],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SwarmError(f"dockerd on {self.name} exited: "
                                 f"{(self.state / 'dockerd.log').read_text()[-600:]}")
            done = subprocess.run(self.argv("version", "-f", "{{.Server.Version}}"),
                                  capture_output=True)
            if done.returncode == 0:
                return
            time.sleep(0.3)
        raise SwarmError(f"dockerd on {self.name} did not answer within 60 s")

    def argv(self, *args: str) -> list[str]:
        return ["docker", "-H", f"unix://{self.sock}", *args]

    def docker(self, *args: str, env: dict[str, str] | None = None,
               input: bytes | None = None, timeout: float = 300) -> str:
        return _run(self.argv(*args), env=env, input=input, timeout=timeout)

    def daemon_pid(self) -> int | None:
        """The daemon's PID as this machine sees it: the child of ``unshare``."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        except OSError:
            return None
        return int(children.split()[0]) if children.split() else None

    def kill(self) -> None:
        """The host lost: SIGKILL to the daemon, PID 1 of the node's PID namespace, which takes
        every process of the node with it."""
        pid = self.daemon_pid()
        if pid is not None:
            os.kill(pid, signal.SIGKILL)
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Cluster:
    """Nodes on a ``tiered.netns`` network, a swarm of them (the first a manager), their
    labels, images copied in, and ``close()`` taking all of it away (daemons by PID, their
    runtime folders, the namespaces and the bridge).

    Why one class: it is the one record of what was started as root (the network, each node's
    daemon and runtime folder), so that ``close()`` leaves nothing behind; the rest are a
    docker command or two against the nodes it holds."""

    state: Path
    prefix: str = "10.81"
    network: Network = field(init=False)
    engines: dict[str, Engine] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.network = Network(prefix=self.prefix)

    def create(self, nodes: Iterable[tuple[str, str]]) -> Cluster:
        """A node per (site, name), each daemon started (in parallel)."""
        self.network.create()
        for site, name in nodes:
            host = self.network.add(site, name)
            self.engines[name] = Engine(host, self.state / name)
        for engine in self.engines.values():
            engine.start()
        return self

    @property
    def manager(self) -> Engine:
        return next(iter(self.engines.values()))

    def form(self, labels: dict[str, dict[str, str]], heartbeat_s: int = 2) -> None:
        """Swarm init on the manager, every other node joined as a worker, each labelled.
        ``heartbeat_s``: how often nodes report, hence how soon a lost one is Down."""
        manager = self.manager
        manager.docker("swarm", "init", "--advertise-addr", manager.host.address,
                       "--dispatcher-heartbeat", f"{heartbeat_s}s")
        token = manager.docker("swarm", "join-token", "-q", "worker").strip()
        for engine in self.engines.values():
            if engine is not manager:
                engine.docker("swarm", "join", "--token", token, "--advertise-addr",
                              engine.host.address, f"{manager.host.address}:2377")
        for name, pairs in labels.items():
            self.label(name, **pairs)

    def label(self, node: str, **pairs: str) -> None:
        args = [arg for key, value in pairs.items() for arg in ("--label-add", f"{key}={value}")]
        self.manager.docker("node", "update", *args, node)

    def load(self, source: list[str], images: list[str], nodes: Iterable[str]) -> float:
        """``images`` saved once from the engine ``source`` (a docker argv prefix) and loaded
        into each of ``nodes``; the seconds it took."""
        started = time.monotonic()
        tar = self.state / "images.tar"
        with tar.open("wb") as f:
            done = subprocess.run([*source, "save", *images], stdout=f, stderr=subprocess.PIPE)
        if done.returncode != 0:
            raise SwarmError(f"docker save {' '.join(images)}: {done.stderr.decode()[-400:]}")
        for name in nodes:
            with tar.open("rb") as f:
                loaded = subprocess.run(self.engines[name].argv("load", "-q"), stdin=f,
                                        capture_output=True)
            if loaded.returncode != 0:
                raise SwarmError(f"docker load on {name}: {loaded.stderr.decode()[-400:]}")
        tar.unlink()
        return time.monotonic() - started

    def deploy(self, stack: str, env: dict[str, str], files: Iterable[Path] = (STACK,)) -> None:
        compose = [arg for path in files for arg in ("-c", str(path))]
        # the stack file's variables and nothing else of the caller's (no DOCKER_* settings)
        self.manager.docker("stack", "deploy", "--resolve-image", "never", *compose, stack,
                            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                 "HOME": str(self.state), **env})

    def services(self, stack: str) -> dict[str, dict[str, Any]]:
        """Each service of ``stack``: its replicas ("1/1") and where its running tasks are."""
        out = self.manager.docker("service", "ls", "--filter",
                                  f"label=com.docker.stack.namespace={stack}",
                                  "--format", "{{.Name}}\t{{.Replicas}}")
        found: dict[str, dict[str, Any]] = {}
        for line in out.splitlines():
            name, replicas = line.split("\t")
            found[name.removeprefix(f"{stack}_")] = {"replicas": replicas}
        return found

    def tasks(self, service: str) -> list[dict[str, str]]:
        """``service``'s tasks (newest first): node, desired and current state, error."""
        out = self.manager.docker("service", "ps", "--no-trunc", "--format",
                                  "{{json .}}", service)
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def node_of(self, service: str) -> str | None:
        """Where ``service``'s running task is (None when none runs)."""
        for task in self.tasks(service):
            if task["DesiredState"] == "Running" and task["CurrentState"].startswith("Running"):
                return str(task["Node"])
        return None

    def nodes(self) -> dict[str, str]:
        """Each node's status as the manager sees it (Ready, Down) and availability."""
        out = self.manager.docker("node", "ls", "--format",
                                  "{{.Hostname}}\t{{.Status}}\t{{.Availability}}")
        return {line.split("\t")[0]: "/".join(line.split("\t")[1:])
                for line in out.splitlines()}

    def wait(self, what: str, check: Callable[[], bool], timeout: float) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            try:
                if check():
                    return time.monotonic() - started
            except SwarmError:
                pass
            time.sleep(0.5)
        raise SwarmError(f"not within {timeout:.0f} s: {what}")

    def close(self) -> None:
        """Every daemon killed (by PID), its runtime folder and its data (images, volumes,
        several GiB) removed, then the namespaces and the bridge."""
        for engine in self.engines.values():
            engine.kill()
            shutil.rmtree(engine.exec_root, ignore_errors=True)
            shutil.rmtree(engine.state / "data", ignore_errors=True)
        self.network.close()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
