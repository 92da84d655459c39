"""Real ``center`` and ``edge`` processes on loopback, loaded with a tiny release via pull."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import RegistryCli
from tests.servers import Server, start

pytestmark = pytest.mark.integration
TEXTS = ["a great film", "awful", "meh", "wonderful acting and a touching story",
         "the plot makes no sense", "fine"]


@dataclass
class Stack:
    cli: RegistryCli
    release: Path
    root: Path
    center: Server
    edge: Server

    def infer(self, server: Server, body: dict[str, Any] | bytes, path: str = "/v2/models/"
              "tiny/infer", headers: dict[str, str] | None = None) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        return httpx.post(server.url + path, content=content, timeout=30,
                          headers={"content-type": "application/json", **(headers or {})})


def text_request(texts: list[str], **parameters: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": [{"name": "text", "shape": [len(texts)],
                                        "datatype": "BYTES", "data": texts}]}
    if parameters:
        body["parameters"] = parameters
    return body


def outputs(response: httpx.Response) -> dict[str, list[Any]]:
    assert response.status_code == 200, response.text
    return outputs_of(response.json())


def outputs_of(answer: dict[str, Any]) -> dict[str, list[Any]]:
    return {o["name"]: o["data"] for o in answer["outputs"]}


def check_labels(data: dict[str, list[Any]], labels: list[str]) -> np.ndarray:
    """The served ``label`` and ``confidence`` of each row are its probabilities' argmax and
    max; returns the probabilities, one row per input row."""
    probabilities = np.asarray(data["probabilities"], dtype=np.float64).reshape(
        len(data["label"]), len(labels))
    assert np.allclose(probabilities.sum(1), 1, atol=1e-5)
    assert data["label"] == [labels[i] for i in probabilities.argmax(1)]
    assert np.allclose(data["confidence"], probabilities.max(1), atol=1e-6)
    return probabilities


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}"
        time.sleep(0.01)


def metric(server: Server, name: str, **labels: str) -> float:
    """Sum of the samples of a Prometheus series whose labels include ``labels``."""
    total = 0.0
    for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        series, _, value = line.rpartition(" ")
        if (series == name or series.startswith(name + "{")) and all(
                f'{k}="{v}"' in series for k, v in labels.items()):
            total += float(value)
    return total


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("stack")
    cli = RegistryCli(root / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    for tier in ("center", "edge"):
        cli("pull", "tiny", "--tier", tier, "--store", root / tier)
    center = start("center", root / "center", root, "--access-log", "true")
    edge = start("edge", root / "edge", root, "--center-url", center.url)
    yield Stack(cli, tiny_release, root, center, edge)
    edge.stop()
    center.stop()


def test_v2_endpoints(stack: Stack) -> None:
    for server, platform in ((stack.center, "pytorch_libtorch"),
                             (stack.edge, "onnxruntime_onnx")):
        get = lambda path, s=server: httpx.get(s.url + path, timeout=10)  # noqa: E731
        assert get("/v2/health/live").json() == {"live": True}
        assert get("/v2/health/ready").status_code == 200
        assert get("/v2").json()["name"].startswith("tiered-")
        for prefix in ("/v2/models/tiny", "/v2/models/tiny/versions/1"):
            meta = get(prefix).json()
            assert meta["name"] == "tiny" and meta["versions"] == ["1"]
            assert meta["platform"] == platform
            assert {i["name"] for i in meta["inputs"]} == {"text", "input_ids", "attention_mask"}
            assert [o["name"] for o in meta["outputs"]] == ["label", "probabilities",
                                                            "confidence", "tier"]
            assert get(prefix + "/ready").json()["ready"] is True
        assert get("/v2/models/nope").status_code == 404
        assert get("/v2/models/tiny/versions/7").json()["error"].startswith("model 'tiny' has no")
        assert get("/v2/models/tiny/versions/7/ready").status_code == 404
        for path in ("/v2/models/tiny/infer", "/v2/models/tiny/versions/1/infer"):
            response = stack.infer(server, {"id": "req-7", **text_request(TEXTS[:2])}, path,
                                   headers={"X-Request-ID": "trace-1"})
            assert response.json()["id"] == "req-7"
            assert response.headers["x-request-id"] == "trace-1"
            assert response.json()["model_version"] == "1"
            data = outputs(response)
            assert len(data["label"]) == 2 and set(data["label"]) <= {"rotten", "fresh"}
            check_labels(data, meta["parameters"]["labels"].split(","))
        generated = stack.infer(server, text_request(["x"])).headers["x-request-id"]
        assert len(generated) == 32


def test_token_tensors_and_nested_data_answer_like_text(stack: Stack) -> None:
    by_text = outputs(stack.infer(stack.center, text_request(["a great film"])))
    ids = [[101, 1037, 2307, 2143, 102]]  # [CLS] a great film [SEP] (MiniLM vocabulary)
    tensors = {"inputs": [
        {"name": "input_ids", "shape": [1, 5], "datatype": "INT64", "data": ids},
        {"name": "attention_mask", "shape": [1, 5], "datatype": "INT64", "data": [[1] * 5]}]}
    by_ids = outputs(stack.infer(stack.center, tensors))
    assert np.allclose(by_text["probabilities"], by_ids["probabilities"], atol=1e-5)
    only = stack.infer(stack.edge, {**text_request(["fine"]), "outputs": [{"name": "tier"}]})
    assert [o["name"] for o in only.json()["outputs"]] == ["tier"]


def test_served_labels_are_the_models_answers_on_labelled_reviews(stack: Stack) -> None:
    """On the release's 200 labelled reviews each tier's served labels score what ``registry
    publish`` measured for its model (~62% for the tiny fixture; labels served inverted would
    score ~38%). A few rows may differ: batching pads differently, and INT8 differs slightly
    from CPU to CPU, so a margin of 10 rows."""
    rows = [json.loads(line) for line in
            (stack.release / "calibration.jsonl").read_text().splitlines() if line]
    texts, truth = [r["text"] for r in rows], [r["label"] for r in rows]
    manifest = stack.cli("show", "tiny@1", "--json").json()["manifest"]
    labels, calibration = manifest["labels"], manifest["calibration"]
    for server, measured, parameters in ((stack.center, "center_accuracy", {}),
                                         (stack.edge, "edge_accuracy", {"threshold": 0})):
        response = stack.infer(server, text_request(texts, **parameters),
                               "/v2/models/tiny/versions/1/infer")
        data = outputs(response)
        check_labels(data, labels)
        accuracy = float(np.mean([a == b for a, b in zip(data["label"], truth, strict=True)]))
        expected = calibration[measured]
        print(f"{server.tier}: served accuracy {accuracy:.3f}, measured at publish "
              f"{expected:.3f}")
        assert abs(expected - 0.5) > 0.1, "the fixture must be far from chance to tell"
        assert abs(accuracy - expected) <= 10 / len(rows), (server.tier, accuracy, expected)


def test_tritonclient_works_unchanged(stack: Stack) -> None:
    import tritonclient.http as triton

    client = triton.InferenceServerClient(stack.edge.url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny")
    assert client.get_model_metadata("tiny")["platform"] == "onnxruntime_onnx"
    text = triton.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"a great film", b"awful"], dtype=object),
                             binary_data=False)
    result = client.infer("tiny", [text], request_id="tc-1", outputs=[
        triton.InferRequestedOutput("label", binary_data=False),
        triton.InferRequestedOutput("tier", binary_data=False)])
    assert result.get_response()["id"] == "tc-1"
    assert list(result.as_numpy("label")) != [] and len(result.as_numpy("tier")) == 2
    client.close()


def test_unsure_rows_go_to_the_center_in_one_request(stack: Stack) -> None:
    edge_only = outputs(stack.infer(stack.edge, text_request(TEXTS, threshold=0)))
    assert edge_only["tier"] == ["edge"] * len(TEXTS)
    confidence = np.asarray(edge_only["confidence"])
    threshold = float(np.median(confidence))  # half the rows are unsure
    mixed = stack.infer(stack.edge, text_request(TEXTS, threshold=threshold))
    data = outputs(mixed)
    expected = ["center" if c < threshold else "edge" for c in confidence]
    assert data["tier"] == expected and "center" in expected and "edge" in expected
    center = outputs(stack.infer(stack.center, text_request(TEXTS)))
    for i, tier in enumerate(data["tier"]):
        source = center if tier == "center" else edge_only
        assert np.allclose(data["probabilities"][2 * i:2 * i + 2],
                           source["probabilities"][2 * i:2 * i + 2], atol=1e-5)
    check_labels(data, ["rotten", "fresh"])
    params = mixed.json()["parameters"]
    assert params["escalated"] == expected.count("center") and params["center_version"] == "1"
    everything = stack.infer(stack.edge, text_request(TEXTS[:2], threshold=1),
                             headers={"X-Request-ID": "trace-escalated"})
    assert outputs(everything)["tier"] == ["center", "center"]
    # the trace id travels edge -> center and shows up in the center's JSON log line
    center_lines = [json.loads(line) for line in stack.center.log.read_text().splitlines()
                    if line.startswith("{")]
    assert any(line["request_id"] == "trace-escalated" and "infer" in line["msg"]
               for line in center_lines)


def test_bad_inputs_get_their_4xx(stack: Stack) -> None:
    long_text = "word " * 20_000
    cases: list[tuple[dict[str, Any] | bytes, int, str]] = [
        (b"{not json", 400, "malformed JSON"),
        (b"", 400, "empty request body"),
        (b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["\xff"]}]}',
         400, "malformed JSON"),
        (b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", '
         b'"data": ["\\ud800"]}]}', 400, "malformed JSON"),  # a lone surrogate
        ({**text_request(["a"]), "bogus": 1}, 400, "bogus"),
        ({"inputs": [{"name": "text", "shape": [1], "datatype": "FP32", "data": [1.0]}]}, 400,
         "datatype BYTES"),
        ({"inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": ["a"]}]}, 400,
         "holds 3 elements"),
        (text_request([]), 400, "empty batch"),
        (text_request(["a"] * 257), 400, "limit is 256"),
        (text_request([long_text[:70_000]]), 400, "limit is 65536"),
        (text_request([long_text[:5000]], truncate=False), 400, "truncate=false"),
        ({"inputs": [{"name": "pixels", "shape": [1], "datatype": "FP32", "data": [1]}]}, 400,
         "unknown input"),
        ({"inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64",
                      "data": [1, 99999999]},
                     {"name": "attention_mask", "shape": [1, 2], "datatype": "INT64",
                      "data": [1, 1]}]}, 400, "must lie in"),
        ({**text_request(["a"]), "outputs": [{"name": "logits"}]}, 400, "unknown output"),
        (b"x" * (9 * 1024 * 1024), 413, ""),
    ]
    for body, status, message in cases:
        for server in (stack.edge, stack.center):
            response = stack.infer(server, body)
            assert response.status_code == status, (str(body)[:120], response.text)
            assert message in response.json()["error"], response.text
    bad_threshold = stack.infer(stack.edge, text_request(["a"], threshold=2))  # edge's knob
    assert bad_threshold.status_code == 400 and "threshold" in bad_threshold.json()["error"]
    truncated = stack.infer(stack.edge, text_request([long_text[:5000]]))
    assert truncated.status_code == 200  # truncation to the model's length is the default
    assert stack.infer(stack.edge, text_request(["a"]), "/v2/models/none/infer").status_code \
        == 404
    assert stack.infer(stack.edge, text_request(["a"]),
                       "/v2/models/tiny/versions/9/infer").status_code == 404


def test_metrics_and_cache(stack: Stack) -> None:
    text = [f"cache me {time.time()}"]
    first = stack.infer(stack.edge, text_request(text, threshold=0))
    second = stack.infer(stack.edge, text_request(text, threshold=0))
    assert outputs(first) == outputs(second)
    metrics = httpx.get(stack.edge.url + "/metrics", timeout=10).text
    hits = [line for line in metrics.splitlines()
            if line.startswith('edge_cache_hits_total{model="tiny",version="1"}')]
    assert hits and float(hits[0].split()[-1]) >= 1
    for name in ("edge_request_success_total", "edge_inference_count_total",
                 "edge_execution_count_total", "edge_batch_size_bucket",
                 "edge_queue_duration_seconds_bucket", "edge_compute_duration_seconds_bucket",
                 "edge_rows_total", "edge_confidence_bucket", "edge_request_failure_total",
                 "edge_tokens_useful_total", "edge_tokens_computed_total"):
        assert name in metrics, name
    center_metrics = httpx.get(stack.center.url + "/metrics", timeout=10).text
    assert 'center_inference_count_total{model="tiny",version="1"}' in center_metrics


def test_center_killed_means_degraded_answers_not_errors(stack: Stack, tmp_path: Path) -> None:
    center = start("center", stack.root / "center", tmp_path)
    dead = "http://127.0.0.1:9"  # nothing listens there: the edge fails over to the live one
    edge = start("edge", stack.root / "edge", tmp_path, "--center-url", f"{dead},{center.url}",
                 "--center-timeout-s", "1")
    try:
        for attempt in range(3):
            body = text_request([f"live {attempt} {t}" for t in TEXTS[:3]], threshold=1)
            assert outputs(stack.infer(edge, body))["tier"] == ["center"] * 3
        center.stop()
        for attempt in range(5):  # the breaker opens after 3 failures; answers stay 200
            response = stack.infer(edge, text_request([f"{attempt} {t}" for t in TEXTS[:3]],
                                                      threshold=1))
            assert outputs(response)["tier"] == ["edge-degraded"] * 3
            assert response.json()["parameters"]["degraded"] == 3
        assert 'edge_center_circuit_open{center="' + center.url + '"} 1.0' in httpx.get(
            edge.url + "/metrics", timeout=10).text
    finally:
        edge.stop()
        center.stop()


def test_overloaded_center_answers_503_and_the_edge_degrades(stack: Stack,
                                                             tmp_path: Path) -> None:
    """A center whose queue cannot take a request answers 503 with Retry-After at once; an
    edge in front of it answers those rows itself, marked degraded (200, never the 503), and
    escalates again once the center's Retry-After has passed."""
    center = start("center", stack.root / "center", tmp_path, "--max-queue-rows", "2")
    edge = start("edge", stack.root / "edge", tmp_path, "--center-url", center.url,
                 "--cache-size", "0")
    try:
        texts = [f"overloaded {t}" for t in TEXTS[:3]]  # 3 rows: more than the queue takes
        busy = stack.infer(center, text_request(texts))
        assert busy.status_code == 503, busy.text
        assert busy.headers["retry-after"] == "1" and "queue" in busy.json()["error"]
        own = outputs(stack.infer(edge, text_request(texts, threshold=0)))  # the edge model
        degraded = stack.infer(edge, text_request(texts, threshold=1))  # all 3 escalate
        data = outputs(degraded)  # 200
        assert data["tier"] == ["edge-degraded"] * 3
        assert degraded.json()["parameters"]["degraded"] == 3
        assert degraded.json()["parameters"]["escalated"] == 0
        assert data["label"] == own["label"]  # the edge's own answers
        assert np.allclose(data["probabilities"], own["probabilities"], atol=1e-6)
        assert metric(center, "center_request_failure_total", reason="Overloaded") == 2
        # back-pressure honoured, then escalation resumes: a row the queue can take
        answers: list[dict[str, list[Any]]] = []
        wait_until(lambda: answers.append(outputs(stack.infer(
            edge, text_request([f"recovered {len(answers)}"], threshold=1)))) or
            answers[-1]["tier"] == ["center"], 30, "an escalation answered by the center")
        assert all(a["tier"] in (["center"], ["edge-degraded"]) for a in answers)
    finally:
        edge.stop()
        center.stop()


