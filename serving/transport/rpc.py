"""The gRPC transport both tiers serve: the Open Inference Protocol's ``GRPCInferenceService``
(``serving/grpc_predict_v2.proto``) over the same data plane as REST, with gRPC health and
reflection, on ``grpc_port``.

Like ``serving/transport/rest.py`` it only decodes and encodes: a ``ModelInferRequest`` becomes a
:class:`GrpcRequest` (typed ``contents`` or ``raw_input_contents``, checked by ``v2.validate``
like every REST body), the answer goes back as ``raw_output_contents`` (what Triton answers and
every V2 gRPC client reads). Errors get the answer REST gives (``serving/transport/responses.py``),
its HTTP status as a code (``CODES``): 400 -> INVALID_ARGUMENT, 404 -> NOT_FOUND, 413 (and,
from gRPC itself, messages over ``max_body_bytes``) -> RESOURCE_EXHAUSTED, 503 -> UNAVAILABLE,
anything else INTERNAL; a ``Retry-After`` (back-pressure) adds ``retry-after`` and a
``google.rpc.RetryInfo`` detail.

The stubs declare the package ``inference``, as tritonclient's and KServe's do: a process can
load only one of them (protobuf refuses a second definition of ``inference.*``), so this module
runs in the tier processes, never inside a client or the test runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from serving.config.settings import ServingSettings
from serving.dataplane import DataPlane
from serving.errors import BadRequest, NotReady
from serving.gen import grpc_predict_v2_pb2 as pb
from serving.gen import grpc_predict_v2_pb2_grpc as pb_grpc
from serving.protocol import v2
from serving.protocol.keepalive import KEEPALIVE
from serving.protocol.wire import Malformed, ParseInterceptor
from serving.telemetry import tracing
from serving.telemetry.logs import IDS, request_id
from serving.transport.responses import ErrorResponse, error_response

log = logging.getLogger("serving.grpc")
SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
REQUEST_ID = "x-request-id"
GRACE_S = 10.0  # in-flight calls finish within this on stop, like uvicorn's graceful shutdown
CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,  # else INTERNAL
         413: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE}
# each datatype's typed contents field (the proto's InferTensorContents)
CONTENTS = {"BYTES": "bytes_contents", "BOOL": "bool_contents", "INT8": "int_contents",
            "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
            "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
            "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents"}
# statuses that are the server's fault (OpenTelemetry's gRPC server span convention): the span
# is marked failed; a client's bad request is not
WATCHES_PER_CONNECTION = 4  # health Watch streams one connection may hold open
SERVER_FAULTS = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED,
                 grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INTERNAL,
                 grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS}


@dataclass(frozen=True, slots=True)
class GrpcRequest:
    """A ``ModelInferRequest`` as a ``dataplane.Request``."""

    message: pb.ModelInferRequest

    @property
    def size(self) -> int:
        return int(self.message.ByteSize())

    def parse(self, decoder: v2.Decoder) -> v2.Parsed:
        m = self.message
        raw = m.raw_input_contents
        if raw and len(raw) != len(m.inputs):
            raise BadRequest(f"raw_input_contents has {len(raw)} entries for {len(m.inputs)} "
                             f"inputs: give one per input, in input order, or none")
        tensors = []
        for i, tensor in enumerate(m.inputs):
            shape = list(tensor.shape)
            if raw:
                if tensor.HasField("contents"):
                    raise BadRequest(f"input {tensor.name!r} has contents as well as "
                                     f"raw_input_contents")
                tensors.append(v2.Tensor(tensor.name, shape, tensor.datatype, raw=raw[i]))
                continue
            field = CONTENTS.get(tensor.datatype)
            values = getattr(tensor.contents, field) if field else ()
            tensors.append(v2.Tensor(tensor.name, shape, tensor.datatype, values=values))
        outputs = [o.name for o in m.outputs] or None
        return v2.validate(m.id or None, parameters(m.parameters), tensors, outputs, decoder)


def parameters(message: Mapping[str, pb.InferParameter]) -> dict[str, Any]:
    """``InferParameter``s as the Python values a JSON request's parameters would hold."""
    out: dict[str, Any] = {}
    for key, parameter in message.items():
        choice = parameter.WhichOneof("parameter_choice")
        out[key] = getattr(parameter, choice) if choice else None
    return out


def _parameter(value: Any) -> pb.InferParameter:
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        return pb.InferParameter(int64_param=value)
    if isinstance(value, float):
        return pb.InferParameter(double_param=value)
    return pb.InferParameter(string_param=str(value))


