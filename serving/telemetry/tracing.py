"""W3C trace context and OpenTelemetry spans; the only module that imports OpenTelemetry.

Off unless the standard variables ask for it (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` set, ``OTEL_SDK_DISABLED`` not true,
``OTEL_TRACES_EXPORTER`` not ``none``); then spans go over OTLP/gRPC through a batch processor,
the exporter reading the rest of the ``OTEL_*`` variables itself (headers, TLS, timeouts, the
sampler). Off, nothing is recorded and nothing exported, yet the trace context still flows: a
client's ``traceparent`` (or one made here when it sent none) is passed on to the center
unchanged and its trace id is in every log line, so edge and center logs of one request share
it whether tracing is on or not.
"""

from __future__ import annotations

import logging
import os
import random
import re
import time
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from serving.telemetry.logs import trace_id

__all__ = ["ServerSpan", "SpanKind", "active", "configure", "inject", "record", "server_span",
           "set_attributes", "shutdown", "span", "wanted"]

log = logging.getLogger(__name__)
PROPAGATOR = TraceContextTextMapPropagator()
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# version 00: 2 hex, trace id 32 hex (not all zero), parent id 16 hex (not all zero), flags 2 hex
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_MAX_TRACESTATE = 512  # W3C: 32 members; beyond that a peer may drop it anyway

_provider: TracerProvider | None = None
_tracer: trace.Tracer | None = None


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the standard OpenTelemetry variables ask for OTLP trace export."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or
                env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def configure(service: str, node_id: str) -> bool:
    """Export spans over OTLP/gRPC as ``service`` (unless ``OTEL_SERVICE_NAME`` names another;
    ``service.instance.id`` = ``node_id``) when the environment asks for it; return whether
    tracing is on."""
    global _provider, _tracer
    if not wanted():
        return False
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip().lower()
    if protocol != "grpc":
        log.warning("OTEL_EXPORTER_OTLP_PROTOCOL=%s: only grpc is installed; exporting over "
                    "OTLP/gRPC to the same endpoint", protocol)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    attributes = {"service.instance.id": node_id}
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = service
    resource = Resource.create(attributes)  # plus OTEL_RESOURCE_ATTRIBUTES
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    _provider, _tracer = provider, provider.get_tracer("tiered")
    log.info("tracing on: OTLP/gRPC to %s", os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    return True


def shutdown() -> None:
    """Flush what is batched and stop exporting."""
    global _provider, _tracer
    if _provider is not None:
        _provider.shutdown()
    _provider = _tracer = None


def active() -> bool:
    return _tracer is not None


def _trace_id(traceparent: str) -> str | None:
    m = _TRACEPARENT.fullmatch(traceparent)
    if m is None or m[1] == "0" * 32 or m[2] == "0" * 16:
        return None
    return m[1]


class ServerSpan:
    """The request's span (or, off, its pass-through trace context)."""

    def __init__(self, span: trace.Span | None, carrier: dict[str, str]) -> None:
        self.span = span
        self.carrier = carrier  # off: what inject() passes on

    def set(self, **attributes: Any) -> None:
        if self.span is not None:
            self.span.set_attributes(attributes)

    def fail(self, message: str) -> None:
        if self.span is not None:
            self.span.set_status(Status(StatusCode.ERROR, message))


_server: ContextVar[ServerSpan | None] = ContextVar("tiered_server_span", default=None)


def _fresh_traceparent() -> str:
    """A new trace context, unsampled. Its ids need to be unique, not secret (W3C Trace
    Context): Python's generator (reseeded in a forked worker) instead of a system call per
    request that came without one."""
    return f"00-{random.getrandbits(128) or 1:032x}-{random.getrandbits(64) or 1:016x}-00"


class _Serving:
    """``handle`` is the request's server span and ``tid`` the logs' trace id, for the
    ``with`` (a class, not a generator: it runs once per request)."""

    __slots__ = ("handle", "server", "tid", "token")

    def __init__(self, handle: ServerSpan, tid: str) -> None:
        self.handle, self.tid = handle, tid

    def __enter__(self) -> ServerSpan:
        self.token, self.server = trace_id.set(self.tid), _server.set(self.handle)
        return self.handle

    def __exit__(self, *_: object) -> None:
        _server.reset(self.server)
        trace_id.reset(self.token)


def server_span(name: str, carrier: Mapping[str, str],
                attributes: Mapping[str, Any]) -> AbstractContextManager[ServerSpan]:
    """A SERVER span named ``name``, child of the ``traceparent`` in ``carrier`` (HTTP headers or
    gRPC metadata, lower-case keys); its trace id in the logs for the duration."""
    if _tracer is not None:
        return _traced(_tracer, name, carrier, attributes)
    # off: pass the client's context on as it came (a fresh one, unsampled, if none)
    given = carrier.get(TRACEPARENT, "")
    given = given.strip() if isinstance(given, str) else ""
    tid = _trace_id(given) if given else None
    passed = {TRACEPARENT: given if tid else _fresh_traceparent()}
    state = carrier.get(TRACESTATE, "")
    if tid and isinstance(state, str) and 0 < len(state) <= _MAX_TRACESTATE:
        passed[TRACESTATE] = state
    return _Serving(ServerSpan(None, passed), tid or passed[TRACEPARENT][3:35])


@contextmanager
def _traced(tracer: trace.Tracer, name: str, carrier: Mapping[str, str],
            attributes: Mapping[str, Any]) -> Iterator[ServerSpan]:
    parent = PROPAGATOR.extract({k: v for k, v in carrier.items()
                                 if k in (TRACEPARENT, TRACESTATE) and isinstance(v, str)})
    with tracer.start_as_current_span(name, context=parent, kind=SpanKind.SERVER,
                                      attributes=dict(attributes),
                                      record_exception=False, set_status_on_exception=False
                                      ) as span, \
            _Serving(ServerSpan(span, {}), f"{span.get_span_context().trace_id:032x}") as handle:
        yield handle


def set_attributes(**attributes: Any) -> None:
    """Attributes on the request's server span (``tiered.*``); nothing when off."""
    handle = _server.get()
    if handle is not None:
        handle.set(**attributes)


def span(name: str, kind: SpanKind = SpanKind.INTERNAL,
         **attributes: Any) -> AbstractContextManager[trace.Span | None]:
    """A child span of the current one (None, at no cost, when off)."""
    if _tracer is None:
        return _OFF
    return _tracer.start_as_current_span(name, kind=kind, attributes=attributes)


_OFF: AbstractContextManager[None] = nullcontext()


def inject(headers: MutableMapping[str, str]) -> None:
    """Put the current trace context into outgoing ``headers`` (HTTP headers or gRPC metadata):
    the current span's when on, else the one the request came with."""
    if _tracer is not None:
        PROPAGATOR.inject(headers)
        return
    handle = _server.get()
    if handle is not None:
        headers.update(handle.carrier)


def record(name: str, start: float, end: float, **attributes: Any) -> None:
    """A finished child span from ``start`` to ``end`` (``time.perf_counter()`` readings), for
    work timed elsewhere (the batcher's queue wait and compute)."""
    if _tracer is None:
        return
    offset = time.time_ns() - time.perf_counter_ns()
    child = _tracer.start_span(name, start_time=offset + int(start * 1e9),
                               attributes=attributes)
    child.end(end_time=offset + int(end * 1e9))
