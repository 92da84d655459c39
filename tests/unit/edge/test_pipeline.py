"""The edge's cascade in-process: cache, INT8 model (a batcher answering fixed logits), gate,
center (a fake transport answering V2 JSON), merge. No CPU-dependent figure is involved: the
logits are chosen, so the same rows are confident or unsure on every machine."""

from __future__ import annotations

import asyncio
import time
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
from serving.telemetry.logs import request_id
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
    center_may_answer = asyncio.Event()

    async def held(request: httpx.Request) -> httpx.Response:
        await center_may_answer.wait()  # the center answers only once the client has its answer
        return answering(request)

    service, batcher = edge(tmp_path, held, audit_share=1.0, center_timeout_s=30), FixedBatcher()

    async def scenario() -> tuple[list[str], int, int]:
        # an answer that waited for the audit call would never come: the center is held
        answer = await asyncio.wait_for(service.infer(resident(batcher), parsed(SURE, SURE, SURE)),
                                        timeout=20)
        before = len(calls)
        center_may_answer.set()
        auditor = service.audit.auditors[("sentiment", 3)]
        for _ in range(1000):  # the audit call finishes after the answer
            if auditor.audited:
                break
            await asyncio.sleep(0.02)
        await service.stop()
        return outputs(answer)["tier"], before, auditor.audited

    tiers, before, audited = asyncio.run(scenario())
    assert tiers == ["edge", "edge", "edge"]
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


# Rows told apart by their content: a row is (kind, tag), token ids [kind, 100 + tag]. The edge
# model (``TaggedBatcher``) and the center (``center_by_tag``) answer each row from its tag, so a
# row answered with another row's answer, or with none (uninitialised memory), shows.


def tagged(*rows: tuple[int, int], **parameters: Any) -> v2.Parsed:
    return v2.Parsed("req", parameters, decoded([np.asarray([kind, 100 + tag], dtype=np.int64)
                                                 for kind, tag in rows]), None)


def edge_confidence(kind: int, tag: int) -> float:
    """What ``TaggedBatcher`` answers for a row: a SURE row's logit margin is 3 + tag / 2
    (0.953 for tag 0, rising; above the 0.9 threshold), an UNSURE row's 0.2 (0.550)."""
    margin = 3 + tag / 2 if kind == SURE else 0.2
    return float(1 / (1 + np.exp(-margin)))


class TaggedBatcher(FixedBatcher):
    """The edge model answering ``pos`` with ``edge_confidence``; records each batch's tags."""

    async def submit(self, rows: list[np.ndarray]) -> np.ndarray:
        self.batches.append([int(r[1]) - 100 for r in rows])
        return self.finish(np.asarray([[0.0, 3 + (int(r[1]) - 100) / 2 if int(r[0]) == SURE
                                        else 0.2] for r in rows], dtype=np.float32))


def center_confidence(tag: int) -> float:
    return 0.6 + tag / 100


def center_by_tag(calls: list[list[int]], version: str = "9",
                  refuse: Callable[[httpx.Request], bool] = lambda _: False) -> Handler:
    """A center answering ``neg`` with ``center_confidence(tag)`` for each row it is sent;
    records each call's tags; refuses (connection refused) the calls ``refuse`` picks."""

    def handle(request: httpx.Request) -> httpx.Response:
        if refuse(request):
            raise httpx.ConnectError("refused", request=request)
        body = received(request.content, request.headers.get(v2.HEADER_LENGTH))
        ids = body["inputs"][0]
        tags = [int(ids["data"][k * ids["shape"][1] + 1]) - 100 for k in range(ids["shape"][0])]
        calls.append(tags)
        data = [p for tag in tags for p in (center_confidence(tag), 1 - center_confidence(tag))]
        return httpx.Response(200, json={"model_name": "sentiment", "model_version": version,
                                         "outputs": [{"name": "probabilities",
                                                      "shape": [len(tags), 2],
                                                      "datatype": "FP32", "data": data}]})

    return handle


def test_the_center_answers_the_requests_own_rows_when_cached_rows_come_first(
        tmp_path: Path) -> None:
    """The escalated rows are the request's rows, not their positions among its cache misses."""
    calls: list[list[int]] = []
    service, r = edge(tmp_path, center_by_tag(calls)), resident(FixedBatcher())
    infer(service, r, tagged((SURE, 0), (UNSURE, 1)))  # both rows cached; row 1 the center's
    out = outputs(infer(service, r, tagged((SURE, 0), (UNSURE, 1), (UNSURE, 2), (SURE, 3),
                                           (UNSURE, 4))))
    assert calls == [[1], [2, 4]]  # the second request's rows 2 and 4, nothing else
    assert out["tier"] == ["edge", "center", "center", "edge", "center"]
    assert out["label"] == ["pos", "neg", "neg", "pos", "neg"]
    assert [out["confidence"][i] for i in (1, 2, 4)] == pytest.approx(
        [center_confidence(1), center_confidence(2), center_confidence(4)])


