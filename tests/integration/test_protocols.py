"""Every V2 client unchanged: tritonclient.http with its defaults (binary tensors both ways),
tritonclient.grpc (raw contents), typed gRPC contents as KServe's client sends them, against
real edge and center processes; answers equal the JSON path's.

This process loads tritonclient's gRPC stubs (package ``inference``); the tiers load their own
in their processes (protobuf allows one definition of ``inference.*`` per process).
"""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from harness.processes import free_port
from harness.stores import fill_stores
from tests.servers import Server, log_lines, start

pytestmark = pytest.mark.integration
TEXTS = ["a great film", "awful", "meh", "wonderful acting and a touching story",
         "the plot makes no sense", "fine"]
OUTPUTS = ("label", "probabilities", "confidence", "tier")


@dataclass
class Tier:
    server: Server
    grpc_port: int

    @property
    def http(self) -> str:
        return self.server.url.removeprefix("http://")

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"


@dataclass
class Pair:
    center: Tier
    edge: Tier
    root: Path  # the stores: root/center, root/edge


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("protocols")
    fill_stores(root, tiny_release)  # published, pulled into root/center and root/edge
    ports = free_port(), free_port()
    center = start("center", root / "center", root, "--grpc-port", str(ports[0]),
                   "--access-log", "true")
    edge = start("edge", root / "edge", root, "--center-url", center.url, "--grpc-port",
                 str(ports[1]), "--cache-size", "0", "--access-log", "true")
    yield Pair(Tier(center, ports[0]), Tier(edge, ports[1]), root)
    edge.stop()
    center.stop()