def test_version_swap_under_load_fails_no_request(stack: Stack) -> None:
    failures: list[str] = []
    versions: set[str] = set()
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=30) as http:
            i = 0
            while not stop.is_set():
                i += 1
                body = json.dumps(text_request([f"swap {i}", TEXTS[i % len(TEXTS)]])).encode()
                try:
                    r = http.post(stack.edge.url + "/v2/models/tiny/infer", content=body)
                    if r.status_code != 200:
                        failures.append(f"{r.status_code} {r.text}")
                    else:
                        versions.add(r.json()["model_version"])
                except httpx.HTTPError as exc:
                    failures.append(repr(exc))

    workers = [threading.Thread(target=client) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        time.sleep(1)
        stack.cli("publish", stack.release, "--name", "tiny")
        for tier in ("center", "edge"):
            stack.cli("pull", "tiny@2", "--tier", tier, "--store", stack.root / tier)
        deadline = time.monotonic() + 60
        while "2" not in versions and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1)
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert versions == {"1", "2"}
    assert failures == []
    meta = httpx.get(stack.edge.url + "/v2/models/tiny", timeout=10).json()
    assert meta["versions"] == ["1", "2"]  # the previous version stays resident


def tcp_queues(port: int) -> dict[tuple[int, int], tuple[int, int]]:
    """(local port, remote port) -> (send queue, receive queue) of the IPv4 TCP sockets on
    127.0.0.1 that involve ``port`` (Linux: /proc/net/tcp)."""
    found = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = (int(a.split(":")[1], 16) for a in fields[1:3])
        if port in (local, remote):
            tx, rx = (int(q, 16) for q in fields[4].split(":"))
            found[(local, remote)] = (tx, rx)
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
def test_sigterm_drains_requests_in_flight(stack: Stack, tmp_path: Path) -> None:
    """SIGTERM once the center has read a request that then waits in its batcher (the first
    batch waits 3 s for company): the request is still answered, after the signal."""
    center = start("center", stack.root / "center", tmp_path, "--max-batch-delay-ms", "3000",
                   "--max-batch-size", "64")
    body = json.dumps(text_request(["still answered"])).encode()
    try:
        client = socket.create_connection(("127.0.0.1", center.port), timeout=30)
        with client:
            client.sendall(b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                           b"Content-Type: application/json\r\nConnection: close\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            mine = client.getsockname()[1]
            # the center's socket has taken every byte: the request is in its hands
            wait_until(lambda: tcp_queues(center.port).get((mine, center.port)) == (0, 0) and
                       tcp_queues(center.port).get((center.port, mine)) == (0, 0), 30,
                       "the center to read the request")
            center.process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            response = http.client.HTTPResponse(client)
            response.begin()
            answered = time.monotonic()
            answer = json.loads(response.read())
        assert response.status == 200, answer
        assert outputs_of(answer)["label"][0] in ("rotten", "fresh")
        assert answered > signalled  # it was in flight: answered during the shutdown
        # uvicorn re-raises the signal after its graceful shutdown, hence -15, not 0
        assert center.process.wait(timeout=30) in (0, -15)
    finally:
        center.stop()
