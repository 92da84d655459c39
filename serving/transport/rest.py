"""The HTTP transport both tiers serve: V2 REST routes, /metrics, errors, request ids.

Routes only decode and encode; the data plane (``serving/dataplane.py``) does the work. One
handler serves ``POST .../infer`` (:func:`infer_handler`, plain ASGI, taken before Litestar's
routing); every error, from any route, is answered by ``serving/transport/responses.py``. The app
starts and stops what it is handed (``lifecycle``: the whole process, or just the data plane).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, Protocol, cast

from litestar import Litestar, MediaType, Request, Response, get, post
from litestar.datastructures import State
from litestar.params import FromPath
from litestar.types import ASGIApp, Message, Receive, Scope, Send
from prometheus_client import CONTENT_TYPE_LATEST, Counter

from serving.dataplane import DataPlane
from serving.errors import PayloadTooLarge
from serving.protocol import v2
from serving.release.trust import NodeTrust
from serving.telemetry import tracing
from serving.telemetry.logs import IDS, request_id
from serving.transport import openapi
from serving.transport.responses import error_response

log = logging.getLogger("serving.access")
HEADER = "x-request-id"
INFER_PATH = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
INFER_ROUTES = ("/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer")
JSON_HEADERS = [(b"content-type", b"application/json")]
BINARY_HEADERS = [(b"content-type", b"application/octet-stream")]


class Lifecycle(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...


def _plane(request: Request[Any, Any, Any]) -> DataPlane:
    plane: DataPlane = request.app.state.plane
    return plane


# Consul's checks, nginx's probes and Prometheus ask these every few seconds: a line each at
# info level buried the lifecycle (1,525 of the first 8,641 lines of `make up`)
PROBES = frozenset({"/v2/health/live", "/v2/health/ready", "/metrics"})
RID = HEADER.encode()
TRACE_HEADERS = tuple((key, key.encode()) for key in (tracing.TRACEPARENT, tracing.TRACESTATE))


def request_id_middleware(app: ASGIApp, probes: Counter | None = None,
                          access_log: bool = True) -> ASGIApp:
    """Accept or generate X-Request-ID, expose it to logs, return it; the request's server span
    (child of the client's ``traceparent``), its trace id in the logs. With ``access_log``, a
    line per request; without, only requests answered 5xx (or not at all) are logged. A probe
    (``PROBES``) answered below 400 is logged at debug level and counted in ``probes`` (by path
    and status); one that fails is logged like any request."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        given = headers.get(RID)
        rid = given.decode("latin-1")[:128] if given else IDS.next()
        token = request_id.set(rid)
        started, status = time.perf_counter(), 0
        method, route = scope.get("method", ""), scope.get("path_template") or scope["path"]
        carrier = {key: headers[raw].decode("latin-1") for key, raw in TRACE_HEADERS
                   if raw in headers}
        rid_header = (RID, rid.encode("latin-1"))

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), rid_header]
            await send(message)

        traced = tracing.active()
        with tracing.server_span(f"{method} {route}", carrier, {
                "http.request.method": method, "http.route": route, "url.path": scope["path"],
                "url.scheme": scope.get("scheme", "http"), "tiered.request_id": rid}
                if traced else {}) as span:
            try:
                await app(scope, receive, send_with_id)
            finally:
                if traced:
                    span.set(**{"http.response.status_code": status})
                    if status >= 500 or status == 0:
                        span.fail(f"HTTP {status}")
                path = scope["path"]
                probe = path in PROBES
                if probe and probes is not None:
                    probes.labels(path, str(status)).inc()
                if access_log or status >= 500 or status == 0:
                    level = logging.DEBUG if probe and 0 < status < 400 else logging.INFO
                    if log.isEnabledFor(level):
                        client = scope.get("client") or ("", 0)  # --workers spreads them
                        log.log(level, "%s %s %s", method, path, status, extra={"fields": {
                            "status": status,
                            "ms": round((time.perf_counter() - started) * 1000, 2),
                            "client": f"{client[0]}:{client[1]}"}})
                request_id.reset(token)

    return middleware


