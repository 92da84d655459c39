"""Replay a recording against a running ``tiered.stack.Stack`` while faults are injected.

Each request's fate is drawn from a seeded generator: dropped mid-request (``drop_rate``),
sent with a corrupted body (``corrupt_rate``, the four kinds of ``faults.CORRUPTIONS`` in turn)
or sent as recorded. Meanwhile the ``Chaos`` controller SIGKILLs an edge every
``edge_kill_every`` requests (the edges in turn; the stack's supervisor restarts them), the
center once, and ``registry serve`` twice during a publish (while it builds, and as its release
rolls out). Each kill is timed until the killed part is back: ready and passing in Consul (the
registry: every node serving the new release).
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from harness.chaos import faults
from harness.chaos.record import Recorded, labels_of
from harness.processes import BIN
from tiered.children import Child
from tiered.stack import Stack


@dataclass(frozen=True)
class Plan:
    drop_rate: float = 0.10
    corrupt_rate: float = 0.05
    edge_kill_every: int = 100
    center_kill_at: float = 0.3  # share of the run
    publish_at: float = 0.55
    concurrency: int = 4
    seed: int = 20261130
    recovery_timeout_s: float = 120


@dataclass
class Tally:
    sent: int = 0
    well_formed: int = 0
    corrupted: int = 0
    dropped: int = 0
    ok: int = 0  # 2xx
    client_errors: int = 0  # 4xx
    corrupted_4xx: int = 0
    server_errors: int = 0  # 5xx to well-formed requests
    corrupted_5xx: int = 0
    well_formed_4xx: int = 0
    transport_errors: int = 0  # a request that got no HTTP answer at all (after a retry)
    retried: int = 0  # sent again once: the connection closed before an answer came
    degraded: int = 0  # 2xx answers with rows the edge answered alone (center unreachable)
    same_as_recorded: int = 0
    comparable: int = 0  # 2xx answers from the recorded version on both tiers, not degraded
    statuses: Counter[int] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0


@dataclass
class Kill:
    kind: str  # edge, center, registry
    target: str
    at_request: int
    killed_at: float
    recovered_s: float | None = None
    detail: str = ""
    done: threading.Event = field(default_factory=threading.Event, repr=False)


class Chaos:
    """Kills parts of ``stack`` at planned points of the replay and times their recovery."""

    def __init__(self, stack: Stack, plan: Plan, total: int, model: str,
                 publish: Path | None) -> None:
        self.stack, self.plan, self.total, self.model, self.publish = (
            stack, plan, total, model, publish)
        self.kills: list[Kill] = []
        self.published_version: int | None = None
        self.publish_error: str | None = None
        self._edge_turn = 0
        self._edge_recovered = threading.Event()
        self._edge_recovered.set()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    # -- called by the replay as request number n (1-based) is about to go ------------------

    def before(self, n: int) -> None:
        if n % self.plan.edge_kill_every == 0:
            # the previous edge must be back first: with both edges dead nothing could answer
            self._edge_recovered.wait(self.plan.recovery_timeout_s)
            self._kill_edge(n)
        if n == max(1, int(self.total * self.plan.center_kill_at)):
            center = next(c for c in self.stack.children.values() if c.role == "center")
            self._kill_and_watch("center", center, n)
        if self.publish is not None and n == max(1, int(self.total * self.plan.publish_at)):
            self._start(self._publish_with_registry_kills, n)

    def _kill_edge(self, n: int) -> None:
        edges = [c for c in self.stack.children.values() if c.role == "edge"]
        edge = edges[self._edge_turn % len(edges)]
        self._edge_turn += 1
        self._edge_recovered.clear()
        self._kill_and_watch("edge", edge, n, on_back=self._edge_recovered.set)

    def _kill_and_watch(self, kind: str, child: Child, n: int,
                        on_back: Callable[[], None] | None = None) -> Kill:
        kill = Kill(kind, child.name, n, time.monotonic())
        with self._lock:
            self.kills.append(kill)
        child.kill()

        def watch() -> None:
            try:
                self._wait(lambda: self._back(child), f"{child.name} back")
                kill.recovered_s = time.monotonic() - kill.killed_at
            except TimeoutError as exc:
                kill.detail = str(exc)
            finally:
                kill.done.set()
                if on_back is not None:
                    on_back()

        self._start(watch)
        return kill

    def _back(self, old: Child) -> bool:
        """Restarted (a new PID), ready, and passing in Consul."""
        child = self.stack.children[old.name]
        if child.pid == old.pid or child.process.poll() is not None:
            return False
        service = f"tiered-{old.role}"
        passing = self.stack.passing().get(service, [])
        if old.role == "registry":
            return any(str(child.port) in p for p in passing)
        if old.name not in passing:
            return False
        return httpx.get(f"{self.stack.node_url(old.name)}/v2/health/ready", timeout=2,
                         verify=self.stack.verify).status_code == 200

    # -- the registry, killed during a publish ----------------------------------------------

    def _publish_with_registry_kills(self, n: int) -> None:
        assert self.publish is not None
        started = time.monotonic()
        proc = subprocess.Popen([str(BIN / "registry"), "publish", str(self.publish), "--name",
                                 self.model, "--json"], env=self.stack.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)  # the publish is validating/exporting/quantizing now
        during = self._kill_and_watch("registry", self.stack.children["registry"], n)
        during.detail = "during publish (building)"
        out, err = proc.communicate(timeout=600)
        if proc.returncode != 0:
            self.publish_error = err.strip()[-500:]
            return
        self.published_version = int(json.loads(out)["manifest"]["version"])
        # again as the release rolls out: nodes are fetching from the registry now
        during.done.wait(self.plan.recovery_timeout_s)
        rollout = self._kill_and_watch("registry", self.stack.children["registry"], n)
        rollout.detail = (f"as v{self.published_version} rolls out "
                          f"({time.monotonic() - started:.1f} s after publish began)")

        def converged() -> bool:
            return self.fleet_versions() == {self.published_version}

        try:
            self._wait(converged, f"every node serving v{self.published_version}")
            rollout.detail += f"; every node serving v{self.published_version} after " \
                              f"{time.monotonic() - rollout.killed_at:.1f} s"
        except TimeoutError as exc:
            rollout.detail += f"; {exc}"

    def fleet_versions(self) -> set[int]:
        """The versions the centers and edges serve, as their Consul meta says (``m=v``)."""
        versions = set()
        for role in ("center", "edge"):
            rows = httpx.get(f"http://{self.stack.consul}/v1/health/service/tiered-{role}",
                             headers=self.stack.consul_headers(), timeout=2).json()
            for row in rows:
                served = dict(pair.split("=", 1) for pair in
                              row["Service"]["Meta"].get("versions", "").split(",") if pair)
                versions.add(int(served.get(self.model, -1)))
        return versions

    # -- plumbing ------------------------------------------------------------------------

    def _start(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _wait(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + self.plan.recovery_timeout_s
        while time.monotonic() < deadline:
            try:
                if condition():
                    return
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"no {what} within {self.plan.recovery_timeout_s:.0f} s")

    def join(self) -> None:
        """Wait for every recovery watcher and the publish to finish."""
        for thread in list(self._threads):
            thread.join(self.plan.recovery_timeout_s * 3)


def fates(count: int, plan: Plan) -> list[str]:
    """Per request: ``drop-midway``, ``drop-unread``, a corruption kind, or ``ok``."""
    rng = random.Random(plan.seed)
    out, corrupted, dropped = [], 0, 0
    for _ in range(count):
        roll = rng.random()
        if roll < plan.drop_rate:
            out.append("drop-midway" if dropped % 2 == 0 else "drop-unread")
            dropped += 1
        elif roll < plan.drop_rate + plan.corrupt_rate:
            out.append(faults.CORRUPTIONS[corrupted % len(faults.CORRUPTIONS)])
            corrupted += 1
        else:
            out.append("ok")
    return out


def replay(url: str, recording: list[Recorded], plan: Plan,
           chaos: Chaos | None = None, recorded_version: int | None = None) -> Tally:
    """Send every recorded request once (``plan.concurrency`` at a time) with its fate."""
    tally = Tally()
    plan_fates = fates(len(recording), plan)
    host = urlsplit(url).hostname or "127.0.0.1"
    port = urlsplit(url).port or 80
    lock, take_lock = threading.Lock(), threading.Lock()
    cursor = iter(range(len(recording)))

    def take() -> int | None:
        # under the cursor's lock: no request goes past a kill point until the kill is done
        with take_lock:
            i = next(cursor, None)
            if i is None:
                return None
            if chaos is not None:
                chaos.before(i + 1)
        with lock:
            tally.sent += 1
        return i

    def worker() -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            while (i := take()) is not None:
                _one(http, host, port, recording[i], plan_fates[i], tally, lock,
                     recorded_version)

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(plan.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tally.seconds = time.monotonic() - started
    return tally


def _one(http: httpx.Client, host: str, port: int, rec: Recorded, fate: str, tally: Tally,
         lock: threading.Lock, recorded_version: int | None) -> None:
    if fate.startswith("drop"):
        body = json.dumps(rec.body).encode()
        try:
            faults.drop(host, port, rec.path, body, midway=fate == "drop-midway")
        except OSError as exc:
            with lock:
                tally.errors[f"drop: {type(exc).__name__}"] += 1
        with lock:
            tally.dropped += 1
        return
    corrupted = fate != "ok"
    body = faults.corrupt(rec.body, fate) if corrupted else json.dumps(rec.body).encode()
    try:
        try:
            response = http.post(rec.path, content=body,
                                 headers={"Content-Type": "application/json"})
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            # a keep-alive connection closed under the request (nginx's old worker exits on
            # every reload): retried once, as a client library with retries would
            with lock:
                tally.retried += 1
                tally.errors[f"retried once: {type(exc).__name__}"] += 1
            response = http.post(rec.path, content=body,
                                 headers={"Content-Type": "application/json"})
    except httpx.HTTPError as exc:
        with lock:
            tally.corrupted += corrupted
            tally.well_formed += not corrupted
            tally.transport_errors += not corrupted
            tally.errors[f"{fate}: {type(exc).__name__}"] += 1
        return
    _count(response, rec, corrupted, tally, lock, recorded_version)


def _count(response: httpx.Response, rec: Recorded, corrupted: bool, tally: Tally,
           lock: threading.Lock, recorded_version: int | None) -> None:
    status = response.status_code
    degraded = same = comparable = False
    if status == 200 and not corrupted:
        parameters = response.json().get("parameters", {})
        degraded = bool(parameters.get("degraded"))
        # comparable: answered by the recorded version on both tiers (while a new version
        # rolls out, an edge still on it may escalate rows to a center already on the next)
        centers = set(str(parameters.get("center_version") or "").split(",")) - {""}
        if (not degraded and parameters.get("edge_version") == recorded_version
                and centers <= {str(recorded_version)}):
            comparable, same = True, labels_of(response) == rec.labels
    with lock:
        tally.statuses[status] += 1
        tally.corrupted += corrupted
        tally.well_formed += not corrupted
        tally.ok += 200 <= status < 300
        tally.client_errors += 400 <= status < 500
        tally.corrupted_4xx += corrupted and 400 <= status < 500
        tally.well_formed_4xx += not corrupted and 400 <= status < 500
        tally.server_errors += not corrupted and status >= 500
        tally.corrupted_5xx += corrupted and status >= 500
        tally.degraded += degraded
        tally.comparable += comparable
        tally.same_as_recorded += same
        if status >= 500 or (status >= 400 and not corrupted):
            tally.errors[f"{'corrupted' if corrupted else 'well-formed'}: HTTP {status}: "
                         f"{response.text[:120]}"] += 1
