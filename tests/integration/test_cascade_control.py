"""The cascade controller end to end: a real ``registry serve``, a center that reports its
capacity and two edges, all syncing the tiny release over loopback. Budgets reach the edges
over the sync stream, follow the capacity the registry is told, and rows over budget come back
``edge-shed``, while batched requests against a center with spare capacity shed none. The tests
share one fleet and run in file order."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from edge.controller import floor_threshold
from harness.processes import RegistryProcess, code_path, free_port, start_registry
from tests.conftest import RegistryCli
from tests.integration.test_sync import metric, wait_for
from tests.servers import Server, start

pytestmark = [pytest.mark.integration, pytest.mark.slow]
TOKEN = "test-token-0123456789"
CAPACITY = 40.0  # what the center says it takes (--capacity-rows-s)
REGISTRY_ENV = {"REGISTRY_REPORT_INTERVAL_S": "0.5"}
SYNC = ("--sync-backoff-max-s", "1")
TEXTS = ["a great film", "dull and slow", "not bad at all", "the worst", "fine", "loved it",
         "boring plot", "superb acting", "meh", "an instant classic"]


@dataclass
class Fleet:
    cli: RegistryCli
    registry: RegistryProcess
    center: Server
    edges: list[Server] = field(default_factory=list)
    grpc_port: int = 0  # the first edge's


def body(texts: list[str], **parameters: Any) -> str:
    return json.dumps({"inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES",
                                   "data": texts}], "parameters": parameters})


def infer(edge: Server, texts: list[str], **parameters: Any) -> dict[str, Any]:
    response = httpx.post(f"{edge.url}/v2/models/tiny/infer", content=body(texts, **parameters),
                          headers={"content-type": "application/json"}, timeout=10)
    assert response.status_code == 200, response.text
    return dict(response.json())


@contextmanager
def traffic(edges: list[Server], rates: list[float]) -> Iterator[None]:
    """Requests of one text each to every edge at about its rate (per second) until exit."""
    stop = threading.Event()

    def send(edge: Server, rate: float) -> None:
        with httpx.Client(timeout=10) as client:
            i = 0
            while not stop.is_set():
                client.post(f"{edge.url}/v2/models/tiny/infer", content=body([TEXTS[i % 10]]),
                            headers={"content-type": "application/json"})
                i += 1
                stop.wait(1 / rate)

    threads = [threading.Thread(target=send, args=(e, r), daemon=True)
               for e, r in zip(edges, rates, strict=True)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(15)


def _serves(server: Server) -> bool:
    try:
        return httpx.get(f"{server.url}/v2/models/tiny/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def budgets(fleet: Fleet) -> list[float]:
    return [metric(f"{e.url}/metrics", "edge_cascade_budget_rows_per_second", model="tiny")
            for e in fleet.edges]


def near(total: float) -> Callable[[Fleet], bool]:
    return lambda fleet: abs(sum(budgets(fleet)) - total) <= 0.15 * total


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("cascade")
    cli = RegistryCli(root / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    registry = start_registry(cli.home, root, TOKEN, env=REGISTRY_ENV)
    servers: list[Server] = []
    try:
        center = start("center", root / "center", root, "--registry", registry.target, *SYNC,
                       "--capacity-rows-s", str(CAPACITY), registry_secret=TOKEN,
                       env=code_path())  # the nodes run the code under test
        servers.append(center)
        fleet = Fleet(cli, registry, center, grpc_port=free_port())
        for region, grpc_port in (("eu", fleet.grpc_port), ("us", 0)):
            # floor tolerance 0: the floor is the calibrated threshold, which leaves most of
            # the tiny model's rows unsure; every row the edge keeps is audited
            fleet.edges.append(start(
                "edge", root / f"edge-{region}", root, "--registry", registry.target, *SYNC,
                "--region", region, "--center-url", center.url, "--cache-size", "0",
                "--floor-tolerance", "0", "--audit-share", "1", "--grpc-port",
                str(grpc_port), registry_secret=TOKEN, env=code_path()))
            servers.append(fleet.edges[-1])
        wait_for(lambda: all(_serves(s) for s in servers), 60, "the fleet to install tiny")
        yield fleet
    finally:
        for server in reversed(servers):
            server.stop()
        registry.stop()


def test_budgets_reach_the_edges_split_by_their_traffic(fleet: Fleet) -> None:
    # 5:1 traffic, split at most 2:1: no edge counts more than twice the median of the others
    # (registry.fleet.budgets.MAX_SKEW; one edge's word must not take most of the budget)
    with traffic(fleet.edges, [40, 8]):
        seen: list[float] = []

        def split() -> bool:  # one reading; until the quiet edge's first report arrives the
            seen[:] = budgets(fleet)  # busy edge alone is budgeted (the whole 40)
            return (abs(sum(seen) - CAPACITY) <= 0.15 * CAPACITY and seen[1] > 0
                    and seen[0] > 1.5 * seen[1])

        wait_for(split, 40, "budgets summing to the center's capacity, the busy edge's the "
                 "larger, the quiet edge's above 0")
        busy, quiet = seen
        assert busy < 2.1 * quiet
        rows: dict[str, Any] = {}

        def reported() -> bool:  # each edge's next quality report carries its budget
            rows.update({r["node"]: r for r in fleet.cli("status", "--json").json()})
            return all(rows[f"edge-{e.port}"]["budget_rows_s"] > 0 for e in fleet.edges)

        wait_for(reported, 20, "every edge's budget in registry status")
    center = rows[f"center-{fleet.center.port}"]
    assert center["capacity_rows_s"] == CAPACITY
    for edge in fleet.edges:
        row = rows[f"edge-{edge.port}"]
        assert row["budget_rows_s"] > 0 and 0 < row["threshold"] <= 1
    text = fleet.cli("status").stdout
    assert "tiny: cascade" in text and "40.0/s" in text


def test_budgets_follow_a_change_of_capacity_and_policy_changes_are_audited(
        fleet: Fleet) -> None:
    with traffic(fleet.edges, [20, 20]):
        fleet.cli("cascade", "tiny", "--capacity", "8")
        wait_for(lambda: near(8)(fleet), 30, "budgets following capacity 8")
        fleet.cli("cascade", "tiny", "--mode", "static")
        wait_for(lambda: budgets(fleet) == [0.0, 0.0], 30, "no budget under a static policy")
        shown = fleet.cli("cascade", "tiny", "--mode", "auto", "--measured", "--json").json()
        assert shown == {"model": "tiny", "mode": "auto", "capacity_rows_s": None,
                         "split": "traffic", "max_capacity_rows_s": None,
                         "home": str(fleet.cli.home)}
        wait_for(lambda: near(CAPACITY)(fleet), 30, "budgets back to the center's capacity")
    records = [r for r in fleet.cli("audit", "--model", "tiny", "--json").json()
               if r["action"] == "cascade-policy"]
    assert len(records) == 3  # three changes; the budgets moving with reports are not audited
    assert json.loads(records[0]["payload"])["to"]["capacity_rows_s"] == 8


def test_a_center_joining_and_leaving_moves_the_budgets(fleet: Fleet, tmp_path: Path) -> None:
    with traffic(fleet.edges, [20, 20]):
        wait_for(lambda: near(CAPACITY)(fleet), 30, "budgets at the first center's capacity")
        second = start("center", tmp_path / "center-2", tmp_path, "--registry",
                       fleet.registry.target, *SYNC, "--capacity-rows-s", "20",
                       registry_secret=TOKEN, timeout=90)
        try:
            wait_for(lambda: _serves(second) and near(CAPACITY + 20)(fleet), 60,
                     "budgets growing with the second center")
        finally:
            second.stop()
        wait_for(lambda: near(CAPACITY)(fleet), 30, "budgets back once it left")


def test_rows_over_budget_are_answered_by_the_edge_marked_shed(fleet: Fleet) -> None:
    edge = fleet.edges[0]
    fleet.cli("cascade", "tiny", "--capacity", "0.5")
    try:
        wait_for(lambda: 0 < sum(budgets(fleet)) <= 0.6, 30, "a budget of 0.5 rows/s")
        answer = infer(edge, TEXTS * 4)
        tiers = answer["outputs"][[o["name"] for o in answer["outputs"]].index("tier")]["data"]
        assert answer["parameters"]["shed"] == tiers.count("edge-shed") > 0
        assert tiers.count("center") <= 2  # never more than the bucket holds
        assert metric(f"{edge.url}/metrics", "edge_rows_total", tier="edge-shed") >= \
            tiers.count("edge-shed")
        with traffic([edge], [20]):  # reports cover 0.5 s: keep shedding while we look
            wait_for(lambda: (({r["node"]: r for r in fleet.cli("status", "--json").json()}
                               [f"edge-{edge.port}"].get("shed_rate") or 0) > 0), 20,
                     "the shed rows in the edge's quality report")
    finally:
        fleet.cli("cascade", "tiny", "--measured")


def grpc_tiers(fleet: Fleet, texts: list[str], **parameters: Any) -> list[str]:
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{fleet.grpc_port}")
    try:
        text = triton_grpc.InferInput("text", [len(texts)], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
        result = client.infer("tiny", [text], parameters=parameters)
        return [t.decode() for t in result.as_numpy("tier")]
    finally:
        client.close()


def test_a_client_threshold_escalates_no_more_than_the_budget_over_rest_and_grpc(
        fleet: Fleet) -> None:
    """``threshold: 1`` asks for every row; the budget's bucket holds at most 2 (about a second
    of 0.5 rows/s, at least one token): the rest come back edge-shed, over either transport."""
    edge = fleet.edges[0]
    fleet.cli("cascade", "tiny", "--capacity", "0.5")
    try:
        wait_for(lambda: 0 < sum(budgets(fleet)) <= 0.6, 30, "a budget of 0.5 rows/s")
        before = metric(f"{edge.url}/metrics", "edge_rows_total", tier="center")
        answer = infer(edge, TEXTS * 4, threshold=1)
        tiers = answer["outputs"][[o["name"] for o in answer["outputs"]].index("tier")]["data"]
        assert set(tiers) <= {"center", "edge-shed"}  # every row asked for, most shed
        assert tiers.count("center") <= 2 and answer["parameters"]["shed"] >= 38
        over_grpc = grpc_tiers(fleet, TEXTS * 4, threshold=1.0)
        assert over_grpc.count("center") <= 2 and over_grpc.count("edge-shed") >= 38
        assert metric(f"{edge.url}/metrics", "edge_rows_total", tier="center") - before <= 4
    finally:
        fleet.cli("cascade", "tiny", "--measured")


def test_the_live_audit_reaches_metrics_and_status(fleet: Fleet) -> None:
    edge = fleet.edges[1]
    for _ in range(10):
        infer(edge, TEXTS)
    wait_for(lambda: metric(f"{edge.url}/metrics", "edge_audit_rows_total") > 0, 20,
             "audited rows")
    wait_for(lambda: ({r["node"]: r for r in fleet.cli("status", "--json").json()}
                      [f"edge-{edge.port}"].get("audit_rows") or 0) > 0, 20,
             "the audit in registry status")
    row = {r["node"]: r for r in fleet.cli("status", "--json").json()}[f"edge-{edge.port}"]
    assert 0 <= row["audit_agreement"] <= 1 and row["audit_expected"] > 0


@dataclass
class Batch:
    """A batched request of texts whose edge confidence is known: ``needed`` rows below the
    accuracy floor, the rest above it by a margin."""

    texts: list[str]
    needed: set[int]


def batch(fleet: Fleet, release: Path, needed: int, spare: int) -> Batch:
    """From the release's calibration texts, as the first edge scores them (``threshold: 0``:
    no row escalates), ``needed`` rows under the floor and ``spare`` rows over it, mixed."""
    floor = floor_threshold(fleet.cli.catalog().resolve("tiny").manifest.calibration, 0.0)
    pool = [json.loads(line)["text"] for line in
            (release / "calibration.jsonl").read_text().splitlines()]
    answer = infer(fleet.edges[0], pool, threshold=0)
    confidence = answer["outputs"][[o["name"] for o in answer["outputs"]].index("confidence")]
    low = [t for t, c in zip(pool, confidence["data"], strict=True) if c < floor - 0.02]
    high = [t for t, c in zip(pool, confidence["data"], strict=True) if c > floor + 0.02]
    assert low and high, (floor, sorted(confidence["data"]))
    texts = [high[i % len(high)] for i in range(spare)]  # repeats: the edges cache nothing
    places = range(0, needed * (spare // needed + 1), spare // needed + 1)
    for k, at in enumerate(places):
        texts.insert(at, low[k % len(low)])
    return Batch(texts, set(places))


def tiers_of(answer: dict[str, Any]) -> list[str]:
    return list(answer["outputs"][[o["name"] for o in answer["outputs"]].index("tier")]["data"])


def test_batched_requests_against_a_center_with_spare_capacity_shed_no_row(
        fleet: Fleet, tiny_release: Path) -> None:
    """The issue's case: light traffic puts the edge at center-only (spare capacity), then
    200-row requests arrive, more rows than the edge's budget holds. The rows below the floor
    escalate, the others escalate while the budget has room and are the edge's answer beyond
    it; none is shed. The center's 40 rows/s are no more than 40 rows/s: it is not overrun."""
    edge = fleet.edges[0]
    request = batch(fleet, tiny_release, needed=10, spare=190)
    with traffic([edge], [4]):
        wait_for(lambda: budgets(fleet)[0] >= 30 and metric(
            f"{edge.url}/metrics", "edge_cascade_threshold", model="tiny") == 1.0, 30,
            "the busy edge at center-only, with most of the 40 rows/s")
        assert budgets(fleet)[0] < 200  # the bucket holds less than one request
        before = metric(f"{edge.url}/metrics", "edge_rows_total", tier="edge-shed")
        answers = [infer(edge, request.texts) for _ in range(2)]  # back to back
    for answer in answers:
        tiers = tiers_of(answer)
        assert answer["parameters"]["shed"] == 0 and "edge-shed" not in tiers
        assert all(tiers[i] == "center" for i in request.needed)
        assert 10 <= tiers.count("center") < 200 and tiers.count("edge") > 0
    assert answers[0]["parameters"]["threshold"] == 1.0  # every row was wanted at the center
    assert metric(f"{edge.url}/metrics", "edge_rows_total", tier="edge-shed") == before


def test_a_center_at_its_capacity_sheds_only_rows_below_the_floor(
        fleet: Fleet, tiny_release: Path) -> None:
    edge = fleet.edges[0]
    request = batch(fleet, tiny_release, needed=20, spare=180)
    fleet.cli("cascade", "tiny", "--capacity", "2")
    try:
        wait_for(lambda: 0 < sum(budgets(fleet)) <= 2.2, 30, "a budget of 2 rows/s")
        answer = infer(edge, request.texts)
    finally:
        fleet.cli("cascade", "tiny", "--measured")
    tiers = tiers_of(answer)
    shed = {i for i, tier in enumerate(tiers) if tier == "edge-shed"}
    assert tiers.count("center") <= 2  # never more than the bucket holds
    assert len(shed) >= 18 and shed <= request.needed  # the spare rows are the edge's
    assert answer["parameters"]["shed"] == len(shed)
