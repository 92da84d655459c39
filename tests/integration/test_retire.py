"""``registry retire NAME`` end to end: a real ``registry serve``, a center and an edge that
verify releases (the registry's public key), over gRPC, serving two models.

Retiring one takes it off both nodes (404 on its readiness, gone from the ready list and the
stores) while the other answers every request sent meanwhile; the retire is audited, ``list``
and ``show`` say it is retired and keep its history, each node's RETIRED ack is in ``status``;
a node restarted afterwards does not load it; publishing it again brings it back; a retire
that is unsigned, signed by another key, replayed from before the republish, or signed for
another node unloads nothing (a stand-in registry sends them to the edge), and retiring a model
the registry does not know is one line, exit 2.

The tests share one fleet and run in file order.
"""

from __future__ import annotations

import contextlib
import json
import queue
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from harness.processes import RegistryProcess, code_path, start_registry, start_tier
from registry.settings import RegistrySettings
from registry.trust import keys
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from sync.wire import retire
from tests.conftest import RegistryCli
from tests.integration.test_sync import BODY, SYNC_FLAGS, TOKEN, wait_for
from tests.servers import BIN, Server

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ENV = {"REGISTRY_REPORT_INTERVAL_S": "0.5"}
KEEP, GONE = "keep", "gone"
ENV_NODE = {"PATH": str(BIN), **code_path()}  # the nodes run this checkout's code too


@dataclass
class Fleet:
    root: Path
    cli: RegistryCli
    registry: RegistryProcess
    center: Server
    edge: Server

    @property
    def nodes(self) -> list[Server]:
        return [self.center, self.edge]

    @property
    def public_key(self) -> str:
        return str(self.cli("key", "--json").json()["public_key_path"])

    def restart_edge(self, registry: str) -> None:
        """The edge again, same store and node id, subscribed to ``registry``."""
        node_id = self.edge.node_id
        self.edge.stop()
        self.edge = start_tier("edge", self.root / "edge", self.root, "--poll-interval-s", "0.2",
                               "--registry", registry, "--release-key", self.public_key,
                               *SYNC_FLAGS, "--center-url", self.center.url, "--cache-size", "0",
                               env=ENV_NODE, registry_secret=TOKEN, node_id=node_id)


def ready(server: Server, model: str) -> httpx.Response:
    return httpx.get(f"{server.url}/v2/models/{model}/ready", timeout=5)


def index(server: Server) -> list[str]:
    """The models a node serves (its readiness answer lists them)."""
    return list(httpx.get(f"{server.url}/v2/health/ready", timeout=5).json()["models"])


def serving(server: Server, model: str) -> bool:
    try:
        return ready(server, model).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("retire")
    cli = RegistryCli(root / "registry")
    with futures.ThreadPoolExecutor(2) as publishers:  # two publishers at once: time
        list(publishers.map(lambda name: cli("publish", tiny_release, "--name", name),
                            (KEEP, GONE)))
    registry = start_registry(cli.home, root, TOKEN, env=ENV)
    servers: list[Server] = []
    fleet: Fleet | None = None
    try:
        key = str(cli("key", "--json").json()["public_key_path"])
        flags = ("--poll-interval-s", "0.2", "--registry", registry.target, "--release-key",
                 key, *SYNC_FLAGS)
        env = ENV_NODE
        servers.append(start_tier("center", root / "center", root, *flags, env=env,
                                  registry_secret=TOKEN))
        servers.append(start_tier("edge", root / "edge", root, *flags, "--center-url",
                                  servers[0].url, "--cache-size", "0", env=env,
                                  registry_secret=TOKEN))
        fleet = Fleet(root, cli, registry, *servers)
        wait_for(lambda: all(serving(s, m) for s in fleet.nodes for m in (KEEP, GONE)), 60,
                 "both models on both nodes")
        yield fleet
    finally:
        if fleet is not None:
            servers.append(fleet.edge)  # restarted by the tests
        for server in servers:
            server.stop()
        registry.stop()


