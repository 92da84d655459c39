"""The Litestar app both tiers serve: V2 REST routes, /metrics, errors, request ids.

Routes only convert data; the tier's ``Service`` does the work.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol

from litestar import Litestar, MediaType, Request, Response, get, post
from litestar.datastructures import State
from litestar.exceptions import HTTPException
from litestar.params import FromPath
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from serving import classify, openapi, v2
from serving.discovery import OnChange
from serving.errors import ServingError
from serving.logs import request_id
from serving.metrics import Metrics
from serving.node import Node
from serving.repository import Repository, Resident
from serving.settings import ServingSettings

log = logging.getLogger("serving.access")
HEADER = "x-request-id"
# Bodies above this are parsed in a worker thread, off the event loop, so /v2/health/live and
# the other requests keep being answered meanwhile; below it the hop costs more than the parse.
PARSE_INLINE_BYTES = 64 * 1024


class Service(Protocol):
    @property
    def name(self) -> str: ...  # server name in GET /v2

    @property
    def platform(self) -> str: ...  # model metadata platform (Triton's names)

    @property
    def repository(self) -> Repository: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def settings(self) -> ServingSettings: ...

    async def infer(self, resident: Resident, parsed: v2.Parsed) -> v2.InferResponse: ...

    def watches(self) -> dict[str, OnChange]: ...  # Consul services to follow, and how

    async def stop(self) -> None: ...


def _service(request: Request[Any, Any, Any]) -> Service:
    service: Service = request.app.state.service
    return service


def request_id_middleware(app: ASGIApp) -> ASGIApp:
    """Accept or generate X-Request-ID, expose it to logs, return it, log the request."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        rid = headers.get(HEADER.encode(), b"").decode("latin-1")[:128] or uuid.uuid4().hex
        token = request_id.set(rid)
        started, status = time.perf_counter(), 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []),
                                      (HEADER.encode(), rid.encode("latin-1"))]
            await send(message)

        try:
            await app(scope, receive, send_with_id)
        finally:
            log.info("%s %s %s", scope.get("method"), scope["path"], status, extra={"fields": {
                "status": status, "ms": round((time.perf_counter() - started) * 1000, 2)}})
            request_id.reset(token)

    return middleware


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response[Any]:
    return Response({"error": message}, status_code=status, headers=headers or {},
                    media_type=MediaType.JSON)


def on_serving_error(_: Request[Any, Any, Any], exc: ServingError) -> Response[Any]:
    return _error(exc.status, str(exc), exc.headers)


def on_http_error(_: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    return _error(exc.status_code, str(exc.detail), exc.headers)


def on_unexpected(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    log.error("unhandled error", exc_info=exc)
    return _error(500, "internal error; see the server log for the request id")


@get("/v2/health/live", sync_to_thread=False, operation_class=openapi.documented(openapi.LIVE))
def live() -> dict[str, bool]:
    return {"live": True}


@get("/v2/health/ready", sync_to_thread=False,
     operation_class=openapi.documented(openapi.READY, (503,)))
def ready(request: Request[Any, Any, Any]) -> Response[Any]:
    models = _service(request).repository.models()
    if not models:
        return _error(503, "not ready: no model loaded yet")
    return Response({"ready": True, "models": models})


@get("/v2", sync_to_thread=False, operation_class=openapi.documented(openapi.SERVER))
def server_metadata(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return {"name": _service(request).name, "version": "0.1.0", "extensions": []}


def _metadata(service: Service, resident: Resident, model: str) -> dict[str, Any]:
    m = resident.manifest
    inputs = [{"name": v2.TEXT, "datatype": "BYTES", "shape": [-1]}] if resident.tokenizer else []
    inputs += [{"name": t.name, "datatype": t.datatype, "shape": t.shape} for t in m.inputs]
    return {"name": model, "versions": [str(v) for v in service.repository.versions(model)],
            "platform": service.platform, "inputs": inputs,
            "outputs": classify.outputs_metadata(resident),
            "parameters": {"labels": ",".join(m.labels),
                           "threshold": m.calibration.threshold}}


@get(["/v2/models/{model:str}", "/v2/models/{model:str}/versions/{version:str}"],
     sync_to_thread=False, operation_class=openapi.documented(openapi.MODEL, (404, 503)))
def model_metadata(request: Request[Any, Any, Any], model: FromPath[str],
                   version: FromPath[str | None] = None) -> dict[str, Any]:
    service = _service(request)
    return _metadata(service, service.repository.get(model, version), model)


@get(["/v2/models/{model:str}/ready", "/v2/models/{model:str}/versions/{version:str}/ready"],
     sync_to_thread=False, operation_class=openapi.documented(openapi.MODEL_READY, (404, 503)))
def model_ready(request: Request[Any, Any, Any], model: FromPath[str],
                version: FromPath[str | None] = None) -> dict[str, Any]:
    resident = _service(request).repository.get(model, version)
    return {"name": model, "version": str(resident.version), "ready": True}


@post(["/v2/models/{model:str}/infer", "/v2/models/{model:str}/versions/{version:str}/infer"],
      status_code=200, operation_class=openapi.documented(
          openapi.INFER_RESPONSE, (400, 404, 413, 503), request=openapi.INFER_REQUEST))
async def infer(request: Request[Any, Any, Any], model: FromPath[str],
                version: FromPath[str | None] = None) -> Response[Any]:
    service = _service(request)
    resident = service.repository.get(model, version)
    labels = {"model": model, "version": str(resident.version)}
    started = time.perf_counter()
    try:
        body, limits = await request.body(), classify.limits(resident, service.settings)
        parsed = (v2.parse(body, limits) if len(body) <= PARSE_INLINE_BYTES
                  else await asyncio.to_thread(v2.parse, body, limits))
        result = await service.infer(resident, parsed)
    except ServingError as exc:
        service.metrics.request_failure.labels(**labels, reason=type(exc).__name__).inc()
        raise
    seconds = time.perf_counter() - started
    service.metrics.request_success.labels(**labels).inc()
    service.metrics.request_duration.labels(**labels).observe(seconds)
    service.metrics.quality.request(model, resident.version, seconds)
    return Response(content=v2.encode_response(result), media_type=MediaType.JSON)


@get("/metrics", sync_to_thread=False,
     operation_class=openapi.documented(openapi.STRING, media_type=CONTENT_TYPE_LATEST))
def metrics(request: Request[Any, Any, Any]) -> Response[Any]:
    body = generate_latest(_service(request).metrics.registry)
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)


def create_app(service: Service) -> Litestar:
    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        node = Node(service)  # store watcher, sync, Consul: created inside the running loop
        await node.start()
        try:
            yield
        finally:
            await node.stop()
            await service.stop()
            await service.repository.stop()

    return Litestar(
        route_handlers=[live, ready, server_metadata, model_metadata, model_ready, infer, metrics],
        middleware=[request_id_middleware], lifespan=[lifespan], debug=False,
        exception_handlers={ServingError: on_serving_error, HTTPException: on_http_error,
                            Exception: on_unexpected},
        request_max_body_size=service.settings.max_body_bytes,
        state=State({"service": service}), logging_config=None,
        openapi_config=openapi.config(f"{service.name} (Open Inference Protocol V2)"))
