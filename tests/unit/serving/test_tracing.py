"""Trace context with tracing off (no OTEL_* variables): what is passed on, what is logged."""

from __future__ import annotations

import json
import logging

import pytest

from serving.telemetry import tracing
from serving.telemetry.logs import JsonFormatter

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_SDK_DISABLED": "TRUE"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_TRACES_EXPORTER": "none"}, False),
])
def test_tracing_is_on_only_when_the_standard_variables_ask(env: dict[str, str],
                                                            on: bool) -> None:
    assert tracing.wanted(env) is on


def passed_on(carrier: dict[str, str]) -> tuple[dict[str, str], str | None]:
    """What the escalation call would send on, and the trace id the logs show."""
    assert not tracing.active()
    with tracing.server_span("POST /x", carrier, {}):
        headers: dict[str, str] = {}
        tracing.inject(headers)
        record = logging.LogRecord("t", logging.INFO, "f", 1, "msg", None, None)
        logged = json.loads(JsonFormatter("edge").format(record))["trace_id"]
    return headers, logged


def test_a_valid_client_context_is_passed_on_unchanged_and_logged() -> None:
    headers, logged = passed_on({"traceparent": GOOD, "tracestate": "vendor=opaque"})
    assert headers == {"traceparent": GOOD, "tracestate": "vendor=opaque"}
    assert logged == "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize("given", [
    "", "garbage", GOOD.upper(), GOOD + "-extra", "01" + GOOD[2:],
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
])
def test_a_missing_or_malformed_context_starts_a_fresh_unsampled_trace(given: str) -> None:
    headers, logged = passed_on({"traceparent": given, "tracestate": "vendor=opaque"})
    fresh = headers["traceparent"]
    assert fresh != given and fresh.startswith("00-") and fresh.endswith("-00")
    assert logged == fresh[3:35] and len(logged) == 32
    assert "tracestate" not in headers  # a state without its parent means nothing
    again, _ = passed_on({"traceparent": given})
    assert again["traceparent"][3:35] != logged  # each request its own trace


def test_an_oversized_tracestate_is_not_passed_on() -> None:
    headers, _ = passed_on({"traceparent": GOOD, "tracestate": "k=" + "v" * 600})
    assert headers == {"traceparent": GOOD}


def test_outside_a_request_nothing_is_injected_or_logged() -> None:
    headers: dict[str, str] = {}
    tracing.inject(headers)
    tracing.record("batch queue", 0.0, 1.0)  # off: no cost, no error
    tracing.set_attributes(**{"tiered.model": "m"})
    record = logging.LogRecord("t", logging.INFO, "f", 1, "msg", None, None)
    assert headers == {} and json.loads(JsonFormatter("e").format(record))["trace_id"] is None