def json_answer(tier: Tier, texts: list[str], **parameters: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": [{"name": "text", "shape": [len(texts)],
                                        "datatype": "BYTES", "data": texts}]}
    if parameters:
        body["parameters"] = parameters
    response = httpx.post(f"{tier.server.url}/v2/models/tiny/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def same_as_json(expected: dict[str, Any], got: dict[str, np.ndarray]) -> None:
    """The binary/gRPC answer holds the JSON answer's values (float32 exactly)."""
    by_name = {o["name"]: o for o in expected["outputs"]}
    for name in OUTPUTS:
        values = got[name]
        if by_name[name]["datatype"] == "BYTES":
            assert [v.decode() for v in values.ravel()] == by_name[name]["data"], name
        else:
            want = np.asarray(by_name[name]["data"], dtype=np.float32)
            assert values.dtype == np.float32 and values.shape == tuple(by_name[name]["shape"])
            assert np.array_equal(values.ravel(), want), name


@pytest.mark.parametrize("tier_name", ["edge", "center"])
def test_tritonclient_http_defaults_binary_both_ways(pair: Pair, tier_name: str) -> None:
    tier: Tier = getattr(pair, tier_name)
    client = triton_http.InferenceServerClient(tier.http)
    text = triton_http.InferInput("text", [len(TEXTS)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))  # binary
    result = client.infer("tiny", [text], request_id="bin-1")  # no outputs: all, as binary
    response = result.get_response()
    assert response["id"] == "bin-1"
    assert all("data" not in o and o["parameters"]["binary_data_size"] > 0
               for o in response["outputs"])
    same_as_json(json_answer(tier, TEXTS), {n: result.as_numpy(n) for n in OUTPUTS})
    # mixed: one output binary, one JSON, in one answer
    mixed = client.infer("tiny", [text], outputs=[
        triton_http.InferRequestedOutput("label", binary_data=True),
        triton_http.InferRequestedOutput("confidence", binary_data=False)])
    kinds = {o["name"]: "data" in o for o in mixed.get_response()["outputs"]}
    assert kinds == {"label": False, "confidence": True}
    assert [v.decode() for v in mixed.as_numpy("label")] == \
        next(o["data"] for o in json_answer(tier, TEXTS)["outputs"] if o["name"] == "label")
    # every row escalated (the edge asks the center in its own encoding): same as JSON
    escalated = client.infer("tiny", [text], parameters={"threshold": 1.0})
    expected = json_answer(tier, TEXTS, threshold=1.0)
    same_as_json(expected, {n: escalated.as_numpy(n) for n in OUTPUTS})
    assert {v.decode() for v in escalated.as_numpy("tier")} == {"center"}
    client.close()


def test_binary_token_tensors_answer_like_json(pair: Pair) -> None:
    ids = np.array([[101, 2307, 2143, 102], [101, 9643, 102, 0]], dtype=np.int64)
    mask = (ids != 0).astype(np.int64)
    client = triton_http.InferenceServerClient(pair.edge.http)
    inputs = [triton_http.InferInput("input_ids", list(ids.shape), "INT64"),
              triton_http.InferInput("attention_mask", list(mask.shape), "INT64")]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(mask, binary_data=False)  # one binary, one JSON
    got = client.infer("tiny", inputs).as_numpy("probabilities")
    body = {"inputs": [{"name": "input_ids", "shape": [2, 4], "datatype": "INT64",
                        "data": ids.ravel().tolist()},
                       {"name": "attention_mask", "shape": [2, 4], "datatype": "INT64",
                        "data": mask.ravel().tolist()}]}
    want = httpx.post(f"{pair.edge.server.url}/v2/models/tiny/infer", json=body).json()
    probabilities = next(o for o in want["outputs"] if o["name"] == "probabilities")
    assert np.array_equal(got.ravel(), np.asarray(probabilities["data"], dtype=np.float32))
    client.close()


@pytest.mark.parametrize("tier_name", ["edge", "center"])
def test_tritonclient_grpc_health_metadata_and_raw_infer(pair: Pair, tier_name: str) -> None:
    tier: Tier = getattr(pair, tier_name)
    client = triton_grpc.InferenceServerClient(tier.grpc)
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("tiny") and client.is_model_ready("tiny", "1")
    metadata = client.get_model_metadata("tiny", as_json=True)
    assert metadata["platform"] == ("onnxruntime_onnx" if tier_name == "edge"
                                    else "pytorch_libtorch")
    assert [o["name"] for o in metadata["outputs"]] == list(OUTPUTS)
    assert client.get_server_metadata(as_json=True)["name"] == f"tiered-{tier_name}"
    text = triton_grpc.InferInput("text", [len(TEXTS)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=object))
    result = client.infer("tiny", [text], request_id="grpc-1")
    response = result.get_response()
    assert response.id == "grpc-1" and len(response.raw_output_contents) == len(OUTPUTS)
    same_as_json(json_answer(tier, TEXTS), {n: result.as_numpy(n) for n in OUTPUTS})
    with pytest.raises(InferenceServerException, match=r"StatusCode\.NOT_FOUND"):
        client.infer("no-such-model", [text])
    client.close()


def test_grpc_rows_escalate_with_tier_and_versions_as_in_rest(pair: Pair) -> None:
    client = triton_grpc.InferenceServerClient(pair.edge.grpc)
    text = triton_grpc.InferInput("text", [2], "BYTES")
    text.set_data_from_numpy(np.array([b"a great film", b"awful"], dtype=object))
    result = client.infer("tiny", [text], parameters={"threshold": 1.0})
    assert [t.decode() for t in result.as_numpy("tier")] == ["center", "center"]
    parameters = result.get_response(as_json=True)["parameters"]
    assert parameters["escalated"]["int64_param"] == "2"
    assert parameters["center_version"]["string_param"] == "1"
    rest = json_answer(pair.edge, ["a great film", "awful"], threshold=1.0)
    assert rest["parameters"]["escalated"] == 2
    same_as_json(rest, {n: result.as_numpy(n) for n in OUTPUTS})
    client.close()


def test_typed_contents_as_kserve_sends_them(pair: Pair) -> None:
    """KServe's client puts BYTES in ``contents.bytes_contents`` rather than raw."""
    with grpc.insecure_channel(pair.center.grpc) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelInferRequest(model_name="tiny", id="typed")
        tensor = request.inputs.add(name="text", datatype="BYTES", shape=[2])
        tensor.contents.bytes_contents.extend([b"a great film", b"awful"])
        request.outputs.add(name="label")
        response = stub.ModelInfer(request, timeout=30)
    assert [o.name for o in response.outputs] == ["label"]
    raw = response.raw_output_contents[0]
    labels, offset = [], 0
    while offset < len(raw):
        (size,) = struct.unpack_from("<I", raw, offset)
        labels.append(raw[offset + 4:offset + 4 + size].decode())
        offset += 4 + size
    rest = json_answer(pair.center, ["a great film", "awful"])
    assert labels == next(o["data"] for o in rest["outputs"] if o["name"] == "label")


def infer_status(target: str, request: pb.ModelInferRequest | bytes) -> grpc.StatusCode:
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                   request_serializer=None, response_deserializer=None)
        body = request if isinstance(request, bytes) else request.SerializeToString()
        try:
            call(body, timeout=30)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