class Load:
    """Requests to ``keep`` on both nodes, one after another, until stopped (at most 5,000)."""

    def __init__(self, nodes: list[Server]) -> None:
        self.nodes, self.sent = nodes, 0
        self.failures: list[str] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self.done.is_set() and self.sent < 5000:
                node = self.nodes[self.sent % len(self.nodes)]
                try:
                    answer = client.post(f"{node.url}/v2/models/{KEEP}/infer", content=BODY)
                    if answer.status_code != 200:
                        self.failures.append(f"{node.tier}: {answer.status_code} {answer.text}")
                except httpx.HTTPError as exc:
                    self.failures.append(f"{node.tier}: {exc!r}")
                self.sent += 1

    def stop(self) -> None:
        self.done.set()
        self.thread.join(15)


def test_retire_takes_the_model_off_every_node_while_the_other_answers_every_request(
        fleet: Fleet) -> None:
    load = Load(fleet.nodes)
    wait_for(lambda: load.sent >= 10, 30, "the load running")
    said = fleet.cli("retire", GONE, "--reason", "misnamed calibration file")
    assert "gone: retired (production was version 1" in said.stdout
    wait_for(lambda: all(ready(s, GONE).status_code == 404 for s in fleet.nodes), 30,
             "gone off both nodes")
    before = load.sent
    wait_for(lambda: load.sent >= before + 10, 30, "more requests after the retire")
    load.stop()
    assert load.failures == [] and load.sent >= 20
    for server in fleet.nodes:
        answer = ready(server, GONE)
        assert answer.json() == {"error": "model 'gone' was retired by the registry: unknown "
                                          "here"}
        assert ready(server, KEEP).status_code == 200
        assert index(server) == [KEEP]
        assert not (fleet.root / server.tier / GONE).exists()  # out of the store: no CURRENT

    def acked() -> bool:
        rows = [r for r in fleet.cli("status", "--json").json() if r["model"] == GONE]
        return len(rows) == 2 and all(r["state"] == "RETIRED" for r in rows)

    wait_for(acked, 30, "both nodes' RETIRED acks")
    rows = [r for r in fleet.cli("status", "--json").json() if r["model"] == GONE]
    assert all(r["version"] is None and "unloaded version 1" in r["reason"] for r in rows)
    records = fleet.cli("audit", "--model", GONE, "--json").json()
    (made,) = [r for r in records if r["action"] == "retire"]
    assert (made["actor"], made["version"]) == ("tester@ci", 1)
    assert json.loads(made["payload"])["reason"] == "misnamed calibration file"
    acks = {r["actor"] for r in records if r["action"] == "ack"
            and json.loads(r["payload"])["state"] == "RETIRED"}
    assert acks == {f"node:{s.node_id}" for s in fleet.nodes}
    fleet.cli("audit", "--verify")


def test_list_and_show_keep_the_history_of_a_retired_model(fleet: Fleet) -> None:
    models = {m["name"]: m for m in fleet.cli("list", "--json").json()}
    assert models[GONE]["retired"] and models[GONE]["production"] is None
    assert models[GONE]["versions"] == 1 and models[KEEP]["retired"] is None
    assert "retired" in fleet.cli("list").stdout
    shown = fleet.cli("show", GONE)
    assert "retired at" in shown.stdout and "misnamed calibration file" in shown.stdout
    assert fleet.cli("show", f"{GONE}@1", "--json").json()["version"] == 1
    again = fleet.cli("retire", GONE)  # nothing to do: no second record
    assert "retired already" in again.stdout
    assert [r["action"] for r in fleet.cli("audit", "--model", GONE, "--json").json()].count(
        "retire") == 1


def test_retiring_an_unknown_model_is_one_line_and_exit_2(fleet: Fleet) -> None:
    result = fleet.cli("retire", "nosuch", check=False)
    assert result.code == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "error: no model named 'nosuch' in the registry (`registry list` shows the models)"]


def test_a_node_restarted_after_the_retire_does_not_load_it(fleet: Fleet) -> None:
    fleet.restart_edge(fleet.registry.target)
    assert ready(fleet.edge, GONE).status_code == 404
    assert index(fleet.edge) == [KEEP]
    assert not (fleet.root / "edge" / GONE).exists()


def test_publishing_again_brings_it_back_as_a_new_version(fleet: Fleet,
                                                          tiny_release: Path) -> None:
    fleet.cli("publish", tiny_release, "--name", GONE)  # version 2
    wait_for(lambda: all(serving(s, GONE) for s in fleet.nodes), 60, "gone back on both nodes")
    assert {ready(s, GONE).json()["version"] for s in fleet.nodes} == {"2"}
    model = {m["name"]: m for m in fleet.cli("list", "--json").json()}[GONE]
    assert (model["retired"], model["production"], model["versions"]) == (None, 2, 2)
    actions = [r["action"] for r in fleet.cli("audit", "--model", GONE, "--json").json()]
    assert actions.index("retire") < actions.index("unretire") < len(actions)


