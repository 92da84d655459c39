"""``tiered report`` against a real Prometheus holding 30 days of a small fleet's series
(``tests.report_data``, backfilled with promtool): every figure an operator reads is the one the
data was built with: availability per tier and node, p50/p99, rows by tier per release, the edge
share, the center rows avoided, over 30 days and over 7 (an outage just outside them), the
window clipped to the data Prometheus has, and the plot."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from PIL import Image

from harness.processes import free_port
from tests import report_data
from tests.report_data import SAMPLES, STEP
from tiered import cli
from tiered.report import plot
from tiered.report.query import Prometheus, PrometheusError
from tiered.report.window import window

pytestmark = pytest.mark.integration

DAY = 86400


@dataclass(frozen=True)
class Backfilled:
    url: str
    end: int  # the last sample's time


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    """Prometheus 2.42 on the backfilled blocks (no scrape targets: nothing else is added)."""
    root = tmp_path_factory.mktemp("prometheus")
    end = int(time.time())
    data = report_data.write(root / "fleet.om", end)
    # one block per 30 days: promtool's default 2-hour blocks take minutes to write
    subprocess.run(["/usr/bin/promtool", "tsdb", "create-blocks-from", "openmetrics", "-q",
                    "--max-block-duration=720h", str(data), str(root / "tsdb")], check=True)
    data.unlink()
    (root / "prometheus.yml").write_text("scrape_configs: []\n")
    port = free_port()
    with (root / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            ["/usr/bin/prometheus", f"--storage.tsdb.path={root / 'tsdb'}",
             f"--config.file={root / 'prometheus.yml'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=60d"],
            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not ready(url):
            assert process.poll() is None, (root / "prometheus.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "Prometheus not ready within 60 s"
            time.sleep(0.2)
        yield Backfilled(url, end)
    finally:
        process.terminate()
        process.wait(timeout=30)


def ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/-/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def report(*args: str) -> Any:
    result = CliRunner().invoke(cli.cli, ["report", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def tier(found: Any, name: str) -> Any:
    return next(t for t in found["tiers"] if t["name"] == name)


def release(found: Any, version: str) -> Any:
    return next(r for r in found["releases"] if r["version"] == version)


@pytest.fixture(scope="module")
def thirty(prometheus: Backfilled) -> Any:
    """The 30 days up to the last sample, as JSON."""
    return report("--prometheus", prometheus.url, "--until", str(prometheus.end))


def test_thirty_days_of_availability_are_the_scrapes_up_per_tier_and_node(
        thirty: Any, prometheus: Backfilled) -> None:
    found = thirty
    assert found["window"]["first_sample"] == prometheus.end - (SAMPLES - 1) * STEP
    assert found["window"]["covered_seconds"] == 30 * DAY - STEP
    assert tier(found, "edge")["availability"] == pytest.approx(1 - 12 / (2 * SAMPLES))
    assert tier(found, "edge")["nodes"] == 2
    assert tier(found, "center")["availability"] == 1.0
    assert tier(found, "registry")["availability"] == pytest.approx(1 - 6 / SAMPLES)
    nodes = {n["node"]: n for n in found["nodes"]}
    assert sorted(nodes) == ["edge-eu-1", "registry"]  # edge-us-1, center-1: never down
    assert nodes["edge-eu-1"]["availability"] == pytest.approx(719 / 720)  # 1 hour of 720
    assert nodes["edge-eu-1"]["down_seconds"] == pytest.approx(3600, abs=1)
    assert nodes["registry"]["down_seconds"] == pytest.approx(1800, abs=1)


def test_thirty_days_of_requests_latency_and_rows_are_as_built(thirty: Any) -> None:
    found = thirty
    edge = tier(found, "edge")["requests"]
    assert edge["availability"] == pytest.approx((999 + 490) / 1500)
    assert edge["p99_ms"] == pytest.approx(425)  # in (250, 500]: rank 1485 of 1500
    assert edge["p50_ms"] == pytest.approx(40.625)  # in (25, 50]
    assert edge["mean_ms"] == pytest.approx((44_125 + 62_000) / 1500)
    center = tier(found, "center")["requests"]
    assert center["availability"] == pytest.approx(195 / 200)
    assert 100 < center["p99_ms"] <= 250
    scrapes = 2 * SAMPLES - 12  # edge-eu-1 was down for 12: no counters exported
    # increase() extrapolates to the window's edges (one step of 8,640): within 0.1%
    assert edge["requests"] == pytest.approx(scrapes * 1500, rel=1e-3)  # the reset handled
    assert tier(found, "edge")["rows"] == pytest.approx(scrapes * 2500, rel=1e-3)
    assert tier(found, "center")["rows"] == pytest.approx(SAMPLES * 690, rel=1e-3)
    assert tier(found, "registry")["requests"] is None


def test_each_release_shows_its_rows_by_answering_tier_and_its_own_latency(
        thirty: Any) -> None:
    found = thirty
    assert [(r["model"], r["version"]) for r in found["releases"]] == [
        ("sentiment", "1"), ("sentiment", "2")]
    scrapes = 2 * SAMPLES - 12
    one, two = release(found, "1"), release(found, "2")
    assert one["rows"]["edge_share"] == pytest.approx(0.8)
    assert two["rows"]["edge_share"] == pytest.approx(0.9)
    assert one["rows"]["escalated"] == pytest.approx(scrapes * 300, rel=1e-3)
    assert one["rows"]["degraded"] == pytest.approx(scrapes * 80, rel=1e-3)
    assert one["rows"]["shed"] == pytest.approx(scrapes * 20, rel=1e-3)
    assert two["rows"]["shed"] == 0.0  # no series at all
    assert one["requests"]["availability"] == pytest.approx(0.999)
    assert two["requests"]["availability"] == pytest.approx(0.98)
    assert 50 < one["requests"]["p99_ms"] <= 100  # 990th of 1,000 in (50, 100] ms
    assert one["requests"]["p99_ms"] == pytest.approx(50 + 50 * 90 / 95)
    assert 250 < two["requests"]["p99_ms"] <= 500


def test_the_edge_share_and_the_center_rows_avoided_count_every_release(
        thirty: Any) -> None:
    rows = thirty["rows"]
    assert rows["edge_share"] == pytest.approx((1600 + 450) / 2500)
    assert rows["audited"] == pytest.approx((2 * SAMPLES - 12) * 16, rel=1e-3)
    assert rows["center_avoided"] == pytest.approx(rows["edge"] - rows["audited"])
    assert rows["center_avoided"] == pytest.approx((2 * SAMPLES - 12) * 2034, rel=1e-3)


def test_seven_days_ending_now_leave_the_edge_outage_out_and_the_registry_outage_in(
        prometheus: Backfilled) -> None:
    found = report("--prometheus", prometheus.url, "--since", "7d")
    assert tier(found, "edge")["availability"] == 1.0  # down 7d 1h to 7d 2h ago
    week = 7 * DAY // STEP
    assert tier(found, "registry")["availability"] == pytest.approx(1 - 6 / week, abs=1e-5)
    assert [n["node"] for n in found["nodes"]] == ["registry"]  # down 6d to 6d 30m ago
    assert tier(found, "edge")["rows"] == pytest.approx(2 * week * 2500, rel=3e-3)
    assert found["window"]["seconds"] == 7 * DAY


def test_a_window_longer_than_the_data_is_clipped_to_its_first_sample(
        prometheus: Backfilled) -> None:
    found = report("--prometheus", prometheus.url, "--until", str(prometheus.end),
                   "--since", "60d")
    assert found["window"]["first_sample"] == prometheus.end - (SAMPLES - 1) * STEP
    assert found["window"]["covered_seconds"] == 30 * DAY - STEP
    assert tier(found, "registry")["availability"] == pytest.approx(1 - 6 / SAMPLES)


def test_the_markdown_and_the_plot_go_into_the_out_folder(prometheus: Backfilled,
                                                          tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.cli, ["report", "--prometheus", prometheus.url, "--until",
                                          str(prometheus.end), "--out", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "r" / "report.md").read_text()
    assert "- **Availability 99.267%**" in text
    assert "| edge | 2 | 99.931% |" in text and "| registry | 1 | 99.931% |" in text
    assert "| edge-eu-1 | edge | 99.861% | 60 minutes |" in text
    assert "| sentiment | 1 |" in text and "| 80.0% |" in text
    assert "data over the whole window" in text
    assert "![requests/s, p99 and edge share over the window](report.png)" in text
    with Image.open(tmp_path / "r" / "report.png") as image:
        assert image.format == "PNG" and image.size == (900, 750)
    assert not (tmp_path / "r" / "report.json").exists()  # only with --json


def test_without_out_the_markdown_is_printed_and_the_plot_written_here(
        prometheus: Backfilled, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli.cli, ["report", "--prometheus", prometheus.url,
                                          "--since", "60d"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# Tiered report: the last 60d to ")
    assert "so the report covers 30.0 days of the 60d" in result.stdout
    assert "](tiered-report.png)" in result.stdout
    assert (tmp_path / "tiered-report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_plot_follows_the_traffic_over_the_window(prometheus: Backfilled) -> None:
    with httpx.Client(timeout=30) as client:
        prom = Prometheus(prometheus.url, client)
        w = window(prom, "30d", 30 * DAY, prometheus.end)
        points = plot.series(prom, w)
    assert points.step == pytest.approx((30 * DAY - STEP) / 200)
    edge = [v for _, v in points.requests["edge"]]
    assert 195 <= len(edge) <= 201
    # two edges x 1,500 requests per 5 minutes; edge-eu-1's hour down shows as a dip
    assert sorted(edge)[len(edge) // 2] == pytest.approx(10.0)
    assert min(edge) < 9.9
    assert all(v == pytest.approx(425) for _, v in points.p99_ms["edge"])
    assert all(v == pytest.approx(0.82) for _, v in points.edge_share)


def test_a_query_prometheus_refuses_says_why(prometheus: Backfilled) -> None:
    with httpx.Client(timeout=30) as client, pytest.raises(PrometheusError) as refused:
        Prometheus(prometheus.url, client).instant("sum(", prometheus.end)
    assert f"Prometheus at {prometheus.url} refused 'sum(' (400)" in str(refused.value)


def test_a_window_with_no_data_is_a_clear_error(prometheus: Backfilled) -> None:
    result = CliRunner().invoke(cli.cli, ["report", "--prometheus", prometheus.url, "--until",
                                          str(prometheus.end - 31 * DAY), "--since", "1d"])
    assert result.exit_code == 1
    assert "has no scrape of the tiers" in result.output and "in the last 1d" in result.output