def _text(raw: bytes, shape: list[int] | None = None) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="tiny")
    request.inputs.add(name="text", datatype="BYTES", shape=shape or [1])
    request.raw_input_contents.append(raw)
    return request


def test_malformed_grpc_requests_are_invalid_argument(pair: Pair) -> None:
    ok = _text(struct.pack("<I", 4) + b"good")
    assert infer_status(pair.edge.grpc, ok) == grpc.StatusCode.OK
    two_raw = _text(b"")
    two_raw.raw_input_contents.append(b"")
    too_many_rows = pb.ModelInferRequest(model_name="tiny")
    too_many_rows.inputs.add(name="text", datatype="BYTES", shape=[10_000]).contents \
        .bytes_contents.extend([b"x"] * 10_000)
    cases = {
        "length prefix past the end": _text(struct.pack("<I", 99) + b"short"),
        "truncated prefix": _text(b"\x01\x00"),
        "bytes left over": _text(struct.pack("<I", 1) + b"ab"),
        "fewer elements than the shape": _text(struct.pack("<I", 1) + b"a", [3]),
        "invalid UTF-8": _text(struct.pack("<I", 2) + b"\xff\xfe"),
        "raw for an input that is not there": two_raw,
        "INT64 of the wrong length": _ids(b"\x00" * 12),
        "too many rows": too_many_rows,
        "not a protobuf message": b"\xff\xff\xff\xff\x0f garbage",
    }
    for what, request in cases.items():
        assert infer_status(pair.edge.grpc, request) == grpc.StatusCode.INVALID_ARGUMENT, what
    huge = _text(struct.pack("<I", 3_000_000) + b"x" * 3_000_000)
    assert infer_status(pair.edge.grpc, huge) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert infer_status(pair.edge.grpc, ok) == grpc.StatusCode.OK  # still serving


def _ids(raw: bytes) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="tiny")
    for name in ("input_ids", "attention_mask"):
        request.inputs.add(name=name, datatype="INT64", shape=[1, 2])
        request.raw_input_contents.append(raw)
    return request


CLEAN = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
         grpc.StatusCode.RESOURCE_EXHAUSTED}
FUZZ_CASES = 300


def _mutants(rng: random.Random) -> Iterator[tuple[str, bytes, list[tuple[str, str]]]]:
    """Valid ModelInfer messages with bytes flipped, cut or spliced, random field values, and
    random bytes; with hostile metadata now and then."""
    seeds = [_text(struct.pack("<I", 4) + b"good", [1]), _ids(b"\x01" + b"\x00" * 15)]
    typed = pb.ModelInferRequest(model_name="tiny", id="typed")
    typed.inputs.add(name="text", datatype="BYTES", shape=[2]).contents.bytes_contents.extend(
        [b"a", b"b"])
    typed.outputs.add(name="label").parameters["binary_data"].bool_param = True
    seeds.append(typed)
    metadata = [[], [("traceparent", "00-" + "f" * 32 + "-" + "0" * 16 + "-01")],
                [("traceparent", "x" * 4000)], [("x-request-id", "r" * 5000)],
                [("tracestate", "k=v," * 400)], [("x-tiered-region", "../../etc/passwd")]]
    for i in range(FUZZ_CASES):
        base = bytearray(rng.choice(seeds).SerializeToString())
        kind = i % 5
        if kind == 0:  # flip bytes
            for _ in range(rng.randint(1, 4)):
                base[rng.randrange(len(base))] = rng.randrange(256)
        elif kind == 1:  # cut
            base = base[:rng.randrange(len(base))]
        elif kind == 2:  # splice random bytes in
            at = rng.randrange(len(base))
            base[at:at] = rng.randbytes(rng.randint(1, 32))
        elif kind == 3:  # random shapes, datatypes and raw contents on a well-formed message
            request = pb.ModelInferRequest(model_name=rng.choice(["tiny", "", "x" * 300]))
            for _ in range(rng.randint(0, 3)):
                request.inputs.add(
                    name=rng.choice(["text", "input_ids", "attention_mask", "", "other"]),
                    datatype=rng.choice(["BYTES", "INT64", "FP32", "", "INT8"]),
                    shape=[rng.choice([-1, 0, 1, 2, 3, 1 << 40, (1 << 63) - 1])
                           for _ in range(rng.randint(0, 3))])
            for _ in range(rng.randint(0, 3)):
                request.raw_input_contents.append(rng.randbytes(rng.randint(0, 64)))
            request.parameters["threshold"].double_param = rng.choice(
                [0.5, -1.0, float("nan"), float("inf"), 2.0])
            base = bytearray(request.SerializeToString())
        else:  # random bytes
            base = bytearray(rng.randbytes(rng.randint(0, 200)))
        yield f"case {i} (kind {kind})", bytes(base), rng.choice(metadata)


