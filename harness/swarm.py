"""Tiered on a Docker Swarm of five ``dockerd`` nodes (``deploy/swarm/stack.yml``), each node a
network namespace with its own address (``tiered.swarm.Cluster``): a manager and a second node
at the center site, a gateway and an edge host at site eu, one host at site us. The images come
from the private engine of ``scripts/docker_here.sh`` by ``docker save | docker load``: no
registry is asked for anything. ``running`` forms the swarm and provisions the stack's secrets;
``SwarmRun`` deploys it and runs each step with clients at both edge sites (``harness.sites``'
traffic, one retry each), returning what they saw (an ``Event``):

- a ``registry publish`` (run in the registry's container) until every node serves it;
- a rolling update of the edge image (start-first, one edge at a time);
- eu's edge host lost (its daemon, PID 1 of the node, killed), Swarm rescheduling its edges;
- the center's node drained: the center moved, the pinned standby registry waiting.

Root only. ``tests/swarm`` runs each step and asserts what it must keep; ``python -m
bench.swarm`` runs them all and reports.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table

from harness.sites import FLOOR, MODEL, Event, Traffic, body, wait
from tiered.swarm import NODES, Cluster, SwarmError, provision, stack_env

ROOT = Path(__file__).resolve().parent.parent
SOURCE_SOCK = ROOT / "var" / "docker" / "docker.sock"  # scripts/docker_here.sh's engine
STACK_NAME = "tiered"
# (site, node), the manager first
TOPOLOGY = [("center", "center-1"), ("center", "center-2"), ("eu", "eu-gw"), ("eu", "eu-1"),
            ("us", "us-1")]
LABELS = {"center-1": {"site": "center", "consul": "true", "registry": "primary",
                       "monitoring": "true"},
          "center-2": {"site": "center", "registry": "standby", "center": "true"},
          "eu-gw": {"site": "eu", "gateway": "true"},
          "eu-1": {"site": "eu", "edges": "true"},
          "us-1": {"site": "us", "gateway": "true", "edges": "true"}}
GATEWAYS = {"eu": "eu-gw", "us": "us-1"}
EDGES = {"eu": ["edge-eu-1", "edge-eu-2"], "us": ["edge-us-1"]}
CONSUL_IMAGE = "tiered/consul-debian:1.8.7"  # scripts/docker_here.sh's stand-in (Debian's)
# the last two: Prometheus and Alertmanager, the target renderer (center-1: monitoring=true)
CENTER_IMAGES = ["tiered/registry:0.1.0", "tiered/center:0.1.0-cpu", "tiered/monitoring:0.1.0",
                 "tiered/nginx:0.1.0"]
EDGE_IMAGES = ["tiered/edge:0.1.0", "tiered/nginx:0.1.0"]
EDGE_NEXT = "tiered/edge:0.1.0-next"  # the rolling update's image (the same build, retagged)


def wait_for(condition: Callable[[], bool], timeout: float, what: str,
             every: float = 0.5) -> float:
    """``harness.sites.wait`` that also waits through a docker command failing (a task between
    nodes, a container not there yet)."""
    last: list[str] = []

    def check() -> bool:
        try:
            met = condition()
            last.clear()
            return met
        except (SwarmError, subprocess.TimeoutExpired) as exc:
            last[:] = [str(exc)[:300]]
            return False

    try:
        return wait(check, timeout, what, every)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}{'; last: ' + last[0] if last else ''}") from None


def source_engine() -> list[str]:
    return ["docker", "-H", f"unix://{SOURCE_SOCK}"]


def consul_image() -> str:
    """The official image where the source engine holds it, else the stand-in."""
    official = "hashicorp/consul:1.20.2"
    found = subprocess.run([*source_engine(), "image", "inspect", official],
                           capture_output=True)
    return official if found.returncode == 0 else CONSUL_IMAGE


@dataclass
class SwarmRun:
    """The swarm, the stack's secrets and registry home, the traffic and the events."""

    cluster: Cluster
    secrets: Path
    home: Path
    release: Path
    release_b: Path
    consul: str = CONSUL_IMAGE
    traffic: Traffic | None = None
    events: list[Event] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    published: int = 0

    # -- looking ---------------------------------------------------------------------------

    @property
    def env(self) -> dict[str, str]:
        uid = "100" if self.consul.startswith("hashicorp/") else "999"
        return stack_env(self.secrets, self.home, TIERED_CONSUL_IMAGE=self.consul,
                         TIERED_CONSUL_UID=uid)

    def entry(self, site: str) -> str:
        return f"http://{self.cluster.engines[GATEWAYS[site]].host.address}:8080"

    def service(self, name: str) -> str:
        return f"{STACK_NAME}_{name}"

    def container(self, service: str) -> tuple[list[str], str]:
        """The engine argv and the id of ``service``'s running container."""
        node = self.cluster.node_of(self.service(service))
        if node is None:
            raise SwarmError(f"no running task of {service}")
        engine = self.cluster.engines[node]
        found = engine.docker("ps", "-q", "--filter",
                              f"label=com.docker.swarm.service.name={self.service(service)}")
        ids = found.split()
        if not ids:
            raise SwarmError(f"{service}'s container is not on {node}")
        return engine.argv(), ids[0]

    def registry(self, *args: str, timeout: float = 120) -> str:
        """``registry ARGS`` in the registry's container (as an operator would run it)."""
        argv, cid = self.container("registry")
        done = subprocess.run([*argv, "exec", "-e", f"REGISTRY_MIN_FIDELITY={FLOOR}", cid,
                               "registry", *args], capture_output=True, text=True,
                              timeout=timeout)
        if done.returncode != 0:
            raise SwarmError(f"registry {' '.join(args)}: {done.stderr.strip()[-600:]}")
        return done.stdout

    def publish(self, release: Path) -> int:
        """``release`` copied into the registry's container and published there; its
        version."""
        argv, cid = self.container("registry")
        inside = f"/tmp/release-{self.published + 1}"
        subprocess.run([*argv, "cp", str(release), f"{cid}:{inside}"], check=True,
                       capture_output=True, timeout=60)
        data = json.loads(self.registry("publish", inside, "--name", MODEL, "--json"))
        self.published = int(data["manifest"]["version"])
        return self.published

    def status(self) -> dict[str, dict[str, Any]]:
        rows = json.loads(self.registry("status", "--json"))
        return {row["node"]: row for row in rows if row.get("model") == MODEL}

    def all_on(self, version: int) -> bool:
        rows = self.status()
        return all(n in rows and rows[n]["version"] == version and rows[n]["state"] == "ACTIVE"
                   for n in NODES)

    def healthy(self) -> dict[str, str]:
        """Each long-running service's replicas ("1/1" when its task is healthy)."""
        return {name: s["replicas"] for name, s in self.cluster.services(STACK_NAME).items()
                if name != "consul-acl"}

    def answers_from(self, site: str, nodes: list[str]) -> bool:
        with httpx.Client(timeout=5) as http:
            for n in range(3):
                r = http.post(f"{self.entry(site)}/v2/models/{MODEL}/infer", content=body(n))
                if r.status_code != 200 or r.json()["parameters"]["node_id"] not in nodes:
                    return False
        return True

    # -- steps -----------------------------------------------------------------------------

    def deploy(self) -> float:
        """``docker stack deploy``, the first release published as soon as the registry is
        primary; seconds until every service is healthy and both entries answer."""
        started = time.monotonic()
        self.cluster.deploy(STACK_NAME, self.env)
        wait_for(lambda: self._primary(), 240, "the registry primary")
        self.figures["registry_primary_s"] = round(time.monotonic() - started, 1)
        self.publish(self.release)
        wait_for(lambda: set(self.healthy().values()) == {"1/1"}, 300, "every service healthy")
        self.figures["healthy_s"] = round(time.monotonic() - started, 1)
        self.wait_served(list(EDGES), 120, "both entries answering from their own edges")
        return time.monotonic() - started

    def wait_served(self, sites: list[str], timeout: float, what: str) -> None:
        """Until each of ``sites``' entries answers from its own edges; on a timeout, say what
        the entries answered and what their renderers last wrote (``probe``)."""
        try:
            wait_for(lambda: all(self.answers_from(s, EDGES[s]) for s in sites), timeout, what)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}: {self.probe()}") from None

    def probe(self) -> dict[str, Any]:
        """What requests through each entry get now, and what each entry's renderer last
        wrote and left out (for a failure's message)."""
        seen: dict[str, Any] = {}
        for site in EDGES:
            answers = []
            for n in range(4):
                try:
                    r = httpx.post(f"{self.entry(site)}/v2/models/{MODEL}/infer",
                                   content=body(n), timeout=5)
                    answers.append(f"{r.status_code} {r.json()['parameters']['node_id']}"
                                   if r.status_code == 200 else f"{r.status_code} {r.text[:80]}")
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    answers.append(repr(exc)[:120])
            seen[site] = {"answers": answers, "renderer": self.renderer_log(site)}
        return seen

    def renderer_log(self, site: str, since: str = "5m") -> list[str]:
        """The site's entry's last upstreams and what it left out (its renderer's log)."""
        logs = subprocess.run(self.cluster.manager.argv(
            "service", "logs", "--raw", "--since", since, self.service(f"entry-{site}")),
            capture_output=True, text=True, timeout=60)
        lines = (logs.stdout + logs.stderr).splitlines()
        written = [line for line in lines if '"upstreams: ' in line][-2:]
        return [line[-400:] for line in [*written, *[x for x in lines if "rendering" in x][-4:]]]

    def _primary(self) -> bool:
        state = json.loads(self.registry("replication", "--json", timeout=30))
        return bool(state["role"] == "primary" and state["writable"])

    def rollout(self) -> Event:
        """A publish under load until every node of the swarm serves it."""
        assert self.traffic is not None
        start = time.monotonic()
        version = self.publish(self.release_b)
        published = time.monotonic()
        took = wait_for(lambda: self.all_on(version), 240, f"every node on version {version}",
                    every=0.5)
        end = time.monotonic()
        event = Event("1", "registry publish rolled out to every node", "both", 0.0,
                      self.traffic.between(start, end), "every node ACTIVE on it",
                      round(published - start + took, 1), facts={"version": version})
        self.events.append(event)
        return event

    def rolling_update(self) -> Event:
        """Every edge service moved to a new image tag, one after another, start-first."""
        assert self.traffic is not None
        for site in EDGES:
            for node in ("eu-gw", "eu-1") if site == "eu" else (GATEWAYS[site],):
                self.cluster.engines[node].docker("tag", EDGE_IMAGES[0], EDGE_NEXT)
        start = time.monotonic()
        for names in EDGES.values():
            for name in names:
                self.cluster.manager.docker("service", "update", "--detach=true", "--image",
                                            EDGE_NEXT, self.service(name))
                wait_for(partial(self._updated, name), 300, f"{name} updated")
        end = time.monotonic()
        event = Event("2", "rolling update of the edge image (start-first)", "both", 0.0,
                      self.traffic.between(start, end), "every edge on the new image",
                      round(end - start, 1),
                      facts={"images": {n: self._image(n) for ns in EDGES.values() for n in ns}})
        self.events.append(event)
        return event

    def _updated(self, name: str) -> bool:
        spec = json.loads(self.cluster.manager.docker("service", "inspect", self.service(name)))
        state = (spec[0].get("UpdateStatus") or {}).get("State")
        return state == "completed" and self._image(name) == EDGE_NEXT

    def _image(self, name: str) -> str:
        running = [t for t in self.cluster.tasks(self.service(name))
                   if t["DesiredState"] == "Running"]
        return str(running[0]["Image"]) if running else ""

    def node_lost(self, site: str = "eu", node: str = "eu-1") -> Event:
        """``node`` (all of ``site``'s edges) lost with its daemon; the spare gateway node
        labelled for edges beforehand."""
        assert self.traffic is not None
        self.cluster.label(GATEWAYS[site], edges="true")
        others = [n for s, ns in EDGES.items() if s != site for n in ns]
        start = time.monotonic()
        self.cluster.engines[node].kill()
        down = wait_for(lambda: self.cluster.nodes()[node].startswith("Down"), 60,
                    f"{node} Down in the swarm")
        wait_for(lambda: all(self.cluster.node_of(self.service(e)) == GATEWAYS[site]
                         for e in EDGES[site]), 300, f"{site}'s edges running again")
        rescheduled = time.monotonic() - start
        self.wait_served([site], 180, f"{site} served by its edges")
        end = time.monotonic()
        failover = self.traffic.first_after(
            start, site, lambda a: a.status == 200 and a.node in others)
        event = Event("3", f"{site}'s edge host lost (daemon killed)", site, 0.0,
                      self.traffic.between(start, end), f"{site}'s edges serve again",
                      round(end - start, 1), failover_s=failover,
                      facts={"down_s": round(down, 1), "rescheduled_s": round(rescheduled, 1),
                             "answered_by_during": sorted({
                                 a.node for a in self.traffic.between(start, end, site)
                                 if a.node in others})})
        event.facts["entry_log"] = self.renderer_log(site, since="2m")
        self.events.append(event)
        self.cluster.engines[node].start()  # the host back: it rejoins and idles
        wait_for(lambda: self.cluster.nodes()[node].startswith("Ready"), 120, f"{node} Ready")
        return event

    def drain(self, node: str = "center-2") -> Event:
        """``node`` drained: the center moves to the other center node (labelled for it
        beforehand); the standby registry, pinned to ``node``, waits; then ``node`` active
        again and the standby back."""
        assert self.traffic is not None
        self.cluster.label("center-1", center="true")
        start = time.monotonic()
        self.cluster.manager.docker("node", "update", "--availability", "drain", node)
        wait_for(lambda: self.cluster.node_of(self.service("center-1")) == "center-1", 300,
             "the center running on center-1")
        wait_for(lambda: self.healthy()["center-1"] == "1/1", 300, "the moved center healthy")
        moved = time.monotonic() - start
        escalated = wait_for(lambda: self._escalated_since(time.monotonic() - 2), 120,
                         "escalations answered by the center again")
        standby_waiting = self.healthy()["registry-standby"]
        self.cluster.manager.docker("node", "update", "--availability", "active", node)
        wait_for(lambda: self.healthy()["registry-standby"] == "1/1", 300, "the standby back")
        end = time.monotonic()
        event = Event("4", f"{node} drained: the center moved", "both", 0.0,
                      self.traffic.between(start, end), "escalations answered again",
                      round(moved + escalated, 1),
                      facts={"moved_s": round(moved, 1), "standby_while_drained":
                             standby_waiting, "center_on": self.cluster.node_of(
                                 self.service("center-1"))})
        self.events.append(event)
        return event

    def _escalated_since(self, since: float) -> bool:
        assert self.traffic is not None
        return any("center" in a.tiers for a in self.traffic.between(since, float("inf")))

    def converged(self) -> dict[str, Any]:
        done = wait_for(lambda: self.all_on(self.published), 240, "every node on the last release")
        audit = subprocess.run([*self.container("registry")[0], "exec",
                                self.container("registry")[1], "registry", "audit", "--verify"],
                               capture_output=True, text=True, timeout=120)
        return {"s": done, "audit_rc": audit.returncode, "audit": audit.stdout[-400:],
                "status": self.status()}


