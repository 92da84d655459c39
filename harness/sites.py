"""Three sites as network namespaces (``tiered.sites``) with clients at both edge sites sending
through their site's entry the whole time, retrying a failed request once: the topology up with
a release on every node (``running``), the traffic (``Traffic``), and each partition or fault
as a method of ``Run`` that cuts, waits, heals and returns what the clients saw (an ``Event``):

1. an edge site cut from the center site;
2. an edge site cut from the registry during a rollout (its download resumes on heal); then
   small releases across its 2 Mbit/s link, fetched whole and by chunks (2b);
3. an edge site cut from the Consul servers;
4. a whole edge site's edges down;
5. the Consul leader killed; then the center host;
6. the registry group (a primary and a standby on two center-site hosts): the primary's host
   killed (a), the two registry hosts cut from each other (b), the primary cut from Consul (c).

Plus the escalation latency across a site link with and without 20 ms added each way
(``harness.wan``). Root only. ``tests/sites`` runs each partition and asserts what it must
keep; ``python -m bench.sites`` runs them all and reports.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import secrets
import sqlite3
import ssl
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table

from examples.sentiment.variants import head_only, recalibrated
from harness.metrics import metric
from harness.wan import DelayProxy
from tiered.commands import BIN, tier_argv
from tiered.netns import Network
from tiered.site_map import CENTER_PORT, CORE, EDGE_PORT
from tiered.sites import Sites

MODEL = "tiny"
FLOOR = "0.9"  # the tiny models' fidelity floor (as in the tests): INT8 agreement is per CPU
CHUNK = 64 * 1024
TEXTS = ["A tedious slog.", "A warm, funny and moving film.", "Not bad at all.",
         "The plot made no sense and the acting was worse.", "I loved every minute of it.",
         "It was fine, I guess.", "An instant classic.", "Two hours I will never get back."]
# rows escalate below the threshold: with 0.999 nearly every row goes to the center, so a cut
# from it shows in every answer (degraded) and its return too; the cache is off for the same
EDGE_FLAGS = ("--threshold", "0.999", "--cache-size", "0", "--center-timeout-s", "1",
              "--breaker-reset-s", "1")


def body(n: int) -> str:
    rows = [f"{TEXTS[(n + i) % len(TEXTS)]} ({n})" for i in range(2)]
    return json.dumps({"inputs": [{"name": "text", "shape": [len(rows)], "datatype": "BYTES",
                                   "data": rows}]})


@dataclass(frozen=True)
class Answer:
    at: float  # monotonic time sent
    seconds: float  # until the final answer (retry included)
    site: str
    status: int  # final status; 0: no HTTP answer
    retried: bool
    tiers: tuple[str, ...] = ()
    version: str = ""
    node: str = ""
    error: str = ""


@dataclass
class Traffic:
    """``per_site`` clients at each edge site, each sending one request after another to the
    site's entry; a request that fails (no answer, or not 200) is retried once."""

    entries: dict[str, str]
    per_site: int = 2
    timeout_s: float = 10.0
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _count: Iterator[int] = field(default_factory=itertools.count)

    def start(self) -> Traffic:
        for site, url in self.entries.items():
            for _ in range(self.per_site):
                thread = threading.Thread(target=self._client, args=(site, url), daemon=True)
                self._threads.append(thread)
                thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)

    def _client(self, site: str, url: str) -> None:
        with httpx.Client(timeout=self.timeout_s) as http:
            while not self._stop.is_set():
                sent = time.monotonic()
                answer = self._send(http, url, next(self._count))
                retried = answer.status != 200
                if retried:
                    answer = self._send(http, url, next(self._count))
                self.answers.append(Answer(sent, time.monotonic() - sent, site, answer.status,
                                           retried, answer.tiers, answer.version, answer.node,
                                           answer.error))
                time.sleep(0.02)

    @staticmethod
    def _send(http: httpx.Client, url: str, n: int) -> Answer:
        try:
            r = http.post(f"{url}/v2/models/{MODEL}/infer", content=body(n),
                          headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            return Answer(0, 0, "", 0, False, error=f"{type(exc).__name__}: {exc}")
        if r.status_code != 200:
            return Answer(0, 0, "", r.status_code, False, error=r.text[:200])
        data = r.json()
        tiers = next((tuple(o["data"]) for o in data["outputs"] if o["name"] == "tier"), ())
        node = str((data.get("parameters") or {}).get("node_id", ""))
        return Answer(0, 0, "", 200, False, tiers, str(data.get("model_version", "")), node)

    def between(self, start: float, end: float, site: str | None = None) -> list[Answer]:
        return [a for a in list(self.answers)
                if start <= a.at < end and (site is None or a.site == site)]

    def first_after(self, start: float, site: str,
                    good: Callable[[Answer], bool]) -> float | None:
        """Seconds from ``start`` to the first answer at ``site`` sent after it that is
        ``good``, with every answer sent in the second after it good too (None: not yet)."""
        later = sorted(self.between(start, float("inf"), site), key=lambda a: a.at)
        bad = [a.at for a in later if not good(a)]
        for a in later:
            if good(a) and a.at + 1.0 < later[-1].at and not any(
                    a.at <= t < a.at + 1.0 for t in bad):
                return a.at - start
        return None


@dataclass
class Event:
    """One partition: what the clients saw from the cut (or kill) to the end of recovery."""

    number: str
    name: str
    site: str  # the site whose clients it is about
    cut_s: float  # how long the cut lasted
    answers: list[Answer]
    recovery: str  # what "recovered" means here
    recovery_s: float | None  # from the heal (or revive) until it held
    failover_s: float | None = None  # from the cut until clients were steadily served the
    # other way (degraded, by another site's edges, by a new leader); None: nothing to fail
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> list[Answer]:
        return [a for a in self.answers if a.status != 200]

    @property
    def retried(self) -> int:
        return sum(a.retried for a in self.answers)

    @property
    def slowest_s(self) -> float:
        return max((a.seconds for a in self.answers), default=0.0)

    def rows(self, tier: str) -> int:
        return sum(t == tier for a in self.answers for t in a.tiers)


def wait(condition: Callable[[], bool], timeout: float, what: str,
         every: float = 0.2) -> float:
    """Seconds until ``condition()``; TimeoutError naming ``what`` after ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if condition():
                return time.monotonic() - started
        except (httpx.HTTPError, ValueError, KeyError, OSError):
            pass
        time.sleep(every)
    raise TimeoutError(f"no {what} after {timeout:.0f} s")


@dataclass
class Run:
    """The topology, its registry's command line, the traffic, and the events so far."""

    sites: Sites
    release: Path
    release_b: Path
    events: list[Event] = field(default_factory=list)
    traffic: Traffic | None = None

    @property
    def home(self) -> Path:
        """The home of the registry that is primary now (waits for an election to end)."""
        if not self.sites.standbys or not self.sites.children:
            return self.sites.registry_home
        wait(lambda: self.sites.primary() is not None, 60, "a primary registry")
        return self.sites.registry_homes()[self.sites.primary() or "registry"]

    def registry(self, *args: str | Path, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``registry ARGS`` on the primary's home (its SQLite: no network needed)."""
        return self.registry_at(self.home, *args, check=check)

    def registry_at(self, home: Path, *args: str | Path, check: bool = True,
                    env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        base = {"PATH": f"{BIN}:/usr/bin:/bin", "REGISTRY_HOME": str(home),
                "HOME": str(home), "REGISTRY_MIN_FIDELITY": FLOOR,
                "REGISTRY_ACTOR": "sites@bench"}
        if self.sites.standbys:  # the group's one key, provisioned beside the homes
            base["REGISTRY_SIGNING_KEY"] = str(self.sites.signing_key)
        done = subprocess.run([str(BIN / "registry"), *map(str, args)], capture_output=True,
                              text=True, env=base | (env or {}), timeout=300)
        if check and done.returncode != 0:
            raise RuntimeError(f"registry {' '.join(map(str, args))} exited "
                               f"{done.returncode}: {done.stderr[-2000:]}")
        return done

    # -- looking at nodes --------------------------------------------------------------

    @property
    def ca(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.sites.tls / "ca.pem"))

    def version(self, node: str) -> int | None:
        """The version ``node`` serves by default (None: nothing, or no answer)."""
        try:
            r = httpx.get(f"{self.sites.node_url(node)}/v2/models/{MODEL}/ready", timeout=2,
                          verify=self.ca)
        except httpx.HTTPError:
            return None
        return int(r.json()["version"]) if r.status_code == 200 else None

    def nodes(self, site: str | None = None) -> list[str]:
        edges = [n for s in self.sites.edge_sites for n in self.sites.edges(s)
                 if site in (None, s)]
        return edges if site else ["center-1", *edges]

    def all_serve(self, version: int, site: str | None = None) -> bool:
        return all(self.version(n) == version for n in self.nodes(site))

    def metric(self, node: str, name: str) -> float:
        """Sum of an edge's Prometheus series ``edge_<name>_total``."""
        return metric(f"{self.sites.node_url(node)}/metrics", f"edge_{name}_total", self.ca)

    def committed_at(self, version: int) -> float:
        """When the publish of ``version`` was committed (its audit record's time)."""
        rows = json.loads(self.registry("audit", "--model", MODEL, "--json").stdout)
        at = next(r["at"] for r in rows if r["action"] == "publish" and r["version"] == version)
        return datetime.fromisoformat(at).timestamp()

    def artifact_bytes(self, version: int) -> int:
        show = self.registry("show", f"{MODEL}@{version}", "--json")
        manifest = json.loads(show.stdout)["manifest"]
        return int(sum(manifest[role]["size"] for role in ("edge", "tokenizer", "probe")))

    def consul_via(self, host: str, path: str, operator: bool = False) -> httpx.Response:
        """A Consul API call through the agent on ``host`` (the reader token; the management
        token for ``operator`` calls)."""
        address = self.sites.host(host).address
        headers = ({"X-Consul-Token": self.sites.consul_tokens["management"]} if operator
                   else self.sites.consul_headers())
        return httpx.get(f"http://{address}:8500/v1{path}", timeout=3, headers=headers)

    def resumed(self, site: str, since: float) -> bool:
        """Rows from ``site`` answered by the center again (steadily) since ``since``."""
        return bool(self.traffic and self.traffic.first_after(since, site, escalated)
                    is not None)

    # -- the partitions ------------------------------------------------------------------

    def event(self, number: str, name: str, site: str, cut: float, end: float,
              recovery: str, recovery_s: float | None, cut_s: float,
              failover_s: float | None = None, **facts: Any) -> Event:
        assert self.traffic is not None
        found = Event(number, name, site, cut_s, self.traffic.between(cut, end), recovery,
                      recovery_s, failover_s, facts)
        self.events.append(found)
        print(f"partition {number} ({name}): {len(found.answers)} answered, "
              f"{found.retried} retried, {len(found.failed)} failed, recovered in "
              f"{recovery_s if recovery_s is None else round(recovery_s, 1)} s; {facts}",
              file=sys.stderr, flush=True)
        return found

    def site_from_center(self, site: str = "eu", hold_s: float = 10) -> Event:
        """1. Every host of ``site`` cut from every host of the center site."""
        assert self.traffic is not None
        net, hosts = self.sites.network, self.sites.network.site_hosts(site)
        cut = time.monotonic()
        net.cut(hosts, [net.subnet(CORE)])
        time.sleep(hold_s)
        healed = time.monotonic()
        net.heal(hosts)
        wait(lambda: self.resumed(site, healed), 90, f"escalation from {site} resuming")
        resumed = self.traffic.first_after(healed, site, escalated)
        return self.event("1", f"{site} cut from the center site", site, cut,
                          time.monotonic(), "escalation answered by the center again",
                          resumed, healed - cut,
                          self.traffic.first_after(cut, site, degraded),
                          degraded_during=sum(t == "edge-degraded"
                                              for a in self.traffic.between(cut, healed, site)
                                              for t in a.tiers))

    def registry_during_rollout(self, site: str = "eu", hold_s: float = 20,
                                kbit: int = 2000) -> Event:
        """2. ``site``'s links slowed to ``kbit``; a new release published; once its first
        edge has part of the new artifacts, the site is cut from the registry for ``hold_s``
        (past the sync stream's 15 s keepalive, so the stream breaks), then healed."""
        net = self.sites.network
        hosts = net.site_hosts(site)
        before = self.version(self.nodes(site)[0]) or 0
        probe = self.nodes(site)[0]
        received = self.metric(probe, "sync_bytes_received")
        for host in hosts:
            net.throttle(host, kbit)
        try:
            self.registry("publish", self.release_b, "--name", MODEL)
            target = before + 1
            size = self.artifact_bytes(target)
            wait(lambda: self.metric(probe, "sync_bytes_received") > received + CHUNK, 60,
                 f"{probe} receiving the new release")
            cut = time.monotonic()
            net.cut(hosts, [self.sites.host(self.sites.primary() or "registry").address])
            others = [s for s in self.sites.edge_sites if s != site]
            elsewhere = [wait(partial(self.all_serve, target, s), 60, f"{s} on version {target}")
                         for s in others]
            during = [self.version(n) for n in self.nodes(site)]
            time.sleep(max(0.0, hold_s - (time.monotonic() - cut)))
            healed = time.monotonic()
            net.heal(hosts)
            catch_up = wait(lambda: self.all_serve(target, site), 120,
                            f"{site} converging on version {target}")
        finally:
            for host in hosts:
                net.throttle(host, None)
        assert self.traffic is not None
        return self.event("2", f"{site} cut from the registry during a rollout", site, cut,
                          time.monotonic(), f"{site}'s edges on the new version (catch-up)",
                          catch_up, healed - cut, version_before=before, target=target,
                          versions_during=during, others_converged_s=max(elsewhere, default=0),
                          artifact_bytes=size,
                          resumed=self.metric(probe, "sync_fetch_resumed"),
                          received=self.metric(probe, "sync_bytes_received") - received)

    def small_changes_on_a_thin_link(self, site: str = "eu", kbit: int = 2000) -> Event:
        """2b. ``site``'s links slowed to ``kbit``; small releases published in turn on top of
        what its edges hold: a recalibration and a head-only change, each once fetched whole
        (published with ``REGISTRY_CHUNKING=false``, as every release was before chunks) and
        once by chunks. Per release: the bytes ``site``'s first edge received and the time
        until all of ``site``'s edges served it."""
        net, hosts = self.sites.network, self.sites.network.site_hosts(site)
        probe, base = self.nodes(site)[0], self.version(self.nodes(site)[0]) or 0
        folder = self.sites.root / "variants"
        # each built from the release the edges hold, and unlike any other of them
        changes: dict[str, tuple[Callable[[Path, Path], Path], Callable[[Path, Path], Path]]] = {
            "recalibrated": (partial(recalibrated, shift=10), partial(recalibrated, shift=20)),
            "head only": (partial(head_only, scale=1.5), partial(head_only, scale=2.0))}
        found: dict[str, dict[str, float]] = {}
        started = time.monotonic()
        for host in hosts:
            net.throttle(host, kbit)
        try:
            for kind, makers in changes.items():
                for chunked, make in zip((False, True), makers, strict=True):
                    name = f"{kind}, {'chunked' if chunked else 'whole'}"
                    release = make(self.release_b, folder / name.replace(", ", "-"))
                    received = self.metric(probe, "sync_bytes_received")
                    base += 1
                    # watched while the command runs: nodes often have it before it returns
                    publish = threading.Thread(target=partial(
                        self.registry_at, self.home, "publish", release, "--name", MODEL,
                        env={"REGISTRY_CHUNKING": str(chunked).lower()}))
                    publish.start()
                    wait(partial(self.all_serve, base, site), 300,
                         f"{site} on version {base} ({name})", every=0.05)
                    served_at = time.time()
                    publish.join()
                    found[name] = {"received": self.metric(probe, "sync_bytes_received") -
                                   received, "seconds": served_at - self.committed_at(base),
                                   "full": self.artifact_bytes(base)}
                    print(f"{name}: {found[name]}", file=sys.stderr, flush=True)
        finally:
            for host in hosts:
                net.throttle(host, None)
        return self.event("2b", f"small releases over {kbit / 1000:g} Mbit/s", site, started,
                          time.monotonic(), f"{site}'s edges on each", None, 0,
                          changes=found, target=base)

    def site_from_consul(self, site: str = "eu", hold_s: float = 10) -> Event:
        """3. ``site`` cut from the three Consul servers only (the center and the registry
        stay reachable): its agent can answer nothing from the catalog."""
        net, hosts = self.sites.network, self.sites.network.site_hosts(site)
        servers = [h.address for h in self.sites.server_hosts]
        gateway = f"{site}-gw"
        cut = time.monotonic()
        net.cut(hosts, servers)

        def refused() -> str | None:
            try:
                r = self.consul_via(gateway, "/health/service/tiered-edge")
            except httpx.HTTPError as exc:
                return type(exc).__name__
            return None if r.status_code == 200 else f"{r.status_code} {r.text[:80]}"

        wait(lambda: refused() is not None, 30, f"{site}'s agent losing the servers", every=0.5)
        during = refused()
        time.sleep(max(0.0, hold_s - (time.monotonic() - cut)))
        healed = time.monotonic()
        net.heal(hosts)
        expected = len(self.sites.edge_sites) * self.sites.edges_per_site

        def back() -> bool:
            r = self.consul_via(gateway, "/health/service/tiered-edge?passing=1")
            return r.status_code == 200 and len(r.json()) == expected

        recovery = wait(back, 120, f"{site}'s agent listing every edge passing again")
        return self.event("3", f"{site} cut from the Consul servers", site, cut,
                          time.monotonic(), f"{site}'s agent answering, every edge passing",
                          recovery, healed - cut, catalog_during=during)

    def site_down(self, site: str = "eu", hold_s: float = 10) -> Event:
        """4. Every edge host of ``site`` powered off; its entry stays up."""
        assert self.traffic is not None
        edges = self.sites.edges(site)
        cut = time.monotonic()
        for name in edges:
            self.sites.kill_host(name)
        time.sleep(hold_s)
        answered_by = sorted({a.node for a in self.traffic.between(cut + 3, time.monotonic(),
                                                                   site) if a.node})
        healed = time.monotonic()
        for name in edges:
            self.sites.revive_host(name)
        home = set(edges)
        back = wait(lambda: bool(self.traffic and self.traffic.first_after(
            healed, site, lambda a: a.node in home)), 120, f"{site}'s own edges answering")
        others = {n for s in self.sites.edge_sites if s != site for n in self.sites.edges(s)}
        moved = self.traffic.first_after(cut, site, lambda a: a.node in others)
        return self.event("4", f"{site}'s edges all down", site, cut, time.monotonic(),
                          f"{site}'s entry back on its own edges", back, healed - cut, moved,
                          answered_by_during=answered_by)

    def consul_leader(self) -> Event:
        """5a. The Raft leader killed (SIGKILL); the others elect one; it rejoins."""
        leader = self.sites.leader()
        assert leader is not None, "no Consul leader to kill"
        cut = time.monotonic()
        self.sites.children[leader.name].kill_group()

        election = wait(lambda: self.sites.leader() not in (None, leader), 60,
                        "a new Consul leader")
        new = self.sites.leader()
        assert new is not None
        time.sleep(3)
        self.sites.revive(leader.name)
        revived = time.monotonic()

        def healthy() -> bool:  # autopilot: every server alive, in step with the leader
            r = self.consul_via(new.name, "/operator/autopilot/health", operator=True)
            servers = r.json()["Servers"] if r.status_code == 200 else []
            return (len(servers) == self.sites.servers
                    and all(s["Healthy"] and s["Voter"] for s in servers))

        wait(lambda: not healthy(), 30, "autopilot noticing the killed server")
        rejoin = wait(healthy, 90, "every Consul server healthy again")
        return self.event("5a", "the Consul leader killed", "all", cut, time.monotonic(),
                          "the killed server back, healthy, a voter", rejoin, revived - cut,
                          election, killed=leader.name, elected=new.name)

    def center_host(self, hold_s: float = 10) -> Event:
        """5b. The center's host powered off (the center and its agent), then back."""
        assert self.traffic is not None
        cut = time.monotonic()
        self.sites.kill_host("center")
        time.sleep(hold_s)
        marked = sum(t == "edge-degraded" for a in self.traffic.between(cut + 3,
                                                                        time.monotonic())
                     for t in a.tiers)
        healed = time.monotonic()
        self.sites.revive_host("center")
        resumed = [wait(partial(self.resumed, s, healed), 120, f"escalation from {s} resuming")
                   for s in self.sites.edge_sites]
        failover = [self.traffic.first_after(cut, s, degraded) for s in self.sites.edge_sites]
        return self.event("5b", "the center host killed", "all", cut, time.monotonic(),
                          "every site's rows escalated again", max(resumed), healed - cut,
                          None if None in failover else max(f for f in failover if f is not None),
                          degraded_during=marked)

    # -- the registry group: a primary and a standby on two hosts of the center site ------

    def registries(self) -> tuple[str, str]:
        """(the primary, the standby) now."""
        wait(lambda: self.sites.primary() is not None, 60, "a primary registry")
        primary = self.sites.primary() or "registry"
        return primary, next(n for n in self.sites.registry_homes() if n != primary)

    def cheap_write(self, name: str, capacity: int = 100,
                    **env: str) -> subprocess.CompletedProcess[str]:
        """A write that costs nothing to serving (a static cascade policy keeps the edges'
        thresholds), tried on ``name``'s home: exit 0 accepted, 6 refused (not primary)."""
        return self.registry_at(self.sites.registry_homes()[name], "cascade", MODEL, "--mode",
                                "static", "--capacity", str(capacity), check=False, env=env)

    def restore_policy(self) -> None:
        self.registry("cascade", MODEL, "--mode", "auto", "--measured")

    def caught_up(self, follower: str, primary: str) -> bool:
        homes = self.sites.registry_homes()
        return (self.sites.registry_roles()[follower] == "standby"
                and audit_chain(homes[follower]) == audit_chain(homes[primary]))

    def registry_host(self, hold_s: float = 5) -> Event:
        """6a. The primary registry's host powered off (the registry and its Consul agent):
        the standby takes the lock, accepts a publish that reaches every node, and the
        revived host comes back a standby holding the new primary's chain."""
        old, new = self.registries()
        homes = self.sites.registry_homes()
        cut = time.monotonic()
        self.sites.kill_host(old)
        promoted = wait(lambda: self.sites.registry_roles()[new] == "primary", 90,
                        f"{new} primary", every=0.1)
        first_write = wait(lambda: self.cheap_write(new).returncode == 0, 60,
                           f"a write accepted by {new}", every=0.1) + promoted
        published = json.loads(self.registry_at(homes[new], "publish", self.release, "--name",
                                                 MODEL, "--json").stdout)
        target = int(published["manifest"]["version"])
        rollout = wait(partial(self.all_serve, target), 180, f"every node on version {target}")
        time.sleep(max(0.0, hold_s - (time.monotonic() - cut)))
        revived = time.monotonic()
        self.sites.revive_host(old)
        back = wait(partial(self.caught_up, old, new), 120,
                    f"{old} a standby holding {new}'s chain")
        audits = {n: self.registry_at(h, "audit", "--verify", check=False).returncode
                  for n, h in homes.items()}
        self.restore_policy()
        return self.event("6a", "the primary registry's host killed", "all", cut,
                          time.monotonic(), f"{old} back, a standby with {new}'s chain", back,
                          revived - cut, promoted, killed=old, primary=new,
                          first_write_s=round(first_write, 1), target=target,
                          rollout_s=round(rollout, 1), audit_rc=audits,
                          roles=self.sites.registry_roles())

    def registries_partitioned(self, hold_s: float = 8, sync_timeout_s: float = 1) -> Event:
        """6b. The two registry hosts cut from each other only (both reach Consul): no
        failover; a publish on the primary stands on it alone (it says so after
        ``sync_timeout_s``); the standby catches up after the heal."""
        primary, standby = self.registries()
        homes = self.sites.registry_homes()
        net = self.sites.network
        host = self.sites.host(primary)
        cut = time.monotonic()
        net.cut([host], [self.sites.host(standby).address])
        try:
            publish = self.registry_at(homes[primary], "publish", self.release, "--name",
                                       MODEL, "--json", check=False,
                                       env={"REGISTRY_SYNC_TIMEOUT_S": str(sync_timeout_s)})
            time.sleep(max(0.0, hold_s - (time.monotonic() - cut)))
            roles = self.sites.registry_roles()
        finally:
            healed = time.monotonic()
            net.heal([host])
        back = wait(partial(self.caught_up, standby, primary), 120,
                    f"{standby} catching up with {primary}")
        self.restore_policy()
        return self.event("6b", "the registry hosts cut from each other", "all", cut,
                          time.monotonic(), f"{standby} holding {primary}'s chain", back,
                          healed - cut, primary=primary, roles_during=roles,
                          publish_rc=publish.returncode,
                          publish_warning="asynchronously" in publish.stderr)

    def primary_from_consul(self, hold_s: float = 6) -> Event:
        """6c. The primary registry's host cut from every other host (the Consul servers
        included): its lease runs out and it refuses writes, the standby takes over; after the
        heal the old primary is a standby. Meanwhile a loop tries a cheap write on both homes
        and records when each was accepted (no split brain: the old primary accepts nothing
        once the new one has)."""
        old, new = self.registries()
        net = self.sites.network
        host = self.sites.host(old)
        others = [h.address for h in net.hosts.values() if h != host] + [net.gateway]
        tries: list[tuple[str, float, float, int]] = []  # (registry, sent, done, exit code)
        stop = threading.Event()

        def loop(name: str) -> None:
            # a value no other try uses: a policy already in place is no change, and exits
            # 0 without writing (both loops once took 100 + len(tries) at the same moment,
            # and a standby holding the new primary's copy of that value "accepted" it)
            values = itertools.count(1000 + (name == old), 2)
            while not stop.is_set():
                sent = time.monotonic()
                rc = self.cheap_write(name, next(values),
                                      REGISTRY_SYNC_TIMEOUT_S="0.5").returncode
                tries.append((name, sent, time.monotonic(), rc))
                time.sleep(0.1)

        threads = [threading.Thread(target=loop, args=(n,), daemon=True) for n in (old, new)]
        for thread in threads:
            thread.start()
        cut = time.monotonic()
        try:
            net.cut([host], others)
            fenced = wait(lambda: any(n == old and s > cut and rc == 6
                                      for n, s, _, rc in list(tries)), 60,
                          f"{old} refusing writes", every=0.1)
            took_over = wait(lambda: any(n == new and rc == 0 for n, _, _, rc in list(tries)),
                             90, f"{new} accepting writes", every=0.1)
            time.sleep(hold_s)
        finally:
            healed = time.monotonic()
            net.heal([host])
        try:
            back = wait(partial(self.caught_up, old, new), 120,
                        f"{old} a standby holding {new}'s chain")
            time.sleep(1)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
        homes = self.sites.registry_homes()
        first_new = min(d for n, _, d, rc in tries if n == new and rc == 0)
        late = [(round(s - cut, 2), round(d - cut, 2)) for n, s, d, rc in tries
                if n == old and rc == 0 and s >= first_new]
        self.restore_policy()
        wait(partial(self.caught_up, old, new), 60, f"{old} holding {new}'s last writes")
        return self.event("6c", "the primary registry cut from Consul", "all", cut,
                          time.monotonic(), f"{old} a standby with {new}'s chain", back,
                          healed - cut, took_over, old=old, new=new, fenced_s=round(fenced, 1),
                          old_accepted_after_new=late,
                          old_codes=sorted({rc for n, s, _, rc in tries if n == old and s > cut}),
                          tries=len(tries), roles=self.sites.registry_roles(),
                          chains_equal=audit_chain(homes[old]) == audit_chain(homes[new]))

    def converged(self) -> dict[str, Any]:
        """After everything: each node's version, the registry's rollout states, the audit."""
        latest = max(int(v["version"]) for v in json.loads(
            self.registry("show", MODEL, "--json").stdout))
        wait(lambda: self.all_serve(latest), 120, f"every node on version {latest}")
        status = json.loads(self.registry("status", "--json").stdout)
        audit = self.registry("audit", "--verify", check=False)
        return {"latest": latest, "versions": {n: self.version(n) for n in self.nodes()},
                "status": status, "audit_rc": audit.returncode,
                "audit": (audit.stdout + audit.stderr).strip()[-400:]}

    # -- a site link with added latency ----------------------------------------------------

    def escalation_latency(self, delay_s: float = 0.020, requests: int = 100) -> dict[str, Any]:
        """Two extra edges at the first edge site, on the same release, escalating (nearly)
        every row: one straight to the center, one through a proxy that adds ``delay_s`` each
        way; the same two-row requests sent to each in turn. p50 and p99 of each, in ms."""
        site = self.sites.edge_sites[0]
        center = self.sites.host("center")
        target = (center.address, CENTER_PORT)
        results: dict[str, Any] = {}
        with DelayProxy(target, delay_s, host=self.sites.network.gateway) as proxy:
            links = {"direct": f"https://{center.address}:{CENTER_PORT}",
                     f"+{delay_s * 1000:.0f} ms each way":
                         f"https://{proxy.host}:{proxy.port}"}
            edges = []
            try:
                for i, (label, url) in enumerate(links.items()):
                    edges.append((label, self._probe_edge(f"{site}-wan{i}", site, url)))
                with httpx.Client(timeout=10, verify=self.ca) as http:
                    times: dict[str, list[float]] = {label: [] for label in links}
                    for n in range(requests + 5):
                        for label, url in edges:
                            sent = time.monotonic()
                            r = http.post(f"{url}/v2/models/{MODEL}/infer", content=body(n))
                            tiers = next(o["data"] for o in r.json()["outputs"]
                                         if o["name"] == "tier")
                            if r.status_code != 200 or not escalated(
                                    Answer(0, 0, "", 200, False, tuple(tiers))):
                                raise RuntimeError(f"{label}: {r.status_code} {tiers}")
                            if n >= 5:  # the first few open connections
                                times[label].append((time.monotonic() - sent) * 1000)
            finally:
                for _, url in edges:
                    self._stop_probe(url)
        for label, values in times.items():
            values.sort()
            results[label] = {"p50_ms": statistics.median(values),
                              "p99_ms": values[int(0.99 * (len(values) - 1))]}
        return results

    def _probe_edge(self, name: str, site: str, center_url: str) -> str:
        host = self.sites.network.add(site, name)
        store = self.sites.root / "stores" / name
        self.registry("pull", MODEL, "--tier", "edge", "--store", store)
        argv = tier_argv("edge", EDGE_PORT, store, name, "--host", host.address, "--grpc-port",
                         "0", "--center-url", center_url, "--center-ca",
                         str(self.sites.tls / "ca.pem"), *EDGE_FLAGS, region=site)
        self.sites.placement[name] = host
        if self.sites.provision:  # its identity, token and certificate, as every edge's
            self.sites.provision_node(name, "edge", site, (host.address, "127.0.0.1"))
        self.sites.without_consul.add(name)  # a static center URL: no discovery
        self.sites.spawn(name, argv, EDGE_PORT, "edge")
        url = self.sites.node_url(name)  # HTTPS with its own certificate when provisioned
        wait(lambda: httpx.get(f"{url}/v2/health/ready", timeout=1,
                               verify=self.ca).status_code == 200, 60, f"{name} ready")
        return url

    def _stop_probe(self, url: str) -> None:
        for name, host in list(self.sites.placement.items()):
            if url.endswith(f"//{host.address}:{EDGE_PORT}") and name in self.sites.children:
                self.sites.children[name].stop()


def audit_chain(home: Path) -> list[tuple[int, str, str]]:
    """A registry's audit chain (seq, action, hash), read from its database."""
    with contextlib.closing(sqlite3.connect(f"file:{home / 'registry.sqlite3'}?mode=ro",
                                            uri=True)) as conn:
        return [(int(q), str(a), str(h)) for q, a, h in
                conn.execute("SELECT seq, action, hash FROM audit ORDER BY seq")]


# Which rows escalate depends on the INT8 model's confidence, which depends on the CPU: a row
# may clear even the 0.999 threshold somewhere. So an answer counts by what happened to the
# rows that did escalate, never by how many there were.


def degraded(answer: Answer) -> bool:
    """The rows that asked for the center were answered at the edge, marked degraded."""
    return (answer.status == 200 and "edge-degraded" in answer.tiers
            and "center" not in answer.tiers)


def escalated(answer: Answer) -> bool:
    """The center answered the rows that asked for it; none was left degraded."""
    return (answer.status == 200 and "center" in answer.tiers
            and "edge-degraded" not in answer.tiers)


@contextmanager
def running(root: Path, release: Path, release_b: Path, prefix: str = "10.77",
            echo: Callable[[str, str], None] | None = None) -> Iterator[Run]:
    """The topology up with ``release`` published and on every node; stopped (every process
    by PID, then the namespaces) on the way out."""
    home = root / "registry"
    # the sites test checks what is scraped, not what pages: one receiver that sends nothing
    receivers = root / "alertmanager.yml"
    receivers.write_text("route: {receiver: none}\nreceivers: [{name: none}]\n")
    sites = Sites(root, home, secrets.token_hex(16), network=Network(prefix),
                  edge_flags=EDGE_FLAGS, echo=echo, alertmanager_config=receivers,
                  registry_extra={"REGISTRY_CHUNK_BYTES": str(CHUNK),
                                  "REGISTRY_REPORT_INTERVAL_S": "1"})
    run = Run(sites, release, release_b)
    run.registry("publish", release, "--name", MODEL, "--create")  # the home, made here
    sites.network.create()
    try:
        sites.up(timeout=240)
        wait(lambda: run.all_serve(1), 120, "every node on version 1")
        yield run
    finally:
        if run.traffic is not None:
            run.traffic.stop()
        sites.stop()


def table(run: Run) -> Table:
    out = Table(title="Partitions with clients at both edge sites (one retry each)")
    for column in ("#", "partition", "cut (s)", "answered", "retried", "failed",
                   "slowest (s)", "failover (s)", "recovered when", "after heal (s)"):
        out.add_column(column)
    for e in run.events:
        out.add_row(e.number, e.name, f"{e.cut_s:.1f}", str(len(e.answers)), str(e.retried),
                    str(len(e.failed)), f"{e.slowest_s:.2f}",
                    "-" if e.failover_s is None else f"{e.failover_s:.1f}", e.recovery,
                    "-" if e.recovery_s is None else f"{e.recovery_s:.1f}")
    out.caption = ("failover: from the cut until the site's clients were steadily answered "
                   "the other way (1, 5b: degraded at the edge; 4: by the other site's edges; "
                   "5a: a new leader elected); 2 and 3 need none (serving goes on as it was)")
    return out
