"""W3C trace context and OpenTelemetry spans from client to edge to center: a real OTLP/gRPC
receiver (opentelemetry-proto's TraceService on a grpc server in this process), real edge and
center processes exporting to it through the standard OTEL_* variables.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from harness.processes import free_port
from harness.stores import fill_stores
from tests.servers import Server, log_lines, start

pytestmark = pytest.mark.integration
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"  # the client's trace and span (W3C's example ids)
CLIENT_SPAN = "00f067aa0ba902b7"


@dataclass
class Exported:
    span: Span
    service: str

    @property
    def id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent(self) -> str:
        return self.span.parent_span_id.hex()

    def attribute(self, key: str) -> Any:
        value: AnyValue = next(a.value for a in self.span.attributes if a.key == key)
        return getattr(value, value.WhichOneof("value"))


@dataclass
class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """What the tiers export, span by span."""
    spans: list[Exported] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest,
               context: grpc.ServicerContext) -> trace_service_pb2.ExportTraceServiceResponse:
        with self.lock:
            for resource in request.resource_spans:
                service = next(a.value.string_value for a in resource.resource.attributes
                               if a.key == "service.name")
                self.spans += [Exported(s, service) for scope in resource.scope_spans
                               for s in scope.spans]
        return trace_service_pb2.ExportTraceServiceResponse()

    def trace(self, trace_id: str) -> list[Exported]:
        with self.lock:
            return [s for s in self.spans if s.span.trace_id.hex() == trace_id]

    def wait(self, trace_id: str, services: set[str], names: set[str],
             timeout: float = 20, kinds: frozenset[tuple[str, int]] = frozenset()
             ) -> list[Exported]:
        """The trace's spans once every service, span name and (service, kind) is in: each
        process exports on its own schedule (an edge's client span can come before its server
        span)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.trace(trace_id)
            if ({s.service for s in spans} >= services and {s.span.name for s in spans} >= names
                    and {(s.service, s.span.kind) for s in spans} >= kinds):
                return spans
            time.sleep(0.1)
        raise AssertionError(f"trace {trace_id}: {[(s.service, s.span.name) for s in spans]}")


@dataclass
class Traced:
    collector: Collector
    center: Server
    edge: Server
    edge_grpc: int
    center_grpc: int
    root: Path
    env: dict[str, str]


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Traced]:
    root = tmp_path_factory.mktemp("tracing")
    fill_stores(root, tiny_release)  # published, pulled into root/center and root/edge
    collector = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
           "OTEL_EXPORTER_OTLP_INSECURE": "true", "OTEL_BSP_SCHEDULE_DELAY": "100"}
    center_grpc, grpc_port = free_port(), free_port()
    center = start("center", root / "center", root, "--grpc-port", str(center_grpc),
                   "--access-log", "true", env=env)
    edge = start("edge", root / "edge", root, "--center-url", center.url, "--cache-size", "0",
                 "--grpc-port", str(grpc_port), "--access-log", "true", env=env)
    yield Traced(collector, center, edge, grpc_port, center_grpc, root, env)
    edge.stop()
    center.stop()
    server.stop(grace=None)


def test_an_escalated_request_is_one_trace_from_the_client_through_edge_and_center(
        traced: Traced) -> None:
    body = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",
                        "data": ["a fine film", "awful"]}], "parameters": {"threshold": 1.0}}
    answer = httpx.post(f"{traced.edge.url}/v2/models/tiny/infer", json=body, timeout=30,
                        headers={"traceparent": f"00-{TRACE}-{CLIENT_SPAN}-01",
                                 "tracestate": "vendor=opaque", "x-request-id": "traced-1"})
    assert answer.status_code == 200, answer.text
    spans = traced.collector.wait(TRACE, {"tiered-edge", "tiered-center"}, {"gate", "POST"},
                                  kinds=frozenset({("tiered-edge", Span.SPAN_KIND_SERVER),
                                                   ("tiered-edge", Span.SPAN_KIND_CLIENT),
                                                   ("tiered-center", Span.SPAN_KIND_SERVER)}))
    by = {(s.service, s.span.kind): s for s in spans}
    edge = by["tiered-edge", Span.SPAN_KIND_SERVER]
    call = by["tiered-edge", Span.SPAN_KIND_CLIENT]
    center = by["tiered-center", Span.SPAN_KIND_SERVER]
    # one trace: client -> edge server span -> escalation call -> center server span
    assert edge.parent == CLIENT_SPAN
    assert call.parent == edge.id and center.parent == call.id
    assert edge.span.name == center.span.name == "POST /v2/models/{model}/infer"
    assert edge.attribute("http.response.status_code") == 200
    assert edge.attribute("tiered.model") == "tiny" and edge.attribute("tiered.version") == 1
    assert edge.attribute("tiered.escalated") == 2 and edge.attribute("tiered.tier") == "center"
    assert edge.attribute("tiered.threshold") == 1.0 and edge.attribute("tiered.degraded") == 0
    assert 0.5 <= edge.attribute("tiered.confidence") <= 1
    assert len(edge.attribute("tiered.release_digest")) == 64
    assert center.attribute("tiered.tier") == "center"
    assert center.attribute("tiered.release_digest") != edge.attribute("tiered.release_digest")
    # the batcher's queue wait and the model's compute, and the gate, under each server span
    for service, server in (("tiered-edge", edge), ("tiered-center", center)):
        children = {s.span.name: s for s in spans if s.service == service and
                    s.parent == server.id}
        assert {"batch queue", "model compute"} <= set(children), (service, list(children))
        compute = children["model compute"]
        assert compute.attribute("tiered.rows") == 2
        assert server.span.start_time_unix_nano <= compute.span.start_time_unix_nano \
            <= compute.span.end_time_unix_nano <= server.span.end_time_unix_nano
    gate = next(s for s in spans if s.span.name == "gate")
    assert gate.parent == edge.id and gate.attribute("tiered.escalated") == 2
    # both tiers' log lines of this request carry its trace id next to its request id
    for server in (traced.edge, traced.center):
        lines = log_lines(server, "traced-1")
        assert lines and all(line["trace_id"] == TRACE for line in lines), lines