def test_fuzzed_grpc_messages_get_a_clean_status_and_the_tier_keeps_serving(pair: Pair) -> None:
    """Mutated and random ModelInfer messages end with OK or a client error status, never
    INTERNAL or UNKNOWN, and leave no traceback in the log."""
    rng = random.Random(15)
    statuses: dict[grpc.StatusCode, int] = {}
    with grpc.insecure_channel(pair.edge.grpc) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                   request_serializer=None, response_deserializer=None)
        for what, body, metadata in _mutants(rng):
            try:
                call(body, metadata=metadata, timeout=30)
                code = grpc.StatusCode.OK
            except grpc.RpcError as exc:
                code = exc.code()
            assert code in CLEAN, (what, code, body[:80])
            statuses[code] = statuses.get(code, 0) + 1
    assert statuses.get(grpc.StatusCode.INVALID_ARGUMENT, 0) > FUZZ_CASES // 4, statuses
    assert statuses.get(grpc.StatusCode.OK, 0) > 0, statuses  # some mutants still reach the model
    assert infer_status(pair.edge.grpc, _text(struct.pack("<I", 4) + b"good")) == \
        grpc.StatusCode.OK
    assert "Traceback" not in pair.edge.server.log.read_text()


def binary_post(tier: Tier, header: dict[str, Any], tail: bytes,
                length: str | None = None) -> httpx.Response:
    head = json.dumps(header).encode()
    return httpx.post(f"{tier.server.url}/v2/models/tiny/infer", content=head + tail,
                      headers={"Inference-Header-Content-Length": length or str(len(head))},
                      timeout=30)


def test_malformed_binary_framing_is_400_with_the_v2_error_body(pair: Pair) -> None:
    def text(size: int, shape: int = 1) -> dict[str, Any]:
        return {"inputs": [{"name": "text", "shape": [shape], "datatype": "BYTES",
                            "parameters": {"binary_data_size": size}}]}

    good = struct.pack("<I", 4) + b"good"
    assert binary_post(pair.edge, text(8), good).status_code == 200
    cases = {
        "header length over the body": (text(8), good, "99999"),
        "header length not a number": (text(8), good, "12abc"),
        "header length zero": (text(8), good, "0"),
        "declared size past the end": (text(64), good, None),
        "bytes after the last input": (text(8), good + b"xx", None),
        "negative size": (text(-1), good, None),
        "size not an integer": ({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                                             "parameters": {"binary_data_size": "8"}}]},
                                good, None),
        "element longer than its data": (text(8), struct.pack("<I", 5) + b"good", None),
        "fewer elements than the shape": (text(8, 2), good, None),
        "neither data nor binary": ({"inputs": [{"name": "text", "shape": [1],
                                                 "datatype": "BYTES"}]}, b"", None),
        "binary_data_output not a boolean": ({**text(8), "parameters": {
            "binary_data_output": "yes"}}, good, None),
    }
    for what, (header, tail, length) in cases.items():
        response = binary_post(pair.edge, header, tail, length)
        assert response.status_code == 400, (what, response.text)
        assert set(response.json()) == {"error"}, what
    head = json.dumps(text(8)).encode()
    over = httpx.post(f"{pair.edge.server.url}/v2/models/tiny/infer",
                      content=head + b"x" * (2 * 1024 * 1024),
                      headers={"Inference-Header-Content-Length": str(len(head))}, timeout=30)
    assert over.status_code == 413 and "error" in over.json()


def test_grpc_field_numbers_match_tritonclients() -> None:
    """The tiers' own stubs (loaded in a child: one ``inference`` package per process) number
    every field as tritonclient's do."""
    names = ["ModelInferRequest", "ModelInferResponse", "InferParameter", "InferTensorContents",
             "ModelMetadataResponse", "ServerMetadataResponse", "ModelReadyRequest",
             "ModelMetadataRequest", "ServerLiveResponse", "ServerReadyResponse"]
    script = ("import json, sys\nfrom serving.gen import grpc_predict_v2_pb2 as p\n"
              "def fields(d):\n"
              "    out = {f.name: f.number for f in d.fields}\n"
              "    for n in d.nested_types: out |= {n.name + '.' + k: v for k, v in "
              "fields(n).items()}\n"
              "    return out\n"
              f"print(json.dumps({{n: fields(p.DESCRIPTOR.message_types_by_name[n]) "
              f"for n in {names!r}}}))")
    ours = json.loads(subprocess.run([sys.executable, "-c", script], check=True,
                                     capture_output=True, text=True).stdout)

    def fields(d: Any) -> dict[str, int]:
        out = {f.name: f.number for f in d.fields}
        for n in d.nested_types:
            out |= {n.name + "." + k: v for k, v in fields(n).items()}
        return out

    for name in names:
        theirs = fields(pb.DESCRIPTOR.message_types_by_name[name])
        assert {k: v for k, v in theirs.items() if k in ours[name]} == ours[name], name
        assert set(ours[name]) <= set(theirs), name