class StandIn(pb_grpc.SyncServicer):
    """A registry impostor (or a man in the middle): welcomes the node, sends what it is given,
    keeps the node's acks."""

    def __init__(self) -> None:
        self.outbox: queue.Queue[pb.ServerMessage] = queue.Queue()
        self.acks: queue.Queue[pb.Ack] = queue.Queue()

    def Sync(self, request_iterator: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        next(request_iterator)  # the hello
        yield pb.ServerMessage(welcome=pb.Welcome(registry="stand-in", report_interval_s=60))
        threading.Thread(target=self._read, args=(request_iterator,), daemon=True).start()
        while context.is_active():
            try:
                yield self.outbox.get(timeout=0.2)
            except queue.Empty:
                continue

    def _read(self, messages: Any) -> None:
        with contextlib.suppress(grpc.RpcError):  # the stream ends with the test
            for message in messages:
                if message.WhichOneof("kind") == "ack":
                    self.acks.put(message.ack)

    def answer(self, message: pb.Retire) -> pb.Ack:
        self.outbox.put(pb.ServerMessage(retire=message))
        return self.acks.get(timeout=30)


@pytest.fixture
def stand_in() -> Iterator[tuple[StandIn, str]]:
    servicer, server = StandIn(), grpc.server(futures.ThreadPoolExecutor(4))
    pb_grpc.add_SyncServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(0)


def test_an_unsigned_forged_replayed_or_misaddressed_retire_unloads_nothing(
        fleet: Fleet, stand_in: tuple[StandIn, str], tmp_path: Path) -> None:
    accepted = json.loads((fleet.root / "edge" / ".directives.json").read_text())[GONE]
    replayed_seq = next(r["seq"] for r in fleet.cli("audit", "--model", GONE, "--json").json()
                        if r["action"] == "retire")
    assert accepted["version"] == 2 and accepted["seq"] > replayed_seq
    servicer, target = stand_in
    fleet.restart_edge(target)
    ours = keys.signer(RegistrySettings(home=fleet.cli.home))
    other = fleet.cli("keygen", "--out", tmp_path / "other", "--json").json()
    theirs = keys.Signer(keys.load_private_key(Path(other["private_key_path"])))
    head, edge_id = "ab" * 32, fleet.edge.node_id

    def told(signer: keys.Signer | None, node_id: str, seq: int) -> pb.Retire:
        data = retire.RetireDirective(node_id, GONE, seq, head).encode()
        return pb.Retire(model=GONE, version=2, directive=data,
                         directive_signature=signer.sign(data) if signer else b"")

    refusals = {
        "unsigned": (told(None, edge_id, accepted["seq"] + 1), "signature"),
        "another key": (told(theirs, edge_id, accepted["seq"] + 1), "signature"),
        "replayed": (told(ours, edge_id, replayed_seq), "a replayed retire"),
        "as old as the release": (told(ours, edge_id, accepted["seq"]), "not newer"),
        "another node": (told(ours, "edge-elsewhere", accepted["seq"] + 1), "is for node"),
    }
    for what, (message, reason) in refusals.items():
        ack = servicer.answer(message)
        assert (ack.state, ack.model) == (pb.REFUSED, GONE), what
        assert reason in ack.reason, (what, ack.reason)
        assert ready(fleet.edge, GONE).json()["version"] == "2", what
    answer = httpx.post(f"{fleet.edge.url}/v2/models/{GONE}/infer", content=BODY, timeout=10)
    assert answer.status_code == 200 and (fleet.root / "edge" / GONE / "CURRENT").exists()
    # the registry's key, this node, newer than the release: obeyed (the stand-in is not broken)
    ack = servicer.answer(told(ours, edge_id, accepted["seq"] + 1))
    assert (ack.state, ack.directive_seq) == (pb.RETIRED, accepted["seq"] + 1)
    assert ready(fleet.edge, GONE).status_code == 404 and index(fleet.edge) == [KEEP]