def test_grpc_metadata_carries_the_trace_context(traced: Traced) -> None:
    trace = "0af7651916cd43dd8448eb211c80319c"
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{traced.edge_grpc}")
    text = triton_grpc.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"a fine film"], dtype=object))
    client.infer("tiny", [text], headers={"traceparent": f"00-{trace}-b7ad6b7169203331-01"},
                 parameters={"threshold": 1.0})
    client.close()
    spans = traced.collector.wait(trace, {"tiered-edge", "tiered-center"}, {"gate"},
                                  kinds=frozenset({("tiered-edge", Span.SPAN_KIND_SERVER)}))
    server = next(s for s in spans if s.span.kind == Span.SPAN_KIND_SERVER and
                  s.service == "tiered-edge")
    assert server.span.name == "inference.GRPCInferenceService/ModelInfer"
    assert server.parent == "b7ad6b7169203331"
    assert server.attribute("rpc.system") == "grpc"
    assert server.attribute("rpc.grpc.status_code") == 0
    center = next(s for s in spans if s.service == "tiered-center")
    assert center.span.trace_id.hex() == trace


def test_without_a_client_context_each_request_starts_its_own_trace(traced: Traced) -> None:
    body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["fine"]}],
            "parameters": {"threshold": 1.0}}
    answer = httpx.post(f"{traced.edge.url}/v2/models/tiny/infer", json=body, timeout=30,
                        headers={"x-request-id": "untraced-1",
                                 "traceparent": "00-not-a-valid-context-01"})
    assert answer.status_code == 200
    lines = log_lines(traced.edge, "untraced-1")
    trace = lines[0]["trace_id"]
    assert len(trace) == 32 and trace != "0" * 32
    spans = traced.collector.wait(trace, {"tiered-edge", "tiered-center"}, {"gate"},
                                  kinds=frozenset({("tiered-edge", Span.SPAN_KIND_SERVER)}))
    edge = next(s for s in spans if s.span.kind == Span.SPAN_KIND_SERVER and
                s.service == "tiered-edge")
    assert edge.parent == ""  # a root span: the malformed header was ignored, not trusted
    assert os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") is None  # this process exports nothing


def test_an_escalation_over_grpc_carries_the_trace_in_its_metadata(traced: Traced,
                                                                     tmp_path: Path) -> None:
    trace = "1f0e2d3c4b5a69788796a5b4c3d2e1f0"
    edge = start("edge", traced.root / "edge", tmp_path, "--center-url",
                 f"grpc://127.0.0.1:{traced.center_grpc}", "--cache-size", "0",
                 "--access-log", "true", env=traced.env)
    try:
        body = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                            "data": ["a fine film"]}], "parameters": {"threshold": 1.0}}
        answer = httpx.post(f"{edge.url}/v2/models/tiny/infer", json=body, timeout=30,
                            headers={"traceparent": f"00-{trace}-{CLIENT_SPAN}-01"})
        assert answer.status_code == 200 and answer.json()["parameters"]["escalated"] == 1
    finally:
        edge.stop()
    method = "inference.GRPCInferenceService/ModelInfer"
    spans = traced.collector.wait(trace, {"tiered-edge", "tiered-center"}, {method})
    call = next(s for s in spans if s.span.kind == Span.SPAN_KIND_CLIENT)
    center = next(s for s in spans if s.service == "tiered-center" and
                  s.span.kind == Span.SPAN_KIND_SERVER)
    assert call.span.name == center.span.name == method and call.service == "tiered-edge"
    assert center.parent == call.id and call.attribute("rpc.system") == "grpc"
    assert center.attribute("tiered.tier") == "center"