def test_tracing_off_the_clients_trace_context_still_reaches_the_center_and_the_logs(
        pair: Pair) -> None:
    """No OTEL_* variables here: nothing is exported, yet the client's ``traceparent`` is
    passed on unchanged, so the edge's and the center's log lines share its trace id."""
    trace = "5c9a4e0c7dd64a8cb1b2a7a2f1a4e3d1"
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["fine"]}],
            "parameters": {"threshold": 1.0}}
    answer = httpx.post(f"{pair.edge.server.url}/v2/models/tiny/infer", json=body, timeout=30,
                        headers={"traceparent": f"00-{trace}-1111111111111111-01",
                                 "x-request-id": "passed-1"})
    assert answer.status_code == 200
    assert next(o["data"] for o in answer.json()["outputs"] if o["name"] == "tier") == ["center"]
    for server in (pair.edge.server, pair.center.server):
        mine = log_lines(server, "passed-1")
        assert mine and {line["trace_id"] for line in mine} == {trace}, (server.name, mine)


def test_the_protocol_benchmark_measures_all_three_encodings(pair: Pair) -> None:
    """``python -m bench.protocols`` in miniature (its runs, ``harness.protocols``): every
    encoding answers every request of each run."""
    import asyncio

    from harness.markdown import table_markdown
    from harness.protocols import CONCURRENCY, PROTOCOLS, ROWS, measure, summary, table

    results = asyncio.run(measure(pair.edge.server.url, pair.edge.grpc, pair.edge.server.pid,
                                  TEXTS * 6, seconds=0.3, warmup=0.05, model="tiny"))
    assert {(r.protocol, r.rows, r.concurrency) for r in results} == {
        (p, rows, c) for p in PROTOCOLS for rows in ROWS for c in CONCURRENCY}
    assert all(r.load.requests > 0 and r.load.errors == 0 and r.load.p99_ms >= r.load.p50_ms > 0
               for r in results)
    markdown = table_markdown(table(results, 0.3))
    assert markdown.count("| gRPC |") == len(ROWS) * len(CONCURRENCY)
    line = summary(results, "JSON/HTTP", "Client protocols:")
    assert "binary/HTTP " in line and "gRPC " in line and "JSON/HTTP " not in line.split(":")[1]


def test_an_edge_escalating_over_grpc_answers_as_one_escalating_over_rest(
        pair: Pair, tmp_path: Path) -> None:
    """``--center-url grpc://…``: unsure rows go to the center's gRPC port (texts and token
    rows alike) and come back as the REST escalation's do; a center that does not answer is
    failed over and its circuit opens."""
    dead = free_port()
    urls = f"grpc://127.0.0.1:{dead},grpc://127.0.0.1:{pair.center.grpc_port}"
    edge = start("edge", pair.root / "edge", tmp_path, "--center-url", urls,
                 "--cache-size", "0", "--center-timeout-s", "1")
    try:
        texts = {"inputs": [{"name": "text", "shape": [3], "datatype": "BYTES",
                             "data": TEXTS[:3]}], "parameters": {"threshold": 1.0}}
        ids = {"inputs": [{"name": "input_ids", "shape": [2, 4], "datatype": "INT64",
                           "data": [101, 2307, 2143, 102, 101, 9643, 102, 0]},
                          {"name": "attention_mask", "shape": [2, 4], "datatype": "INT64",
                           "data": [1, 1, 1, 1, 1, 1, 1, 0]}], "parameters": {"threshold": 1.0}}
        for body in (texts, ids) * 4:  # the dead center comes first in every other call
            over_grpc = httpx.post(f"{edge.url}/v2/models/tiny/infer", json=body, timeout=30)
            over_rest = httpx.post(f"{pair.edge.server.url}/v2/models/tiny/infer", json=body,
                                   timeout=30)
            assert over_grpc.status_code == over_rest.status_code == 200, over_grpc.text
            got, want = over_grpc.json(), over_rest.json()
            assert got["outputs"] == want["outputs"]  # tier "center", same probabilities
            assert got["parameters"]["center_version"] == want["parameters"]["center_version"]
            assert got["parameters"]["escalated"] == len(got["outputs"][0]["data"])
        metrics = httpx.get(f"{edge.url}/metrics", timeout=10).text
        assert f'edge_center_circuit_open{{center="grpc://127.0.0.1:{dead}"}} 1.0' in metrics
        assert 'edge_rows_total{model="tiny",tier="edge-degraded"' not in metrics
        # bench.protocols' escalation table in miniature: both edges, every row escalated
        import asyncio

        from harness.protocols import CONCURRENCY, ROWS, measure_escalation
        runs = asyncio.run(measure_escalation(
            {"REST": (pair.edge.server.url, pair.edge.server.pid), "gRPC": (edge.url, edge.pid)},
            TEXTS * 6, seconds=0.2, warmup=0.05, model="tiny"))
        assert len(runs) == 2 * len(ROWS) * len(CONCURRENCY)
        assert all(r.load.requests > 0 and r.load.errors == 0 for r in runs)
    finally:
        edge.stop()