@contextmanager
def running(state: Path, release: Path, release_b: Path, prefix: str = "10.81") -> Iterator[
        SwarmRun]:
    """The swarm formed, the images loaded, the stack's secrets provisioned; every daemon,
    namespace and runtime folder removed on the way out."""
    cluster = Cluster(state, prefix=prefix)
    try:
        started = time.monotonic()
        cluster.create(TOPOLOGY)
        cluster.form(LABELS)
        figures: dict[str, Any] = {"swarm_s": round(time.monotonic() - started, 1)}
        consul = consul_image()
        centers = [n for s, n in TOPOLOGY if s == "center"]
        edges = [n for s, n in TOPOLOGY if s != "center"]
        figures["images_center_s"] = round(cluster.load(
            source_engine(), [*CENTER_IMAGES, consul], centers), 1)
        figures["images_edge_s"] = round(cluster.load(
            source_engine(), [*EDGE_IMAGES, consul], edges), 1)
        secrets, home = state / "secrets", state / "registry-home"
        provision(secrets, home)
        yield SwarmRun(cluster, secrets, home, release, release_b, consul, figures=figures)
    finally:
        cluster.close()


def table(run: SwarmRun) -> Table:
    out = Table(title="Tiered on a five-node Swarm, clients at both edge sites (one retry each)")
    for column in ("#", "step", "answered", "retried", "failed", "slowest (s)",
                   "failover (s)", "done when", "took (s)"):
        out.add_column(column)
    for e in run.events:
        out.add_row(e.number, e.name, str(len(e.answers)), str(e.retried), str(len(e.failed)),
                    f"{e.slowest_s:.2f}", "-" if e.failover_s is None else f"{e.failover_s:.1f}",
                    e.recovery, "-" if e.recovery_s is None else f"{e.recovery_s:.1f}")
    out.caption = ("failover: from the kill until eu's clients were steadily answered by us's "
                   "edges through eu's entry; took: until the step was done (3: eu's edges "
                   "rescheduled on eu's spare node and serving eu again)")
    return out


def setup_table(run: SwarmRun) -> Table:
    out = Table(title="Bringing the swarm up")
    out.add_column("what")
    out.add_column("seconds")
    f = run.figures
    for label, key in (("five dockerd nodes started, swarm formed, labelled", "swarm_s"),
                       ("images into the two center nodes (docker save | load)",
                        "images_center_s"),
                       ("images into the three edge-site nodes", "images_edge_s"),
                       ("docker stack deploy -> registry primary", "registry_primary_s"),
                       ("docker stack deploy -> every service healthy (Docker's checks)",
                        "healthy_s"),
                       ("docker stack deploy -> every service healthy, both entries "
                        "answering (first release published on the way)", "deploy_s")):
        out.add_row(label, str(f.get(key, "-")))
    return out