def on_error(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """Litestar's exception handler, for every route but the infer handler (which answers its
    own errors the same way)."""
    answer = error_response(exc, log)
    return Response(content=answer.body, status_code=answer.status,
                    headers=dict(answer.headers), media_type=MediaType.JSON)


@get("/v2/health/live", sync_to_thread=False, operation_class=openapi.documented(openapi.LIVE))
def live() -> dict[str, bool]:
    return {"live": True}


@get("/v2/health/ready", sync_to_thread=False,
     operation_class=openapi.documented(openapi.READY, (503,)))
def ready(request: Request[Any, Any, Any]) -> dict[str, Any]:
    plane = _plane(request)
    answer: dict[str, Any] = {"ready": True, "models": plane.ready()}
    notes = plane.notes()
    verifier = plane.repository.store.verifier
    trust = verifier.state().as_dict() if isinstance(verifier, NodeTrust) else None
    if trust is not None:  # the node's TUF release metadata (none: nothing is verified)
        answer["trust"] = trust
        if trust["stale"]:  # it keeps serving; nothing new is installed until it is fresh
            notes = [*notes, f"release metadata stale since {trust['stale_since']}: no fresh "
                             f"TUF timestamp from the registry"]
    if notes:  # e.g. a drift alarm: the check stays passing, its output says it
        answer["notes"] = notes
    return answer


@get("/v2", sync_to_thread=False, operation_class=openapi.documented(openapi.SERVER))
def server_metadata(request: Request[Any, Any, Any]) -> dict[str, Any]:
    return _plane(request).server_metadata()


@get(["/v2/models/{model:str}", "/v2/models/{model:str}/versions/{version:str}"],
     sync_to_thread=False, operation_class=openapi.documented(openapi.MODEL, (404, 503)))
def model_metadata(request: Request[Any, Any, Any], model: FromPath[str],
                   version: FromPath[str | None] = None) -> dict[str, Any]:
    return _plane(request).model_metadata(model, version)


@get(["/v2/models/{model:str}/ready", "/v2/models/{model:str}/versions/{version:str}/ready"],
     sync_to_thread=False, operation_class=openapi.documented(openapi.MODEL_READY, (404, 503)))
def model_ready(request: Request[Any, Any, Any], model: FromPath[str],
                version: FromPath[str | None] = None) -> dict[str, Any]:
    return _plane(request).model_ready(model, version)


@post(["/v2/models/{model:str}/infer", "/v2/models/{model:str}/versions/{version:str}/infer"],
      status_code=200, sync_to_thread=False, operation_class=openapi.documented(
          openapi.INFER_RESPONSE, (400, 404, 413, 503), request=openapi.INFER_REQUEST))
def infer(request: Request[Any, Any, Any], model: FromPath[str],
          version: FromPath[str | None] = None) -> ASGIApp:
    """The infer routes as the router and the OpenAPI document know them. :class:`TierApp`
    hands a POST to :func:`infer_handler` before routing; one the router brings here (a path
    spelled otherwise, e.g. with a trailing slash) goes to the same handler."""
    return cast("TierApp", request.app).infer


@get("/metrics", sync_to_thread=False,
     operation_class=openapi.documented(openapi.STRING, media_type=CONTENT_TYPE_LATEST))
def metrics(request: Request[Any, Any, Any]) -> Response[Any]:
    return Response(content=_plane(request).exposition(), media_type=CONTENT_TYPE_LATEST)


def infer_handler(plane: DataPlane, max_body: int) -> ASGIApp:
    """``POST .../infer`` as a plain ASGI handler, the only one that serves it: the body (at
    most ``max_body`` bytes), the data plane call, the response, errors as every route answers
    them; without the framework's routing, request and response objects and exception
    middleware around it."""

    async def handler(scope: Any, receive: Any, send: Any) -> None:  # an HTTP scope
        model, version = INFER_PATH.fullmatch(scope["path"]).groups()  # type: ignore[union-attr]
        headers = JSON_HEADERS
        try:
            body = await _body(scope, receive, max_body)
            if body is None:
                return  # the client went away
            length = _header(scope, v2.HEADER_LENGTH.encode())
            request = v2.HttpRequest(body, length.decode("latin-1") if length else None)
            result = await plane.infer(model, version, request, partial(_gone, receive))
            content, header_length = v2.encode_http(result, request.parsed)
            status = 200
            if header_length is not None:
                headers = [*BINARY_HEADERS, (v2.HEADER_LENGTH.encode(),
                                             str(header_length).encode())]
        except Exception as exc:
            answer = error_response(exc, log)
            status, content = answer.status, answer.body
            headers = [*JSON_HEADERS, *((k.lower().encode(), v.encode())
                                        for k, v in answer.headers.items())]
        await send({"type": "http.response.start", "status": status, "headers": [
            *headers, (b"content-length", str(len(content)).encode())]})
        await send({"type": "http.response.body", "body": content})

    return handler


def _header(scope: Any, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


async def _body(scope: Any, receive: Any, limit: int) -> bytes | None:
    """The request body, refused past ``limit`` bytes (by its Content-Length at once);
    None if the client disconnected."""
    declared = _header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"request body of {int(declared)} bytes; the limit is {limit}")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"request body over the limit of {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def _gone(receive: Any) -> None:
    """Returns when the client has gone away (the body is read: the next message is that)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class TierApp(Litestar):
    """The Litestar app, with ``POST .../infer`` handed to ``infer`` (:func:`infer_handler`)
    before routing, in :func:`request_id_middleware` like every route (ids, trace, access
    log)."""

    def __init__(self, *, infer: ASGIApp, access_log: bool = True, **config: Any) -> None:
        super().__init__(**config)
        self.infer = infer
        self._infer = request_id_middleware(infer, access_log=access_log)  # never a probe

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if (scope["type"] == "http" and scope["method"] == "POST"
                and (found := INFER_PATH.fullmatch(scope["path"]))):
            # the route, as Litestar's router names it: spans and logs stay low-cardinality
            scope["path_template"] = INFER_ROUTES[found[2] is not None]
            await self._infer(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(plane: DataPlane, lifecycle: Lifecycle | None = None) -> Litestar:
    """The HTTP app over ``plane``; its lifespan starts and stops ``lifecycle`` (by default
    the data plane alone: the store is served, nothing joins a fleet)."""
    owned: Lifecycle = lifecycle or plane

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        await owned.start()
        try:
            yield
        finally:
            await owned.stop()

    settings = plane.service.settings
    return TierApp(
        infer=infer_handler(plane, settings.max_body_bytes), access_log=settings.access_log,
        route_handlers=[live, ready, server_metadata, model_metadata, model_ready, infer, metrics],
        middleware=[partial(request_id_middleware, probes=plane.metrics.probes,
                            access_log=settings.access_log)],
        lifespan=[lifespan], debug=False,
        exception_handlers={Exception: on_error}, request_max_body_size=settings.max_body_bytes,
        state=State({"plane": plane}), logging_config=None,
        openapi_config=openapi.config(f"{plane.service.name} (Open Inference Protocol V2)"))