def test_cached_and_fresh_answers_each_land_on_their_own_row_when_hits_follow_misses(
        tmp_path: Path) -> None:
    calls: list[list[int]] = []
    service, batcher = edge(tmp_path, center_by_tag(calls)), TaggedBatcher()
    r = resident(batcher)
    infer(service, r, tagged((SURE, 1), (SURE, 3)))
    request = [(SURE, 0), (SURE, 1), (UNSURE, 2), (SURE, 3), (UNSURE, 4)]  # miss, hit, ...
    answer = infer(service, r, tagged(*request))
    out = outputs(answer)
    assert batcher.batches == [[1, 3], [0, 2, 4]] and calls == [[2, 4]]
    assert out["tier"] == ["edge", "edge", "center", "edge", "center"]
    assert out["label"] == ["pos", "pos", "neg", "pos", "neg"]
    expected = [edge_confidence(SURE, 0), edge_confidence(SURE, 1), center_confidence(2),
                edge_confidence(SURE, 3), center_confidence(4)]
    assert out["confidence"] == pytest.approx(expected, abs=1e-6)
    pos = [1 - c if t == "center" else c for c, t in zip(expected, out["tier"], strict=True)]
    assert out["probabilities"] == pytest.approx([p for c in pos for p in (1 - c, c)], abs=1e-6)
    assert answer.parameters["center_version"] == "9"  # the fresh rows' center, merged too
    hits = service.metrics.registry.get_sample_value(
        "edge_cache_hits_total", {"model": "sentiment", "version": "3"})
    assert hits == 2  # rows 1 and 3
    again = infer(service, r, tagged(*request))  # every row cached now, each under its own key
    assert outputs(again) == out and len(batcher.batches) == 2 and len(calls) == 1


def test_a_shed_answer_is_not_cached_so_the_row_escalates_once_the_budget_allows(
        tmp_path: Path) -> None:
    calls: list[list[int]] = []
    service, r = edge(tmp_path, center_by_tag(calls)), resident(FixedBatcher())
    service.policy.set_budget("sentiment", Budget(True, rows_per_s=0.001, capacity_rows_s=0.002,
                                                  share=0.5))
    # the first budget's bucket holds one row: row 0 escalates, row 1 is shed
    assert outputs(infer(service, r, tagged((UNSURE, 0), (UNSURE, 1))))["tier"] == [
        "center", "edge-shed"]
    service.policy.set_budget("sentiment", Budget(True, rows_per_s=1000.0,
                                                  capacity_rows_s=2000.0, share=0.5))
    time.sleep(0.01)  # a changed budget keeps what was left: 10 ms refill 10 rows' worth
    out = outputs(infer(service, r, tagged((UNSURE, 0), (UNSURE, 1))))
    assert out["tier"] == ["center", "center"] and calls == [[0], [1]]


def test_an_answer_at_one_requests_threshold_is_not_served_at_another(tmp_path: Path) -> None:
    calls: list[list[int]] = []
    service, r = edge(tmp_path, center_by_tag(calls)), resident(FixedBatcher())
    assert outputs(infer(service, r, tagged((UNSURE, 0), threshold=0.5)))["tier"] == ["edge"]
    assert outputs(infer(service, r, tagged((UNSURE, 0))))["tier"] == ["center"]  # 0.9
    assert outputs(infer(service, r, tagged((UNSURE, 0), threshold=0.5)))["tier"] == ["edge"]
    assert calls == [[0]]


def test_the_audit_sends_the_requests_own_rows_the_edge_kept_when_cached_rows_come_first(
        tmp_path: Path) -> None:
    """Every row the edge answered itself (share 1) goes to the center once more, in the
    background: the request's rows, never its escalated or cached ones."""
    calls: list[list[int]] = []
    service = edge(tmp_path, center_by_tag(calls), audit_share=1.0)
    r = resident(FixedBatcher())

    async def scenario() -> tuple[list[str], list[str]]:
        first = await service.infer(r, tagged((SURE, 0)))
        await asyncio.sleep(0.2)
        second = await service.infer(r, tagged((SURE, 0), (SURE, 1), (UNSURE, 2), (SURE, 3)))
        await asyncio.sleep(0.2)
        await service.stop()
        return outputs(first)["tier"], outputs(second)["tier"]

    first, second = asyncio.run(scenario())
    assert first == ["edge"] and second == ["edge", "edge", "center", "edge"]
    assert sorted(calls) == [[0], [1, 3], [2]]  # audit, audit (rows 1 and 3), escalation
    auditor = service.audit.auditors[("sentiment", 3)]
    assert auditor.audited == 3 and auditor.state().agreement == 0.0  # pos vs the center's neg