def infer_response(result: v2.InferResponse) -> pb.ModelInferResponse:
    """The answer with every output in ``raw_output_contents``."""
    response = pb.ModelInferResponse(model_name=result.model_name,
                                     model_version=result.model_version, id=result.id or "")
    for key, value in result.parameters.items():
        response.parameters[key].CopyFrom(_parameter(value))
    for output in result.outputs:
        response.outputs.add(name=output.name, datatype=output.datatype, shape=output.shape)
        response.raw_output_contents.append(v2.raw_bytes(output))
    return response


async def _abort(context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode,
                 answer: ErrorResponse) -> None:
    retry = answer.headers.get("Retry-After")
    if retry is not None:  # back-pressure: say when to come back, both ways clients read it
        detail = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(
            seconds=int(retry)))
        status = status_pb2.Status(code=code.value[0], message=answer.message)
        status.details.add().Pack(detail)
        context.set_trailing_metadata((  # replaces _call's: the request id goes again
            (REQUEST_ID, request_id.get() or ""), ("retry-after", retry),
            ("grpc-status-details-bin", status.SerializeToString())))
    await context.abort(code, answer.message)


class InferenceServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.access_log = plane.service.settings.access_log

    async def ServerLive(self, request: pb.ServerLiveRequest,
                         context: grpc.aio.ServicerContext[Any, Any]) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest,
                          context: grpc.aio.ServicerContext[Any, Any]) -> pb.ServerReadyResponse:
        try:
            self.plane.ready()
        except NotReady:
            return pb.ServerReadyResponse(ready=False)
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: pb.ModelReadyRequest,
                         context: grpc.aio.ServicerContext[Any, Any]) -> pb.ModelReadyResponse:
        async with _call(context, "ModelReady", request, self.access_log):
            self.plane.model_ready(request.name, request.version or None)
            return pb.ModelReadyResponse(ready=True)
        raise AssertionError("unreachable")  # _call aborts

    async def ServerMetadata(
            self, request: pb.ServerMetadataRequest,
            context: grpc.aio.ServicerContext[Any, Any]) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**self.plane.server_metadata())

    async def ModelMetadata(
            self, request: pb.ModelMetadataRequest,
            context: grpc.aio.ServicerContext[Any, Any]) -> pb.ModelMetadataResponse:
        async with _call(context, "ModelMetadata", request, self.access_log):
            m = self.plane.model_metadata(request.name, request.version or None)
            tensor = pb.ModelMetadataResponse.TensorMetadata
            return pb.ModelMetadataResponse(
                name=m["name"], versions=m["versions"], platform=m["platform"],
                inputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"])
                        for t in m["inputs"]],
                outputs=[tensor(name=t["name"], datatype=t["datatype"], shape=t["shape"])
                         for t in m["outputs"]])
        raise AssertionError("unreachable")

    async def ModelInfer(self, request: pb.ModelInferRequest,
                         context: grpc.aio.ServicerContext[Any, Any]) -> pb.ModelInferResponse:
        async with _call(context, "ModelInfer", request, self.access_log):
            result = await self.plane.infer(request.model_name, request.model_version or None,
                                            GrpcRequest(request))
            return infer_response(result)
        raise AssertionError("unreachable")


@contextlib.asynccontextmanager
async def _call(context: grpc.aio.ServicerContext[Any, Any], method: str,
                request: object, access_log: bool = True) -> AsyncIterator[None]:
    """The request id (``x-request-id`` metadata, else a new one) in logs and trailing metadata,
    a message that did not parse as INVALID_ARGUMENT, any other error as its answer's code
    (``CODES``), an access log line (with ``access_log``; else only for server faults)."""
    metadata = dict(context.invocation_metadata() or ())
    given = metadata.get(REQUEST_ID, "")
    rid = (given if isinstance(given, str) else "")[:128] or IDS.next()
    token = request_id.set(rid)
    started, code = time.perf_counter(), grpc.StatusCode.OK
    context.set_trailing_metadata(((REQUEST_ID, rid),))
    with tracing.server_span(f"{SERVICE}/{method}", metadata, {
            "rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": method,
            "tiered.request_id": rid}) as span:
        try:
            if isinstance(request, Malformed):
                raise BadRequest(request.details)
            yield
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            answer = error_response(exc, log)
            code = CODES.get(answer.status, grpc.StatusCode.INTERNAL)
            await _abort(context, code, answer)
        finally:
            span.set(**{"rpc.grpc.status_code": code.value[0]})
            if code in SERVER_FAULTS:
                span.fail(code.name)
            if access_log or code in SERVER_FAULTS:
                log.info("grpc %s %s", method, code.name, extra={"fields": {
                    "status": code.name,
                    "ms": round((time.perf_counter() - started) * 1000, 2)}})
            request_id.reset(token)


