"""The running fleet: a real Consul dev agent, nginx with its renderer, ``registry serve``, two
centers and two edges on loopback (``tiered.stack``), with the tiny release. (``tiered up``
itself: ``test_up.py``.)

The fleet tests share one stack and run in file order: they kill parts of it.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.processes import BIN, free_port
from serving.config import bundle
from tests.conftest import RegistryCli
from tests.servers import log_lines
from tiered import bundles
from tiered.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BODY = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["fine film"]}]}
ESCALATE = {**BODY, "parameters": {"threshold": 1}}  # every row goes to a center


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("stack")
    cli = RegistryCli(root / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    fleet = Stack(root, cli.home, "stack-token-0123456789", http_port=free_port(),
                  consul_port=free_port(), centers=2, grpc_port=free_port(),
                  nginx_flags=("--rate", "300", "--burst", "100", "--expose-center",
                               "--expose-registry-metrics"),
                  # the tiers' environment: access logs on, for the trace test's log lines
                  tracing={"EDGE_ACCESS_LOG": "true", "CENTER_ACCESS_LOG": "true"})
    try:
        fleet.up(timeout=120)
        yield fleet
    finally:
        fleet.stop()


def consul(stack: Stack, path: str) -> Any:
    headers = {"X-Consul-Token": stack.consul_tokens["management"]}
    return httpx.get(f"http://{stack.consul}{path}", headers=headers, timeout=5).json()


def infer(stack: Stack, body: dict[str, Any], path: str = "/v2/models/tiny/infer",
          **headers: str) -> httpx.Response:
    return httpx.post(stack.url + path, json=body, headers=headers, timeout=10)


def wait_for(condition: Any, timeout: float, what: str) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout}s")


def test_tiered_status_in_an_80_column_terminal_shows_every_node_in_full(stack: Stack) -> None:
    env = {**os.environ, "COLUMNS": "80", "TIERED_ROOT": str(stack.root), "TIERED_MODEL": "tiny"}

    def status(*flags: str) -> subprocess.CompletedProcess[str]:
        shown = subprocess.run([str(BIN / "tiered"), "status", *flags], env=env,
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        return shown

    def synced() -> bool:
        rows = json.loads(status("--json").stdout)
        return {r["node"] for r in rows if r["state"] == "ACTIVE"} >= {
            "center-1", "center-2", "edge-eu-1", "edge-us-1"}

    wait_for(synced, 60, "every node ACTIVE in tiered status --json")
    shown = status()
    lines = shown.stdout.splitlines()
    assert "…" not in shown.stdout and max(len(line) for line in lines) <= 80, shown.stdout
    text = " ".join(shown.stdout.split())
    for node in (_registry_id(stack), "center-1", "center-2", "edge-eu-1", "edge-us-1"):
        assert node in text, (node, shown.stdout)
    assert text.count("ACTIVE") >= 4 and text.count("passing") >= 5, shown.stdout


def test_every_service_is_passing_in_consul_with_its_tags(stack: Stack) -> None:
    assert stack.passing() == {"tiered-registry": [_registry_id(stack)],
                               "tiered-center": ["center-1", "center-2"],
                               "tiered-edge": ["edge-eu-1", "edge-us-1"]}
    def edges() -> dict[str, Any]:
        return {e["Service"]["ID"]: e for e in consul(stack, "/v1/health/service/tiered-edge")}

    # meta follows what is served: the version arrived by sync after the first registration
    wait_for(lambda: edges()["edge-eu-1"]["Service"]["Meta"]["versions"] == "tiny=1", 10,
             "the served version in the edge's Consul meta")
    eu = edges()["edge-eu-1"]["Service"]
    assert {"edge", "region-eu"} <= set(eu["Tags"])
    grpc_port = eu["Meta"].pop("grpc_port")
    assert eu["Meta"] == {"tier": "edge", "region": "eu", "node_id": "edge-eu-1",
                          "versions": "tiny=1"}
    checks = [c for c in edges()["edge-eu-1"]["Checks"] if c["ServiceID"] == "edge-eu-1"]
    by_type = {c["Type"]: c for c in checks}
    assert "/v2/health/ready" in by_type["http"]["Output"]
    # the gRPC port has its own check (grpc.health.v1 on that port), passing
    assert by_type["grpc"]["Status"] == "passing", by_type
    assert f":{grpc_port}" in by_type["grpc"]["Output"], by_type["grpc"]
    registry = consul(stack, "/v1/health/service/tiered-registry")[0]
    assert any(c["Type"] == "grpc" and c["Status"] == "passing" for c in registry["Checks"])


def _registry_id(stack: Stack) -> str:
    return f"registry-127.0.0.1-{stack.children['registry'].port}"


def test_no_secret_is_on_any_command_line(stack: Stack) -> None:
    """``ps`` shows every argv: the registry's secret is in its environment only, and each
    node's own token (not the registry's secret) is in its 0600 bundle, named by the
    environment."""
    tokens = {name: bundles.token(stack.token, name, child.role,
                                  bundle.load(stack.bundle(name)).region)
              for name, child in stack.children.items() if child.role in ("center", "edge")}
    for name, child in stack.children.items():
        argv = Path(f"/proc/{child.pid}/cmdline").read_bytes()
        assert stack.token.encode() not in argv, name
        assert not any(t.encode() in argv for t in tokens.values()), name
        environ = Path(f"/proc/{child.pid}/environ").read_bytes()
        if name in tokens:
            assert stack.token.encode() not in environ and tokens[name].encode() not in environ
            assert f"_BUNDLE={stack.bundle(name)}".encode() in environ
            assert bundle.load(stack.bundle(name)).token == tokens[name]


def test_nginx_routes_to_edges_and_escalations_reach_a_center(stack: Stack) -> None:
    answer = infer(stack, ESCALATE, **{"X-Request-ID": "stack-1"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-request-id"] == "stack-1"
    data = answer.json()
    tiers = next(o["data"] for o in data["outputs"] if o["name"] == "tier")
    assert tiers == ["center"] and data["parameters"]["center_version"] == "1"
    assert data["parameters"]["node_id"] in {"edge-eu-1", "edge-us-1"}
    assert re.fullmatch(r"[0-9a-f]{32}", infer(stack, BODY).headers["x-request-id"])
    for region in ("eu", "us"):  # the region hint picks that region's edge
        nodes = {infer(stack, BODY, **{"X-Tiered-Region": region}).json()["parameters"]
                 ["node_id"] for _ in range(6)}
        assert nodes == {f"edge-{region}-1"}
    direct = infer(stack, BODY, "/center/v2/models/tiny/infer")
    assert direct.status_code == 200 and direct.json()["parameters"]["center_version"] == 1
    assert "registry_sync_nodes_connected 4.0" in httpx.get(
        f"{stack.url}/registry/metrics", timeout=5).text
    # nothing but inference, the escalation API and read-only metrics: no Consul API or UI,
    # no tier /metrics or OpenAPI, nothing of the registry beyond its metrics
    for path in ("/admin", "/v1/agent/self", "/v1/kv/tiered", "/ui/", "/metrics", "/schema",
                 "/center/metrics", "/center/schema", "/registry/", "/registry/status"):
        missing = httpx.get(f"{stack.url}{path}", timeout=5)
        assert missing.status_code == 404 and "error" in missing.json(), path
    too_big = httpx.post(f"{stack.url}/v2/models/tiny/infer", content=b"x" * (9 << 20),
                         timeout=10)
    assert too_big.status_code == 413
    # a body nginx buffers to disk (> 16 KiB) reaches the edge, whichever user nginx's workers
    # run as: the edge refuses the 512 KiB string, nginx does not fail with a 500
    long = {"inputs": [{**BODY["inputs"][0], "data": ["x" * (1 << 19)]}]}
    refused = infer(stack, long)
    assert refused.status_code == 400 and "the limit is" in refused.json()["error"]


def test_binary_http_and_grpc_clients_work_through_nginx_unchanged(stack: Stack) -> None:
    """tritonclient.http with its defaults (binary both ways) on nginx's HTTP entry and
    tritonclient.grpc on its HTTP/2 entry (``grpc_pass`` to the edges' gRPC ports) answer what
    the JSON path answers; the region hint routes gRPC too; escalations reach a center."""
    import numpy as np
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    texts = ["fine film", "awful", "a touching story"]
    body = {"inputs": [{**BODY["inputs"][0], "shape": [3], "data": texts}]}
    want = {o["name"]: o["data"] for o in infer(stack, body).json()["outputs"]}
    raw = np.array([t.encode() for t in texts], dtype=object)
    http = triton_http.InferenceServerClient(stack.url.removeprefix("http://"))
    text = triton_http.InferInput("text", [3], "BYTES")
    text.set_data_from_numpy(raw)
    answer = http.infer("tiny", [text])
    assert all("data" not in o for o in answer.get_response()["outputs"])  # binary came back
    assert [v.decode() for v in answer.as_numpy("label")] == want["label"]
    assert answer.as_numpy("confidence").tolist() == \
        np.asarray(want["confidence"], dtype=np.float32).tolist()
    http.close()

    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny")
    text = triton_grpc.InferInput("text", [3], "BYTES")
    text.set_data_from_numpy(raw)
    result = client.infer("tiny", [text])
    assert [v.decode() for v in result.as_numpy("label")] == want["label"]
    assert result.as_numpy("probabilities").ravel().tolist() == \
        np.asarray(want["probabilities"], dtype=np.float32).tolist()
    for region in ("eu", "us"):  # the region hint picks that region's edge over gRPC too
        nodes = {client.infer("tiny", [text], headers={"x-tiered-region": region})
                 .get_response().parameters["node_id"].string_param for _ in range(4)}
        assert nodes == {f"edge-{region}-1"}
    escalated = client.infer("tiny", [text], parameters={"threshold": 1.0})
    assert [v.decode() for v in escalated.as_numpy("tier")] == ["center"] * 3
    client.close()


def test_the_clients_trace_context_passes_nginx_to_the_edge_and_the_center(
        stack: Stack) -> None:
    """Tracing is off here: the trace id still reaches every log line of the request, through
    nginx, the edge and the escalation to a center."""
    trace = "6e0c63257de34c92bf9efcd03927272e"
    body = {**ESCALATE, "inputs": [{**BODY["inputs"][0], "data": ["traced, not cached"]}]}
    answer = infer(stack, body, **{"traceparent": f"00-{trace}-00f067aa0ba902b7-01",
                                   "X-Request-ID": "stack-traced-1"})
    assert answer.status_code == 200
    node = answer.json()["parameters"]["node_id"]
    centers = [c for c in stack.children.values() if c.role == "center"]
    edge_lines = log_lines(stack.children[node], "stack-traced-1")
    center_lines = [line for c in centers for line in log_lines(c, "stack-traced-1", 2)]
    assert edge_lines and center_lines
    assert {line["trace_id"] for line in edge_lines + center_lines} == {trace}


def test_a_client_over_its_rate_limit_gets_429_in_the_v2_error_shape(stack: Stack) -> None:
    """300 requests that reach nginx together, however fast this machine is: the connections
    are opened first, then one request is written on each. The burst (100) passes, what the
    300/s refill cannot cover gets 429. The client is 127.0.0.2: a bucket of its own, so the
    other tests (127.0.0.1) are not limited afterwards."""
    request = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    connections: list[socket.socket] = []
    answers: list[tuple[int, str | None, bytes]] = []
    try:
        for _ in range(300):
            connections.append(socket.create_connection(
                ("127.0.0.1", stack.http_port), timeout=30, source_address=("127.0.0.2", 0)))
        for connection in connections:
            connection.sendall(request)
        for connection in connections:
            response = http.client.HTTPResponse(connection)
            response.begin()
            answers.append((response.status, response.getheader("retry-after"),
                            response.read()))
    finally:
        for connection in connections:
            connection.close()
    statuses = [status for status, _, _ in answers]
    print(f"{statuses.count(200)} answered, {statuses.count(429)} limited")
    assert set(statuses) == {200, 429}, statuses
    assert statuses.count(200) >= 100  # the burst is honoured
    limited = [(retry, body) for status, retry, body in answers if status == 429]
    assert all(retry == "1" for retry, _ in limited)
    assert json.loads(limited[0][1])["error"].startswith("too many requests")


def test_a_killed_edge_leaves_nginx_within_15s_and_retrying_clients_never_fail(
        stack: Stack) -> None:
    failures: list[str] = []
    served_by: list[str] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(base_url=stack.url, timeout=10) as http:
            while not stop.is_set():
                for attempt in (1, 2):  # a client that retries once
                    try:
                        r = http.post("/v2/models/tiny/infer", json=BODY)
                    except httpx.HTTPError as exc:
                        r, error = None, type(exc).__name__
                    else:
                        error = f"HTTP {r.status_code}"
                    if r is not None and r.status_code == 200:
                        served_by.append(r.json()["parameters"]["node_id"])
                        break
                    if attempt == 2:
                        failures.append(error)
                time.sleep(0.02)  # < 50 requests/s each: under the per-client rate limit

    workers = [threading.Thread(target=client) for _ in range(3)]
    for w in workers:
        w.start()
    try:
        time.sleep(1)
        killed_at = time.monotonic()
        stack.children["edge-us-1"].kill()
        critical = wait_for(lambda: "edge-us-1" not in stack.passing()["tiered-edge"], 15,
                            "Consul check turning critical")
        upstreams = stack.root / "nginx" / "upstreams.conf"
        port = stack.children["edge-us-1"].port
        # no longer a primary anywhere: only a last-resort backup while Consul lists it
        wait_for(lambda: f":{port} max_fails=0;" not in upstreams.read_text(), 15,
                 "nginx upstreams with the dead edge demoted to a backup")
        assert f":{port} max_fails=0 backup;" in upstreams.read_text()
        removed = time.monotonic() - killed_at
        served_by.clear()
        time.sleep(1)
    finally:
        stop.set()
        for w in workers:
            w.join()
    print(f"edge killed: critical in Consul after {critical:.1f}s, out of nginx after "
          f"{removed:.1f}s")
    assert failures == []
    assert set(served_by) == {"edge-eu-1"}


def test_one_of_two_centers_killed_escalations_continue(stack: Stack) -> None:
    stack.children["center-2"].kill()
    answers = [infer(stack, ESCALATE) for _ in range(20)]  # some start with the dead center
    assert [a.status_code for a in answers] == [200] * 20
    assert {next(o["data"][0] for o in a.json()["outputs"] if o["name"] == "tier")
            for a in answers} == {"center"}
    critical = wait_for(lambda: stack.passing()["tiered-center"] == ["center-1"], 15,
                        "Consul showing one passing center")
    print(f"center killed: critical in Consul within {critical:.1f}s of 20 escalations")


def test_consul_down_edges_keep_serving_then_everything_registers_again(stack: Stack) -> None:
    stack.children["consul"].stop()
    time.sleep(2)  # the watchers notice, and keep their last lists
    answers = [infer(stack, ESCALATE) for _ in range(10)]
    assert [a.status_code for a in answers] == [200] * 10
    assert {next(o["data"][0] for o in a.json()["outputs"] if o["name"] == "tier")
            for a in answers} == {"center"}  # the last known center, not degraded
    stack.start_consul()  # a dev agent starts empty: every service must register again
    wait_for(lambda: stack.passing() == {"tiered-registry": [_registry_id(stack)],
                                         "tiered-center": ["center-1"],
                                         "tiered-edge": ["edge-eu-1"]}, 30,
             "every live service registered and passing again")


def test_a_gracefully_stopped_node_deregisters(stack: Stack) -> None:
    stack.children["center-1"].stop()  # SIGTERM: drains, then leaves Consul
    registered = consul(stack, "/v1/agent/services")
    assert "center-1" not in registered and "edge-eu-1" in registered


def test_consul_acl_tokens_are_honoured(tmp_path: Path, tiny_release: Path) -> None:
    """ACLs on (the stack's default, deny): an edge registers with the edge token it is given;
    one given another role's token is refused; anonymous sees nothing.
    (Who may register what, service by service: ``test_consul_acl.py``.)"""
    cli = RegistryCli(tmp_path / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    stack = Stack(tmp_path / "stack", cli.home, "acl-test-token-0123456789",
                  http_port=free_port(),
                  consul_port=free_port())
    for name in ("edge-good-1", "edge-bad-1"):
        cli("pull", "tiny", "--tier", "edge", "--store", stack.root / "stores" / name)
    try:
        stack.start_consul()
        management = stack.consul_tokens["management"]
        stack.start_edge("edge-good-1", "eu")
        wait_for(lambda: "edge-good-1" in agent_services(stack, management), 20,
                 "edge-good-1 registered with the edge token")
        stack.consul_token = stack.consul_tokens["center"]  # every child from now on
        bad = stack.start_edge("edge-bad-1", "eu")
        wait_for(lambda: "cannot register" in bad.log.read_text(), 20,
                 "the edge reporting that Consul refused it")
        assert set(agent_services(stack, management)) == {"edge-good-1"}
        assert agent_services(stack, None) == {}  # anonymous sees nothing: deny is on
    finally:
        stack.stop()


def agent_services(stack: Stack, token: str | None) -> dict[str, Any]:
    headers = {"X-Consul-Token": token} if token else {}
    return dict(httpx.get(f"http://{stack.consul}/v1/agent/services", headers=headers,
                          timeout=5).json())
