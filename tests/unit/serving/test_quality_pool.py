"""Every worker's traffic in worker 0's quality report (``--workers N``)."""

from __future__ import annotations

from pathlib import Path

from serving.telemetry.quality import MAX_LATENCIES, QualityWindow
from serving.telemetry.quality_pool import QualityPool


def traffic(q: QualityWindow, requests: int, ms: float, tier: str) -> None:
    for _ in range(requests):
        q.request("m", 1, ms / 1000)
        q.rows("m", 1, [10], [tier])
        q.confidence("m", 1, [0.97])


def test_worker_zero_reports_the_other_workers_traffic(tmp_path: Path) -> None:
    first, second = QualityWindow(), QualityWindow()
    traffic(first, 30, 1.0, "edge")
    traffic(second, 10, 100.0, "center")
    QualityPool(tmp_path, 1).put(second)
    traffic(second, 10, 100.0, "center")
    QualityPool(tmp_path, 1).put(second)  # a second put adds to the same file
    first.inflows.append(QualityPool(tmp_path, 0).take)
    (report,) = first.drain()
    assert (report["requests"], report["rows"]) == (50, 50)
    assert report["escalation_rate"] == 20 / 50
    assert report["p99_ms"] > 99  # the slow worker's latencies count in the percentiles
    assert sum(b["count"] for b in report["confidence"]) == 50
    assert first.drain() == []  # taken once, not twice
    assert not list(tmp_path.glob("*.json"))


def test_a_worker_file_stays_bounded_while_no_report_takes_it(tmp_path: Path) -> None:
    q, pool = QualityWindow(), QualityPool(tmp_path, 1)
    for _ in range(3):
        traffic(q, MAX_LATENCIES, 1.0, "edge")
        pool.put(q)
    size = (tmp_path / "1.json").stat().st_size
    traffic(q, MAX_LATENCIES, 1.0, "edge")
    pool.put(q)
    assert (tmp_path / "1.json").stat().st_size <= size + 64  # counts grow, samples do not
    first = QualityWindow()
    first.inflows.append(QualityPool(tmp_path, 0).take)
    (report,) = first.drain()
    assert report["requests"] == 4 * MAX_LATENCIES
