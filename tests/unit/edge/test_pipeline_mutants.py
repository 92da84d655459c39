"""The edge's escalation as the center and an operator see it (``edge.pipeline``): which model
and request the center is asked about, the bytes and circuit series, the log line of a
degraded answer, the TLS name a discovered center must show. The tests that kill `make
mutate`'s mutants the older tests let through."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from serving.fleet.discovery import SERVICES, Instance
from serving.protocol.budget import Budget
from serving.telemetry.logs import request_id
from tests.unit.edge.test_pipeline import (
    SURE,
    UNSURE,
    FixedBatcher,
    GradedBatcher,
    TaggedBatcher,
    center_answering,
    center_by_tag,
    center_naming,
    edge,
    edge_confidence,
    infer,
    outputs,
    parsed,
    resident,
    tagged,
)


def test_the_center_is_asked_about_the_model_for_the_clients_request(tmp_path: Path) -> None:
    seen: list[tuple[str, str | None]] = []
    answering = center_answering([])

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.path, request.headers.get("x-request-id")))
        return answering(request)

    service = edge(tmp_path, handle)

    async def scenario() -> list[str]:
        request_id.set("req-42")
        answer = await service.infer(resident(FixedBatcher()), parsed(UNSURE, SURE, UNSURE))
        return outputs(answer)["tier"]

    assert asyncio.run(scenario()) == ["center", "edge", "center"]
    assert seen == [("/v2/models/sentiment/infer", "req-42")]
    sent = service.metrics.registry.get_sample_value("edge_escalated_input_bytes_total",
                                                     {"model": "sentiment"})
    assert sent == 2 * (2 * 2 * 8)  # input_ids and attention_mask: two rows of two INT64


def test_a_degraded_answer_is_logged_with_its_rows_and_why_and_the_circuit_opens(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused by the test", request=request)

    service = edge(tmp_path, down)
    circuit = {"center": "http://center.test"}
    with caplog.at_level(logging.WARNING, logger="edge.pipeline"):
        for _ in range(3):  # the breaker opens after 3 failures
            out = outputs(infer(service, resident(FixedBatcher()), parsed(UNSURE, UNSURE)))
            assert out["tier"] == ["edge-degraded", "edge-degraded"]
            gauge = service.metrics.registry.get_sample_value("edge_center_circuit_open",
                                                              circuit)
            assert gauge == (1.0 if _ == 2 else 0.0)
    (first, *_) = [r.getMessage() for r in caplog.records if r.name == "edge.pipeline"]
    assert first == "center unavailable, answering 2 rows degraded: http://center.test: " \
                    "ConnectError"


def test_a_discovered_center_over_tls_must_show_its_own_nodes_name_or_the_roles(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    centers = [Instance("c1", "10.0.0.1", 8100), Instance("not_a_label!", "10.0.0.2", 8100)]
    ca = tmp_path / "ca.pem"
    service = edge(tmp_path, center_answering([]), center_ca=ca)
    with caplog.at_level(logging.WARNING, logger="edge.pipeline"):
        service._centers(centers)
    assert service.center.urls == ["https://10.0.0.1:8100"]
    assert service.center.centers["https://10.0.0.1:8100"].tls_name == "c1.center.tiered.invalid"
    (skipped,) = [r.getMessage() for r in caplog.records if r.name == "edge.pipeline"]
    assert skipped.startswith("center not_a_label! skipped: node id 'not_a_label!'")
    role = edge(tmp_path, center_answering([]), center_ca=ca, center_tls_name="role")
    role._centers(centers)
    assert [c.tls_name for c in role.center.centers.values()] == [None, None]
    assert role.center.urls == ["https://10.0.0.1:8100", "https://10.0.0.2:8100"]


def test_the_edge_watches_the_centers_service(tmp_path: Path) -> None:
    service = edge(tmp_path, center_answering([]))
    watches: dict[str, Any] = service.watches()
    assert list(watches) == [SERVICES["center"]]
    watches[SERVICES["center"]]([Instance("c9", "10.0.0.9", 8100)])
    assert service.center.urls == ["http://10.0.0.9:8100"]


def test_the_request_span_and_the_cache_series_say_what_each_row_got(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edge import pipeline

    spans: list[dict[str, Any]] = []
    monkeypatch.setattr(pipeline.tracing, "active", lambda: True)
    monkeypatch.setattr(pipeline.tracing, "set_attributes", lambda **a: spans.append(a))
    service, batcher = edge(tmp_path, center_answering([], version="9")), FixedBatcher()
    first = infer(service, resident(batcher), parsed(SURE, UNSURE))
    assert first.parameters["center_version"] == "9"
    assert spans[-1] == {"tiered.tier": "center+edge", "tiered.threshold": 0.9,
                         "tiered.rows": 2, "tiered.escalated": 1, "tiered.degraded": 0,
                         "tiered.cached": 0, "tiered.confidence": pytest.approx(0.8),
                         "tiered.center_version": "9"}
    again = infer(service, resident(batcher), parsed(SURE, UNSURE))  # both rows cached
    assert again.parameters["escalated"] == 1 and again.parameters["degraded"] == 0
    assert spans[-1]["tiered.cached"] == 2 and spans[-1]["tiered.tier"] == "center+edge"
    hits = service.metrics.registry.get_sample_value("edge_cache_hits_total",
                                                     {"model": "sentiment", "version": "3"})
    assert hits == 2


def test_without_a_cache_the_escalation_budget_still_sheds_the_rows_over_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget's bucket holds one row: the least confident unsure row (10: 0.525) goes to
    the center and gets its answer; the others keep the edge's own, marked edge-shed. Nothing
    is counted as cached."""
    from edge import pipeline

    spans: list[dict[str, Any]] = []
    monkeypatch.setattr(pipeline.tracing, "active", lambda: True)
    monkeypatch.setattr(pipeline.tracing, "set_attributes", lambda **a: spans.append(a))
    calls: list[list[int]] = []
    service = edge(tmp_path, center_naming(calls), cache_size=0)
    service.policy.set_budget("sentiment", Budget(True, rows_per_s=0.001, capacity_rows_s=0.002,
                                                  share=0.5))
    answer = infer(service, resident(GradedBatcher()), parsed(40, 10, 90))
    out = outputs(answer)
    assert out["tier"] == ["edge-shed", "center", "edge-shed"]
    assert calls == [[10]]
    assert out["confidence"] == pytest.approx([0.599, 0.99, 0.711], abs=1e-3)
    assert (answer.parameters["threshold"], answer.parameters["escalated"],
            answer.parameters["shed"]) == (0.9, 1, 2)
    assert spans[-1]["tiered.cached"] == 0 and spans[-1]["tiered.threshold"] == 0.9
    hits = service.metrics.registry.get_sample_value("edge_cache_hits_total",
                                                     {"model": "sentiment", "version": "3"})
    assert hits is None


