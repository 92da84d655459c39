"""Real ``center`` and ``edge`` processes on loopback, loaded with a tiny release via pull."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
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
    return {o["name"]: o["data"] for o in response.json()["outputs"]}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("stack")
    cli = RegistryCli(root / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    for tier in ("center", "edge"):
        cli("pull", "tiny", "--tier", tier, "--store", root / tier)
    center = start("center", root / "center", root)
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
            probabilities = np.asarray(data["probabilities"]).reshape(2, 2)
            assert np.allclose(probabilities.sum(1), 1, atol=1e-5)
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
                 "edge_rows_total", "edge_confidence_bucket", "edge_request_failure_total"):
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
    center = start("center", stack.root / "center", tmp_path, "--max-queue-rows", "1",
                   "--max-batch-delay-ms", "1500", "--max-batch-size", "8")
    try:
        results: list[httpx.Response] = []
        threads = [threading.Thread(target=lambda i=i: results.append(
            stack.infer(center, text_request([f"row {i}"])))) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        statuses = sorted(r.status_code for r in results)
        assert statuses[0] == 200 and 503 in statuses
        busy = next(r for r in results if r.status_code == 503)
        assert busy.headers["retry-after"] == "1" and "queue" in busy.json()["error"]
    finally:
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


def test_sigterm_drains_requests_in_flight(stack: Stack, tmp_path: Path) -> None:
    center = start("center", stack.root / "center", tmp_path, "--max-batch-delay-ms", "1500",
                   "--max-batch-size", "64")
    results: list[httpx.Response] = []
    try:
        worker = threading.Thread(target=lambda: results.append(
            stack.infer(center, text_request(["still answered"]))))
        worker.start()
        time.sleep(0.5)  # the request now waits in the batcher
        center.process.send_signal(15)
        worker.join(timeout=30)
        # uvicorn re-raises the signal after its graceful shutdown, hence -15, not 0
        assert center.process.wait(timeout=30) in (0, -15)
    finally:
        center.stop()
    assert [r.status_code for r in results] == [200]