class ReadinessHealth(health.aio.HealthServicer):
    """gRPC health whose status follows the data plane's readiness (what Consul's gRPC check
    and load balancers ask): SERVING once a model is loaded, NOT_SERVING before and while
    stopping, for the server ("") and the inference service alike.

    Watch streams are bounded (docs/security.md, "Bounded ports"): at most ``max_watches``
    open together and ``WATCHES_PER_CONNECTION`` on one connection; one more ends at once with
    RESOURCE_EXHAUSTED. Each open one costs a task and its buffers; unbounded, 20 connections
    x 1,000 of them added 83 MB."""

    def __init__(self, plane: DataPlane, max_watches: int = 64) -> None:
        super().__init__()
        self.plane, self.max_watches = plane, max_watches
        self.watching: dict[str, int] = {}  # open Watch streams by peer (its connection)

    async def Watch(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext[Any, Any]) -> None:
        peer = context.peer() or ""
        if sum(self.watching.values()) >= self.max_watches or \
                self.watching.get(peer, 0) >= WATCHES_PER_CONNECTION:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                "too many health Watch streams; use Check, or fewer Watches")
        self.watching[peer] = self.watching.get(peer, 0) + 1
        try:
            await super().Watch(request, context)
        finally:
            self.watching[peer] -= 1
            if not self.watching[peer]:
                del self.watching[peer]

    async def refresh(self) -> None:
        try:
            self.plane.ready()
            status = health_pb2.HealthCheckResponse.SERVING
        except NotReady:
            status = health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", SERVICE):
            await self.set(service, status)

    async def Check(self, request: health_pb2.HealthCheckRequest,
                    context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await self.refresh()
        return await super().Check(request, context)


def options(s: ServingSettings, max_connections: int) -> list[tuple[str, int]]:
    """The server's channel arguments: message sizes, the bounds on what a client may hold
    (streams per connection, connections, their idle time and age, the time to its TLS
    handshake and HTTP/2 preface; docs/security.md), and the keepalive pings it permits (the
    fleet's policy, ``serving.protocol.keepalive``).

    grpc core counts ``grpc.max_allowed_incoming_connections`` at the accept, before the
    handshake; the handshake's own deadline (grpc core's default 120 s) is the header
    timeout, as on the HTTP port. gRPC ignores an argument name it does not know: both are
    checked by tests/integration/test_bounded_ports.py against a silent connection."""
    bounds = [*KEEPALIVE.server(),
              ("grpc.max_receive_message_length", s.max_body_bytes),
              ("grpc.max_send_message_length", 4 * s.max_body_bytes),
              ("grpc.max_concurrent_streams", s.grpc_max_streams),
              ("grpc.max_connection_idle_ms", int(s.grpc_max_connection_idle_s * 1000)),
              ("grpc.max_connection_age_ms", int(s.grpc_max_connection_age_s * 1000)),
              ("grpc.max_connection_age_grace_ms", int(s.grpc_max_connection_age_grace_s * 1000)),
              ("grpc.server_handshake_timeout_ms", int(s.header_timeout_s * 1000))]
    if max_connections:
        bounds.append(("grpc.max_allowed_incoming_connections", max_connections))
    return bounds


class GrpcTransport:
    """The gRPC server: started after the data plane, stopped before it drains."""

    def __init__(self, plane: DataPlane, settings: ServingSettings, max_connections: int = 0,
                 ) -> None:
        self.plane, self.settings, self.max_connections = plane, settings, max_connections
        self.health = ReadinessHealth(plane, settings.grpc_max_health_watches)
        self.server: grpc.aio.Server | None = None
        self._refresh: asyncio.Task[None] | None = None

    async def start(self) -> None:
        s = self.settings
        server = grpc.aio.server(interceptors=[ParseInterceptor(f"/{SERVICE}/")],
                                 options=options(s, self.max_connections),
                                 maximum_concurrent_rpcs=s.grpc_max_calls)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceServicer(self.plane), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            (SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), server)
        address = f"{s.host}:{s.grpc_port}"
        if s.tls_cert is not None and s.tls_key is not None:
            credentials = grpc.ssl_server_credentials(
                [(s.tls_key.read_bytes(), s.tls_cert.read_bytes())])
            server.add_secure_port(address, credentials)
        else:
            server.add_insecure_port(address)
        await server.start()
        self.server = server
        await self.health.refresh()
        self._refresh = asyncio.create_task(self._follow())
        log.info("gRPC V2 (%s) on %s", SERVICE, address)

    async def _follow(self) -> None:
        """Keep health Watch streams current (Check refreshes by itself)."""
        while True:
            await asyncio.sleep(1.0)
            await self.health.refresh()

    async def stop(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)
        if self.server is not None:
            await self.health.enter_graceful_shutdown()
            await self.server.stop(GRACE_S)