def test_back_pressure_over_grpc_is_unavailable_with_retry_info(pair: Pair,
                                                               tmp_path: Path) -> None:
    """A center whose queue cannot take the rows answers UNAVAILABLE at once, saying when to
    come back twice over (a ``retry-after`` trailer and a google.rpc RetryInfo detail); an
    edge escalating to it over gRPC answers those rows itself, marked degraded."""
    from google.rpc import error_details_pb2, status_pb2

    grpc_port = free_port()
    center = start("center", pair.root / "center", tmp_path, "--max-queue-rows", "2",
                   "--grpc-port", str(grpc_port))
    edge = start("edge", pair.root / "edge", tmp_path, "--cache-size", "0", "--center-url",
                 f"grpc://127.0.0.1:{grpc_port}")
    try:
        request = _text(b"".join(struct.pack("<I", 1) + b"x" for _ in range(3)), [3])
        request.id = "busy-1"
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as raised:
                stub.ModelInfer(request, timeout=30, metadata=(("x-request-id", "busy-1"),))
        error = raised.value
        assert error.code() == grpc.StatusCode.UNAVAILABLE and "queue" in error.details()
        trailers = dict(error.trailing_metadata())
        assert trailers["retry-after"] == "1" and trailers["x-request-id"] == "busy-1"
        status = status_pb2.Status.FromString(trailers["grpc-status-details-bin"])
        info = error_details_pb2.RetryInfo()
        assert status.details[0].Unpack(info) and info.retry_delay.seconds == 1
        body = {"inputs": [{"name": "text", "shape": [3], "datatype": "BYTES",
                            "data": TEXTS[:3]}], "parameters": {"threshold": 1.0}}
        answer = httpx.post(f"{edge.url}/v2/models/tiny/infer", json=body, timeout=30)
        assert answer.status_code == 200
        assert next(o["data"] for o in answer.json()["outputs"] if o["name"] == "tier") == \
            ["edge-degraded"] * 3
        assert f'edge_center_circuit_open{{center="grpc://127.0.0.1:{grpc_port}"}} 1.0' in \
            httpx.get(f"{edge.url}/metrics", timeout=10).text  # backs off at once
    finally:
        edge.stop()
        center.stop()


def test_grpc_reflection_lists_the_services_and_describes_the_protocol(pair: Pair) -> None:
    """What ``grpcurl -plaintext HOST:PORT list`` / ``describe`` ask."""
    from google.protobuf import descriptor_pb2
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(pair.edge.grpc) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        requests = [reflection_pb2.ServerReflectionRequest(list_services=""),
                    reflection_pb2.ServerReflectionRequest(
                        file_containing_symbol="inference.GRPCInferenceService")]
        listed, described = list(stub.ServerReflectionInfo(iter(requests), timeout=10))
    services = {s.name for s in listed.list_services_response.service}
    assert {"inference.GRPCInferenceService", "grpc.health.v1.Health"} <= services
    files = [descriptor_pb2.FileDescriptorProto.FromString(raw) for raw in
             described.file_descriptor_response.file_descriptor_proto]
    methods = {m.name for f in files for s in f.service for m in s.method}
    assert {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata",
            "ModelInfer"} <= methods