def test_rows_the_center_could_not_answer_count_as_kept_but_are_not_audited(
        tmp_path: Path) -> None:
    """A degraded row is the edge's answer (the kept share counts it) but not one the gate
    kept: the audit compares only those."""
    calls: list[list[int]] = []
    escalation = center_by_tag(calls, refuse=lambda request: "x-request-id" in request.headers)
    service = edge(tmp_path, escalation, audit_share=1.0)
    r = resident(FixedBatcher())

    async def scenario() -> list[str]:
        request_id.set("r-1")  # escalations carry it; audits carry none
        answer = await service.infer(r, tagged((UNSURE, 0), (SURE, 1), (UNSURE, 2), (SURE, 3)))
        await asyncio.sleep(0.5)  # the audit's call, answered at once
        await service.stop()
        return outputs(answer)["tier"]

    assert asyncio.run(scenario()) == ["edge-degraded", "edge", "edge-degraded", "edge"]
    assert calls == [[1, 3]]  # the audit's call; the escalation was refused
    auditor = service.audit.auditors[("sentiment", 3)]
    assert auditor.kept_share == 1.0  # 4 rows, all answered at the edge
    infer(service, r, tagged((SURE, 4), (SURE, 5), (SURE, 6), (SURE, 7)))
    assert auditor.kept_share == 1.0


def audited_calls(tmp_path: Path, requests: list[v2.Parsed], budget: Budget | None = None,
                  **settings: Any) -> list[list[int]]:
    """The center's calls (tags) for ``requests`` sent back to back to an edge auditing every
    row it keeps, the center answering none of them until the edge stops (every audit stays in
    flight, whatever the machine's speed)."""
    calls: list[list[int]] = []
    answering = center_by_tag(calls)

    async def stuck(request: httpx.Request) -> httpx.Response:
        answering(request)  # counted on arrival
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    service = edge(tmp_path, stuck, audit_share=1.0, center_timeout_s=30, **settings)
    if budget is not None:
        service.policy.set_budget("sentiment", budget)
    r = resident(FixedBatcher())

    async def scenario() -> None:
        for request in requests:
            await service.infer(r, request)
        await asyncio.sleep(0.3)  # the audits started reach the center
        await service.stop()  # and are cancelled

    asyncio.run(scenario())
    return sorted(calls)


def test_audits_in_flight_are_bounded_and_one_more_is_skipped_not_queued(
        tmp_path: Path) -> None:
    requests = [tagged((SURE, tag)) for tag in range(3)]
    assert audited_calls(tmp_path / "one", requests, audit_in_flight=1) == [[0]]
    assert audited_calls(tmp_path / "two", requests, audit_in_flight=2) == [[0], [1]]


def test_an_audit_takes_budget_for_each_of_its_rows_or_is_skipped(tmp_path: Path) -> None:
    budget = Budget(True, rows_per_s=0.001, capacity_rows_s=0.002, share=0.5)  # 1 row's worth
    assert audited_calls(tmp_path / "two", [tagged((SURE, 0), (SURE, 1))], budget) == []
    assert audited_calls(tmp_path / "one", [tagged((SURE, 0))], budget) == [[0]]


class SharedBatcher(FixedBatcher):
    """A batcher answering with rows of one model call's output, as the real one does when
    requests share a call: the array it answers stays its own (``given``)."""

    async def submit(self, rows: list[np.ndarray]) -> np.ndarray:
        self.given = await super().submit(rows)
        return self.given


def test_the_centers_answers_never_overwrite_the_model_calls_own_rows(tmp_path: Path) -> None:
    """Another request's rows may come from the same model call: escalation writes the
    center's answers into a copy."""
    batcher = SharedBatcher()
    service = edge(tmp_path, center_by_tag([]))
    out = outputs(infer(service, resident(batcher), tagged((UNSURE, 0), (SURE, 1))))
    assert out["tier"] == ["center", "edge"]
    np.testing.assert_array_equal(batcher.given, softmax(np.asarray(
        [LOGITS[UNSURE], LOGITS[SURE]], dtype=np.float32)))
