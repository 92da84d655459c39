"""The edge's cascade in-process: cache, INT8 model (a batcher answering fixed logits), gate,
center (a fake transport answering V2 JSON), merge. No CPU-dependent figure is involved: the
logits are chosen, so the same rows are confident or unsure on every machine."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
import numpy as np
import pytest

from edge.build import build_service
from edge.centers import parse_list
from edge.escalation import Centers, Transports
from edge.pipeline import EdgeService
from edge.settings import EdgeSettings
from serving.model.scores import softmax
from serving.protocol import v2
from serving.protocol.budget import Budget
from serving.release.manifest import Calibration, Manifest
from serving.runtime.repository import Resident
from tests.codecs import decoded, received, text_codec
from tests.unit.serving.test_store import manifest as store_manifest

SURE, UNSURE = 1, 2  # a row's first token id picks its logits
LOGITS = {SURE: [0.0, 6.0], UNSURE: [0.0, 0.2]}  # softmax: 0.998 fresh; 0.55 fresh


class FixedBatcher:
    """The edge model: fixed logits per row kind, answered as the edge's batcher does
    (through the service's per-call finish: probabilities); records each batch it is given."""

    def __init__(self, finish: Callable[[np.ndarray], np.ndarray] = softmax) -> None:
        self.batches: list[list[int]] = []
        self.finish = finish

    async def submit(self, rows: list[np.ndarray]) -> np.ndarray:
        self.batches.append([int(r[0]) for r in rows])
        return self.finish(np.asarray([LOGITS[int(r[0])] for r in rows], dtype=np.float32))


def model(threshold: float = 0.9) -> Manifest:
    return msgspec.structs.replace(store_manifest(3), calibration=Calibration(
        source="test", threshold=threshold))


def resident(batcher: FixedBatcher) -> Resident:
    return Resident(model(), runtime=None, batcher=batcher,  # type: ignore[arg-type]
                    codec=text_codec())


def parsed(*kinds: int, **parameters: Any) -> v2.Parsed:
    rows = [np.asarray([kind, 100 + i], dtype=np.int64) for i, kind in enumerate(kinds)]
    return v2.Parsed("req", parameters, decoded(rows), None)


Handler = Callable[[httpx.Request], httpx.Response]


def center_answering(calls: list[dict[str, Any]], version: str = "9") -> Handler:
    """A center that says ``neg`` with 0.8 for every row it is sent."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = received(request.content, request.headers.get(v2.HEADER_LENGTH))
        calls.append(body)
        n = body["inputs"][0]["shape"][0]
        return httpx.Response(200, json={"model_name": "sentiment", "model_version": version,
                                         "outputs": [{"name": "probabilities", "shape": [n, 2],
                                                      "datatype": "FP32",
                                                      "data": [0.8, 0.2] * n}]})

    return handle


def edge(tmp_path: Path, handler: Handler, **settings: Any) -> EdgeService:
    settings.setdefault("audit_share", 0.0)  # the audit's random sample only where asked for
    center = Centers(Transports(1.0, None, httpx.MockTransport(handler)),
                     parse_list("http://center.test"), 3, 30.0)
    return build_service(EdgeSettings(store=tmp_path, **settings), center=center)


def outputs(response: v2.InferResponse) -> dict[str, list[Any]]:
    """Each output's values as the JSON answer holds them."""
    return {o.name: msgspec.json.decode(v2.encode_response(response))["outputs"][i]["data"]
            for i, o in enumerate(response.outputs)}


def infer(service: EdgeService, r: Resident, p: v2.Parsed) -> v2.InferResponse:
    return asyncio.run(service.infer(r, p))


def test_confident_rows_stay_and_only_unsure_rows_reach_the_center_in_order(
        tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    service, batcher = edge(tmp_path, center_answering(calls)), FixedBatcher()
    answer = infer(service, resident(batcher), parsed(SURE, UNSURE, SURE, UNSURE))
    out = outputs(answer)
    assert out["tier"] == ["edge", "center", "edge", "center"]
    assert out["label"] == ["pos", "neg", "pos", "neg"]
    assert out["confidence"][1] == pytest.approx(0.8) and out["confidence"][0] > 0.99
    assert batcher.batches == [[SURE, UNSURE, SURE, UNSURE]]
    (call,) = calls  # one escalation for both unsure rows, carrying just those rows
    ids = call["inputs"][0]
    assert ids["shape"] == [2, 2] and ids["data"] == [UNSURE, 101, UNSURE, 103]
    assert answer.parameters == {"edge_version": 3, "threshold": 0.9, "escalated": 2,
                                 "degraded": 0, "shed": 0, "node_id": service.settings.node_id,
                                 "region": service.settings.region, "center_version": "9"}


def test_no_center_means_degraded_edge_answers_not_errors(tmp_path: Path) -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    service = edge(tmp_path, down)
    out = outputs(infer(service, resident(FixedBatcher()), parsed(UNSURE, SURE)))
    assert out["tier"] == ["edge-degraded", "edge"]
    assert out["label"] == ["pos", "pos"]  # the edge's own answer
    assert out["confidence"][0] == pytest.approx(0.5498, abs=1e-3)


def test_repeated_rows_come_from_the_cache_with_their_tier(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    service, batcher = edge(tmp_path, center_answering(calls)), FixedBatcher()
    r = resident(batcher)
    first = outputs(infer(service, r, parsed(SURE, UNSURE)))
    again = infer(service, r, parsed(SURE, UNSURE))
    assert outputs(again) == first and len(batcher.batches) == 1 and len(calls) == 1
    assert again.parameters["center_version"] == "9"  # remembered with the cached row
    hits, misses = service.cache.lookup([service.cache.key("sentiment", 3, 0.9, row)
                                         for row in parsed(SURE, UNSURE, UNSURE).inputs.rows])
    assert sorted(hits) == [0, 1] and misses == [2]


def test_a_request_of_cached_and_new_rows_answers_each_in_its_place(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    service, batcher = edge(tmp_path, center_answering(calls)), FixedBatcher()
    r = resident(batcher)
    infer(service, r, parsed(SURE, UNSURE))  # rows 0 and 1 cached
    out = outputs(infer(service, r, parsed(SURE, UNSURE, UNSURE, SURE)))
    assert batcher.batches[1] == [UNSURE, SURE]  # only rows 2 and 3 reach the model
    assert out["tier"] == ["edge", "center", "center", "edge"]
    assert out["label"] == ["pos", "neg", "neg", "pos"]
    assert out["confidence"][1] == out["confidence"][2] == pytest.approx(0.8)
    assert out["confidence"][0] == out["confidence"][3] > 0.99
    assert len(calls) == 2  # the first request's unsure row, then row 2 of the second


def test_without_a_cache_every_request_reaches_the_model_and_the_center(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    service = edge(tmp_path, center_answering(calls), cache_size=0)
    batcher = FixedBatcher()
    r = resident(batcher)
    first = outputs(infer(service, r, parsed(UNSURE, SURE)))
    again = outputs(infer(service, r, parsed(UNSURE, SURE)))
    assert again == first and first["tier"] == ["center", "edge"]
    assert batcher.batches == [[UNSURE, SURE]] * 2 and len(calls) == 2


def test_degraded_answers_are_not_cached_so_the_center_is_asked_again(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    up = center_answering(calls)
    state = {"down": True}

    def flaky(request: httpx.Request) -> httpx.Response:
        if state["down"]:
            raise httpx.ConnectError("refused", request=request)
        return up(request)

    service, r = edge(tmp_path, flaky), resident(FixedBatcher())
    assert outputs(infer(service, r, parsed(UNSURE)))["tier"] == ["edge-degraded"]
    state["down"] = False
    assert outputs(infer(service, r, parsed(UNSURE)))["tier"] == ["center"] and len(calls) == 1


def test_a_request_threshold_wins_and_threshold_one_escalates_every_row(
        tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    service = edge(tmp_path, center_answering(calls))
    low = outputs(infer(service, resident(FixedBatcher()), parsed(UNSURE, threshold=0.5)))
    assert low["tier"] == ["edge"] and calls == []
    every = outputs(infer(service, resident(FixedBatcher()), parsed(SURE, SURE, threshold=1)))
    assert every["tier"] == ["center", "center"] and len(calls) == 1


def test_rows_are_counted_by_tier_in_the_metrics(tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    service = edge(tmp_path, center_answering(calls))
    infer(service, resident(FixedBatcher()), parsed(SURE, UNSURE, UNSURE))
    value = service.metrics.registry.get_sample_value
    labels = {"model": "sentiment", "version": "3"}
    assert value("edge_rows_total", {**labels, "tier": "edge"}) == 1
    assert value("edge_rows_total", {**labels, "tier": "center"}) == 2


def test_discovered_centers_are_called_over_grpc_where_they_registered_a_grpc_port(
        tmp_path: Path) -> None:
    from serving.fleet.discovery import Instance

    centers = [Instance("c1", "10.0.0.1", 8100, meta={"grpc_port": "8101"}),
               Instance("c2", "10.0.0.2", 8100),  # no gRPC port: REST
               Instance("c3", "fe80::1", 8100, meta={"grpc_port": "8101"})]
    # (an instance whose grpc_port is not a port never gets here: discovery drops it)
    rest = ["http://10.0.0.1:8100", "http://10.0.0.2:8100", "http://[fe80::1]:8100"]
    service = edge(tmp_path, center_answering([]))
    service._centers(centers)
    assert service.center.urls == rest  # the default: V2 REST
    service = edge(tmp_path, center_answering([]), escalation="grpc")
    service._centers(centers)
    assert service.center.urls == ["grpc://10.0.0.1:8101", rest[1], "grpc://[fe80::1]:8101"]
    ca = tmp_path / "ca.pem"
    service = edge(tmp_path, center_answering([]), escalation="grpc", center_ca=ca)
    service._centers(centers[:2])
    assert service.center.urls == ["grpcs://10.0.0.1:8101", "https://10.0.0.2:8100"]
    service._centers([])  # none passing: the configured list
    assert service.center.urls == ["http://center.test"]


def test_each_model_call_is_finished_once_into_probabilities_and_confidence_metrics(
        tmp_path: Path) -> None:
    """The edge's per-call finish (run in the batcher's thread, per model call): softmax,
    every row's confidence in the histogram and in the quality report."""
    service = edge(tmp_path, center_answering([]))
    finish = service.stats.finisher(model())
    logits = np.asarray([LOGITS[SURE], LOGITS[UNSURE], LOGITS[SURE]], dtype=np.float32)
    probabilities = finish(logits)
    assert np.allclose(probabilities, softmax(logits)) and probabilities.dtype == np.float32
    registry = service.metrics.registry
    labels = {"model": "sentiment", "version": "3"}
    assert registry.get_sample_value("edge_confidence_count", labels) == 3
    assert registry.get_sample_value("edge_confidence_bucket", {**labels, "le": "0.6"}) == 1
    [report] = service.metrics.quality.drain()
    assert sum(b["count"] for b in report["confidence"]) == 3


def test_over_budget_rows_are_shed_marked_and_counted_a_request_threshold_too(
        tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    service, batcher = edge(tmp_path, center_answering(calls)), FixedBatcher()
    r = resident(batcher)
    service.policy.set_budget("sentiment", Budget(True, rows_per_s=0.001, capacity_rows_s=0.002,
                                           share=0.5))
    answer = infer(service, r, parsed(UNSURE, SURE, UNSURE, UNSURE, UNSURE, UNSURE))
    out = outputs(answer)
    # the release has no curve: the floor is its threshold 0.9, so every UNSURE row is unsure;
    # the first budget's bucket holds one row: one escalates, the other four are shed
    assert out["tier"].count("center") == 1 and out["tier"].count("edge-shed") == 4
    assert answer.parameters["shed"] == 4 and answer.parameters["escalated"] == 1
    shed = [i for i, t in enumerate(out["tier"]) if t == "edge-shed"]
    assert all(out["confidence"][i] == pytest.approx(0.5498, abs=1e-3) for i in shed)  # edge's
    assert service.stats.rows_by_tier.labels("sentiment", "3", "edge-shed")._value.get() == 4
    assert len(calls) == 1
    # the request's own threshold is held to the same (now empty) bucket: no row escalates
    override = outputs(infer(service, r, parsed(UNSURE, UNSURE, threshold=1.0)))
    assert override["tier"] == ["edge-shed", "edge-shed"] and len(calls) == 1


class GradedBatcher(FixedBatcher):
    """Unsure rows of three confidences: a row's first token id is its logit margin x 100
    (softmax: 10 -> 0.525, 40 -> 0.599, 90 -> 0.711; all below the 0.9 threshold)."""

    async def submit(self, rows: list[np.ndarray]) -> np.ndarray:
        self.batches.append([int(r[0]) for r in rows])
        return self.finish(np.asarray([[0.0, int(r[0]) / 100] for r in rows], dtype=np.float32))


def test_over_budget_the_least_confident_rows_escalate_and_the_most_confident_are_shed(
        tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    service = edge(tmp_path, center_answering(calls), burst_s=2.0)
    r = resident(GradedBatcher())
    # the first budget's bucket holds 2 rows (rows_per_s x burst_s)
    service.policy.set_budget("sentiment", Budget(True, rows_per_s=1.0, capacity_rows_s=2.0,
                                                  share=0.5))
    out = outputs(infer(service, r, parsed(90, 10, 90, 40, 90)))
    assert out["tier"] == ["edge-shed", "center", "edge-shed", "center", "edge-shed"]
    [call] = calls
    sent = call["inputs"][0]["data"]  # the escalated rows' token ids, in request order
    assert sent[::2] == [10, 40]


def center_naming(calls: list[list[int]]) -> Handler:
    """A center whose answer names the row it was sent: ``pos`` with the row's token id / 1000
    (so an answer in the wrong place, or for a row never sent, shows)."""

    def handle(request: httpx.Request) -> httpx.Response:
        ids = received(request.content, request.headers.get(v2.HEADER_LENGTH))["inputs"][0]
        sent = ids["data"][::ids["shape"][1]]  # each row's first token id
        calls.append(sent)
        data = [x for token in sent for x in (1 - token / 1000, token / 1000)]
        return httpx.Response(200, json={"model_name": "sentiment", "model_version": "9",
                                         "outputs": [{"name": "probabilities", "datatype": "FP32",
                                                      "shape": [len(sent), 2], "data": data}]})

    return handle


def test_a_request_threshold_within_the_budget_escalates_exactly_the_rows_below_it(
        tmp_path: Path) -> None:
    """Confidences 0.525, 0.599, 0.711, 0.599: threshold 0.65 escalates rows 0, 1 and 3; the
    bucket holds 3 rows, so the client's threshold is honoured as given, nothing shed."""
    calls: list[list[int]] = []
    service = edge(tmp_path, center_naming(calls), burst_s=3.0)
    service.policy.set_budget("sentiment", Budget(True, rows_per_s=1.0, capacity_rows_s=2.0,
                                                  share=0.5))
    answer = infer(service, resident(GradedBatcher()), parsed(10, 40, 90, 41, threshold=0.65))
    out = outputs(answer)
    assert out["tier"] == ["center", "center", "edge", "center"]
    assert calls == [[10, 40, 41]]  # just those rows, in request order
    assert out["confidence"][0] == pytest.approx(0.99) and out["label"][0] == "neg"
    assert out["confidence"][1] == pytest.approx(0.96) and out["confidence"][3] == \
        pytest.approx(0.959)  # each row the center's answer for that row
    assert out["confidence"][2] == pytest.approx(0.7109, abs=1e-3)  # the edge's own
    assert answer.parameters["threshold"] == 0.65
    assert answer.parameters["escalated"] == 3 and answer.parameters["shed"] == 0


def test_a_request_threshold_beyond_the_budget_is_shed_the_center_sees_the_budget(
        tmp_path: Path) -> None:
    """``threshold: 1`` asks for every row; the bucket holds 3: the 3 least confident go,
    the other 3 (the confident ones among them) come back edge-shed with the edge's answer."""
    calls: list[list[int]] = []
    service = edge(tmp_path, center_naming(calls), burst_s=3.0)
    service.policy.set_budget("sentiment", Budget(True, rows_per_s=1.0, capacity_rows_s=2.0,
                                                  share=0.5))
    r = resident(GradedBatcher())
    answer = infer(service, r, parsed(90, 10, 500, 40, 90, 20, threshold=1))
    out = outputs(answer)
    assert out["tier"] == ["edge-shed", "center", "edge-shed", "center", "edge-shed", "center"]
    assert calls == [[10, 40, 20]]
    assert answer.parameters["escalated"] == 3 and answer.parameters["shed"] == 3
    assert out["confidence"][2] == pytest.approx(0.9933, abs=1e-3)  # the edge's, not a center's
    again = outputs(infer(service, r, parsed(10, threshold=1)))  # the bucket is empty now
    assert again["tier"] == ["edge-shed"] and len(calls) == 1
    assert outputs(infer(service, r, parsed(10, threshold=None)))["tier"] == ["edge-shed"]


def test_without_a_budget_a_request_threshold_is_honoured_as_given(tmp_path: Path) -> None:
    calls: list[list[int]] = []
    service = edge(tmp_path, center_naming(calls))  # no registry: no budget known
    out = outputs(infer(service, resident(GradedBatcher()), parsed(90, 500, threshold=1)))
    assert out["tier"] == ["center", "center"] and calls == [[90, 500]]


def test_audit_rows_go_to_the_center_in_the_background_never_delaying_the_answer(
        tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    answering = center_answering(calls)

    async def slow(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(0.8)
        return answering(request)

    service, batcher = edge(tmp_path, slow, audit_share=1.0, center_timeout_s=5), FixedBatcher()

    async def scenario() -> tuple[float, list[str], int, int]:
        started = asyncio.get_running_loop().time()
        answer = await service.infer(resident(batcher), parsed(SURE, SURE, SURE))
        took = asyncio.get_running_loop().time() - started
        before = len(calls)
        await asyncio.sleep(1.5)  # the audit call finishes after the answer
        audited = service.audit.auditors[("sentiment", 3)].audited
        await service.stop()
        return took, outputs(answer)["tier"], before, audited

    took, tiers, before, audited = asyncio.run(scenario())
    assert tiers == ["edge", "edge", "edge"] and took < 0.5  # the center takes 0.8 s
    assert before == 0 and len(calls) == 1 and audited == 3  # one background call, 3 rows


def test_a_drifting_audit_is_noted_in_readiness_and_its_report(tmp_path: Path) -> None:
    from serving.dataplane import DataPlane
    from serving.release.manifest import AgreementBin

    calibration = Calibration(source="labelled", threshold=0.9, center_accuracy=0.8,
                              agreement=[AgreementBin(1.0, 200, 0.95, 0.5)])
    manifest = msgspec.structs.replace(store_manifest(3), calibration=calibration)
    service = edge(tmp_path, center_answering([]), audit_share=1.0, audit_min_rows=20)
    auditor = service.audit.auditor(manifest)
    assert service.notes() == []
    auditor.record(np.full(40, 0.99), np.zeros(40, int), np.r_[np.zeros(20, int),
                                                               np.ones(20, int)])
    (note,) = service.notes()  # 50% agreement where the calibration predicts 95%
    assert note.startswith("drift: sentiment v3") and "95.0%" in note
    assert DataPlane.of(service).notes() == [note]  # what /v2/health/ready carries
    report = service.audit.report("sentiment", 3)
    assert report["drift"] and report["audit_rows"] == 40
    assert report["audit_agreement"] == pytest.approx(0.5)
    assert report["estimated_accuracy"] == pytest.approx(0.8 - 1.0 * 0.5 * 0.5)