def spans_of(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The request span's attributes, one dict per request (tracing on)."""
    from edge import pipeline

    spans: list[dict[str, Any]] = []
    monkeypatch.setattr(pipeline.tracing, "active", lambda: True)
    monkeypatch.setattr(pipeline.tracing, "set_attributes", lambda **a: spans.append(a))
    return spans


def test_a_request_the_edge_answers_alone_says_nothing_escalated_degraded_or_shed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spans = spans_of(monkeypatch)
    calls: list[dict[str, Any]] = []
    service = edge(tmp_path, center_answering(calls))
    answer = infer(service, resident(FixedBatcher()), parsed(SURE, SURE))
    assert outputs(answer)["tier"] == ["edge", "edge"] and calls == []
    assert answer.parameters == {"edge_version": 3, "threshold": 0.9, "escalated": 0,
                                 "degraded": 0, "shed": 0, "node_id": service.settings.node_id,
                                 "region": service.settings.region}
    assert (spans[-1]["tiered.escalated"], spans[-1]["tiered.degraded"]) == (0, 0)
    assert spans[-1]["tiered.tier"] == "edge" and spans[-1]["tiered.center_version"] == ""


def test_degraded_rows_are_counted_in_the_answer_and_the_span(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    spans = spans_of(monkeypatch)
    service = edge(tmp_path, down)
    answer = infer(service, resident(FixedBatcher()), parsed(UNSURE, SURE, UNSURE))
    assert outputs(answer)["tier"] == ["edge-degraded", "edge", "edge-degraded"]
    assert (answer.parameters["degraded"], answer.parameters["escalated"]) == (2, 0)
    assert "center_version" not in answer.parameters
    assert (spans[-1]["tiered.degraded"], spans[-1]["tiered.escalated"]) == (2, 0)


def test_the_quality_report_has_the_requests_rows_by_tier_under_its_model_and_version(
        tmp_path: Path) -> None:
    service = edge(tmp_path, center_answering([]))
    infer(service, resident(FixedBatcher()), parsed(SURE, UNSURE, SURE, SURE))
    [report] = service.metrics.quality.drain()
    assert (report["model"], report["version"], report["rows"]) == ("sentiment", 3, 4)
    assert report["escalation_rate"] == 0.25 and report["degraded_rate"] == 0.0
    assert report["mean_tokens"] == 2.0  # each row two token ids


def test_an_answer_merging_two_centers_versions_names_both(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Row 0 answered (and cached) while the center served version 8, row 1 now by version 9:
    the answer and its span name both, in order."""
    spans = spans_of(monkeypatch)
    version = {"now": "8"}

    def center(request: httpx.Request) -> httpx.Response:
        return center_answering([], version=version["now"])(request)

    service, r = edge(tmp_path, center), resident(FixedBatcher())
    first = infer(service, r, parsed(UNSURE))
    assert first.parameters["center_version"] == "8"
    version["now"] = "9"
    both = infer(service, r, parsed(UNSURE, UNSURE))  # row 0 cached, row 1 new (100 + 1)
    assert outputs(both)["tier"] == ["center", "center"]
    assert both.parameters["center_version"] == "8,9"
    assert spans[-1]["tiered.center_version"] == "8,9" and spans[-1]["tiered.cached"] == 1


def test_a_request_of_no_rows_answers_none_and_its_span_says_full_confidence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spans = spans_of(monkeypatch)
    calls: list[dict[str, Any]] = []
    service = edge(tmp_path, center_answering(calls))
    answer = infer(service, resident(FixedBatcher()), parsed())
    assert outputs(answer) == {"label": [], "probabilities": [], "confidence": [], "tier": []}
    assert spans[-1]["tiered.rows"] == 0 and spans[-1]["tiered.confidence"] == 1.0
    assert calls == []


def test_the_gate_span_says_the_threshold_the_rows_those_escalated_and_the_least_confidence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edge import pipeline

    class Span:
        def __init__(self, attributes: dict[str, Any]) -> None:
            self.attributes = attributes

        def set_attributes(self, attributes: dict[str, Any]) -> None:
            self.attributes |= attributes

        def set_attribute(self, name: str, value: Any) -> None:
            self.attributes[name] = value

    opened: list[tuple[str, Span]] = []

    @contextmanager
    def span(name: str, *_: Any, **attributes: Any) -> Iterator[Span]:
        opened.append((name, Span(dict(attributes))))
        yield opened[-1][1]

    monkeypatch.setattr(pipeline.tracing, "span", span)
    service = edge(tmp_path, center_answering([]))
    infer(service, resident(FixedBatcher()), parsed(SURE, UNSURE, UNSURE))
    [gate] = [s.attributes for name, s in opened if name == "gate"]
    assert gate == {"tiered.threshold": 0.9, "tiered.rows": 3, "tiered.escalated": 2,
                    "tiered.confidence": pytest.approx(0.5498, abs=1e-4)}


def test_with_the_controller_off_unsure_rows_escalate_and_none_is_shed(tmp_path: Path) -> None:
    calls: list[list[int]] = []
    service = edge(tmp_path, center_naming(calls), controller="off")
    out = outputs(infer(service, resident(GradedBatcher()), parsed(40, 10, 500)))
    assert out["tier"] == ["center", "center", "edge"] and calls == [[40, 10]]
    assert out["confidence"] == pytest.approx([0.96, 0.99, 0.9933], abs=1e-3)


def test_under_a_budget_the_threshold_follows_the_confidences_the_gate_saw(
        tmp_path: Path) -> None:
    """60 confident rows (0.953 up) at 60 rows/s, a budget of 1 row/s: the next request's
    threshold rises from the calibrated 0.9 to the least of them, so few rows would escalate."""
    service = edge(tmp_path, center_by_tag([]))
    service.policy.set_budget("sentiment", Budget(True, rows_per_s=1.0, capacity_rows_s=2.0,
                                                  share=0.5))
    r = resident(TaggedBatcher())
    first = infer(service, r, tagged(*[(SURE, tag) for tag in range(60)]))
    assert first.parameters["threshold"] == 0.9  # too few rows seen to move it
    time.sleep(0.15)  # the controller re-takes its quantile every 0.1 s
    again = infer(service, r, tagged((SURE, 100)))
    assert again.parameters["threshold"] == pytest.approx(edge_confidence(SURE, 0), abs=1e-4)
