"""The input drift and low-confidence fields of a node's quality report, from the serving path
to what an operator scrapes: the window's sums (pooled across workers), the report sent up
the sync stream, the registry's ``registry_node_*`` series and the edge's own gauges, and the
edge measuring only the rows its model ran (a cached row is not measured twice)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from edge.metrics import EdgeMetrics
from registry.server.metrics import SyncMetrics
from serving.inputs import drift
from serving.inputs.drift import InputSums
from serving.runtime.repository import Resident
from serving.telemetry.metrics import Metrics
from serving.telemetry.quality import CONFIDENCE_BUCKETS, QualityWindow
from serving.telemetry.quality_pool import QualityPool
from sync.node.reports import report_message
from tests.codecs import text_codec
from tests.unit.edge.test_pipeline import (
    SURE,
    UNSURE,
    FixedBatcher,
    center_answering,
    edge,
    parsed,
)
from tests.unit.edge.test_pipeline import model as edge_model
from tests.unit.serving.test_input_drift import with_reference


def measured(z: list[float], outliers: int, rows: int) -> InputSums:
    return InputSums(np.asarray(z), outliers, rows)


def test_the_report_gives_the_largest_mean_shift_and_the_outlier_share() -> None:
    q = QualityWindow()
    q.inputs("m", 1, measured([10.0, -30.0, 5.0], outliers=2, rows=20))
    q.inputs("m", 1, measured([10.0, 0.0, 0.0], outliers=1, rows=10))
    (report,) = q.drain()
    assert report["input_rows"] == 30
    assert report["input_shift"] == pytest.approx(1.0)  # |-30| / 30 beats 20 / 30
    assert report["input_outliers"] == pytest.approx(0.1)



def test_drift_is_measured_over_the_last_thousand_rows_across_report_windows() -> None:
    q = QualityWindow()
    q.inputs("m", 1, measured([-30.0, 0.0], outliers=3, rows=30))
    q.drain()
    q.inputs("m", 1, measured([0.0, 0.0], outliers=0, rows=969))
    (report,) = q.drain()  # 999 rows: the first 30 still in
    assert report["input_rows"] == 999 and report["input_shift"] == pytest.approx(30 / 999)
    q.inputs("m", 1, measured([0.0, 0.0], outliers=0, rows=1))
    (report,) = q.drain()  # 1,000 rows, the first 30 still in: without them 970
    assert report["input_rows"] == 1000 and report["input_shift"] == pytest.approx(0.03)
    assert report["input_outliers"] == pytest.approx(3 / 1000)
    q.rows("m", 1, [1], ["edge"])
    (report,) = q.drain()  # nothing measured (idle, or all cached): the figure stays
    assert report["input_rows"] == 1000 and report["input_shift"] == pytest.approx(0.03)
    q.inputs("m", 1, measured([0.0, 0.0], outliers=0, rows=30))
    (report,) = q.drain()  # 1,000 rows without the first 30: those are forgotten
    assert report["input_rows"] == 1000 and report["input_shift"] == 0.0
    assert report["input_outliers"] == 0.0


@pytest.mark.parametrize(("value", "low"), [(0.29, 1.0), (0.2999, 1.0), (0.3, 0.0),
                                            (0.31, 0.0)])
def test_low_confidence_counts_rows_strictly_below_point_three(value: float,
                                                                 low: float) -> None:
    q = QualityWindow()
    q.confidence("m", 1, [value] * 9)
    (report,) = q.drain()
    assert report["low_confidence_share"] == low


def test_the_low_confidence_share_and_the_new_histogram_bounds() -> None:
    assert CONFIDENCE_BUCKETS[:5] == (0.1, 0.2, 0.3, 0.4, 0.5)
    q = QualityWindow()
    q.confidence("m", 1, [0.15, 0.25, 0.29, 0.31, 0.35, 0.45, 0.9] + [0.99] * 3)
    (report,) = q.drain()
    assert report["low_confidence_share"] == pytest.approx(0.3)
    counts = {b["le"]: b["count"] for b in report["confidence"]}
    assert (counts[0.1], counts[0.2], counts[0.3], counts[0.4], counts[0.5]) == (0, 1, 2, 2, 1)
    empty = QualityWindow()
    empty.rows("m", 1, [3], ["center"])  # a center: no edge confidences
    assert empty.drain()[0]["low_confidence_share"] == 0.0


def test_export_and_absorb_keep_the_sums(tmp_path: Path) -> None:
    worker, zero = QualityWindow(), QualityWindow()
    worker.inputs("m", 1, measured([6.0, -2.0], outliers=3, rows=4))
    worker.confidence("m", 1, [0.1, 0.9])
    zero.inputs("m", 1, measured([2.0, -2.0], outliers=1, rows=4))
    zero.confidence("m", 1, [0.2, 0.9, 0.9])
    QualityPool(tmp_path, 1).put(worker)  # through the JSON file, as workers hand it over
    zero.inflows.append(QualityPool(tmp_path, 0).take)
    (report,) = zero.drain()
    assert report["input_rows"] == 8
    assert report["input_shift"] == pytest.approx(1.0)  # (6 + 2) / 8
    assert report["input_outliers"] == pytest.approx(0.5)
    assert report["low_confidence_share"] == pytest.approx(2 / 5)


def test_a_worker_window_without_the_new_fields_is_still_absorbed() -> None:
    q = QualityWindow()
    q.absorb([{"model": "m", "version": 1, "requests": 2, "latencies": [0.01], "tiers": {},
               "tokens": [0] * 7, "token_sum": 0, "confidence": [0] * len(CONFIDENCE_BUCKETS)}])
    (report,) = q.drain()
    assert (report["requests"], report["input_rows"], report["input_shift"]) == (2, 0, 0.0)


def test_the_report_travels_the_sync_stream_with_the_new_fields() -> None:
    q = QualityWindow()
    q.inputs("m", 1, measured([30.0], outliers=5, rows=10))
    q.confidence("m", 1, [0.25, 0.95])
    message = report_message(q.drain()[0])
    assert (message.input_shift, message.input_outliers, message.input_rows,
            message.low_confidence_share) == (3.0, 0.5, 10, 0.5)
    assert [b.le for b in message.confidence][:4] == [0.1, 0.2, 0.3, 0.4]


def test_the_registry_exports_each_nodes_drift_and_low_confidence() -> None:
    metrics = SyncMetrics()
    labels = ["edge-1", "edge", "eu", "digits", "3"]
    metrics.report(labels, {"input_shift": 3.37, "input_outliers": 0.34,
                            "low_confidence_share": 0.05, "requests": 1})
    found = {s.name: s.value for f in text_string_to_metric_families(
        metrics.exposition().decode()) for s in f.samples if s.labels.get("node") == "edge-1"}
    assert found["registry_node_input_shift"] == 3.37
    assert found["registry_node_input_outliers"] == 0.34
    assert found["registry_node_low_confidence_share"] == 0.05


def test_the_edge_sets_its_gauges_at_each_drain() -> None:
    metrics = Metrics("edge")
    stats = EdgeMetrics(metrics)
    metrics.quality.outflows.append(stats.reported)
    metrics.quality.inputs("digits", 3, measured([-33.7], outliers=34, rows=100))
    metrics.quality.confidence("digits", 3, [0.2, 0.8])
    metrics.quality.drain()
    value = metrics.registry.get_sample_value
    labels = {"model": "digits", "version": "3"}
    assert value("edge_input_shift", labels) == pytest.approx(0.337)
    assert value("edge_input_outliers", labels) == pytest.approx(0.34)
    assert value("edge_low_confidence_share", labels) == pytest.approx(0.5)
    metrics.quality.rows("digits", 3, [1], ["edge"])
    metrics.quality.drain()  # the next window, with no measured rows: the last rows' figure
    assert value("edge_input_shift", labels) == pytest.approx(0.337)
    metrics.quality.inputs("digits", 3, measured([0.0], outliers=0, rows=1000))
    metrics.quality.drain()  # a thousand rows like the reference: back to 0
    assert value("edge_input_shift", labels) == 0.0


def test_the_edge_measures_the_rows_its_model_ran_not_the_cached_ones(tmp_path: Path) -> None:
    codec = text_codec()
    ref = drift.reference(codec, [np.asarray([SURE, 7], np.int64)] * 10)
    assert ref is not None
    manifest = with_reference(ref)
    service = edge(tmp_path, center_answering([]))
    quality = service.metrics.quality
    r = Resident(edge_model(), runtime=None, batcher=FixedBatcher(),  # type: ignore[arg-type]
                 codec=codec, drift=drift.InputDrift.of(codec, manifest))
    asyncio.run(service.infer(r, parsed(SURE, UNSURE)))
    asyncio.run(service.infer(r, parsed(SURE, UNSURE, SURE)))  # two cached, one new
    (report,) = quality.drain()
    assert report["rows"] == 5 and report["input_rows"] == 3
    without = Resident(edge_model(), runtime=None, batcher=FixedBatcher(),  # type: ignore[arg-type]
                       codec=codec)
    asyncio.run(service.infer(without, parsed(UNSURE, UNSURE, UNSURE, UNSURE)))
    # a release without reference: its rows are not measured (the three above remain)
    assert quality.drain()[0]["input_rows"] == 3
