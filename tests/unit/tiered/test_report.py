"""``tiered report`` without a Prometheus to read: the windows it accepts (Prometheus durations
of a minute or more) and refuses, where it finds Prometheus (``--prometheus``, else the running
stack's ``stack.json``), an unreachable one (a clear message, exit code 1), and the figures'
formats. Against a real Prometheus: tests/integration/test_report.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.processes import free_port
from tiered import cli
from tiered.report.markdown import millis, percent, span
from tiered.report.query import parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("30d", 30 * 86400), ("90m", 5400), ("6h", 21600), ("1d12h", 129600), ("2w", 14 * 86400),
    ("1m", 60), ("60s", 60), ("1y", 365 * 86400)])
def test_prometheus_durations_of_a_minute_or_more_are_windows(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["30x", "", "d", "30", "1h1d", "30 d", "-1d", "1.5d"])
def test_anything_else_is_no_duration(text: str) -> None:
    with pytest.raises(ValueError, match="is not a Prometheus duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["59s", "59999ms", "0d"])
def test_a_window_shorter_than_a_minute_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="shorter than a minute"):
        parse_duration(text)


def test_a_bad_since_is_a_usage_error_that_says_what_a_duration_is() -> None:
    result = CliRunner().invoke(cli.cli, ["report", "--prometheus", "http://127.0.0.1:1",
                                          "--since", "30x"])
    assert result.exit_code == 2
    assert "'30x' is not a Prometheus duration (e.g. 90m, 6h, 30d, 1d12h)" in result.output


def test_an_until_without_a_time_zone_is_refused() -> None:
    result = CliRunner().invoke(cli.cli, ["report", "--prometheus", "http://127.0.0.1:1",
                                          "--until", "2024-06-01T00:00:00"])
    assert result.exit_code == 2 and "has no time zone (add Z for UTC)" in result.output


def test_an_unreachable_prometheus_is_a_clear_message_and_exit_code_1() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    result = CliRunner().invoke(cli.cli, ["report", "--prometheus", url,
                                          "--until", "2024-06-01T00:00:00Z"])
    assert result.exit_code == 1
    assert f"Error: Prometheus at {url} is not answering" in result.output


def test_without_a_flag_or_a_running_stack_it_asks_for_prometheus(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERED_ROOT", str(tmp_path))
    result = CliRunner().invoke(cli.cli, ["report"])
    assert result.exit_code == 2
    assert "pass --prometheus URL" in result.output and "stack.json" in result.output


def test_the_running_stacks_prometheus_is_read_from_stack_json(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    (tmp_path / "stack.json").write_text(json.dumps({"prometheus": f"127.0.0.1:{port}"}))
    monkeypatch.setenv("TIERED_ROOT", str(tmp_path))
    result = CliRunner().invoke(cli.cli, ["report"])
    assert result.exit_code == 1
    assert f"Prometheus at http://127.0.0.1:{port} is not answering" in result.output


@pytest.mark.parametrize(("value", "shown"), [
    (187.4, "187 ms"), (100.0, "100 ms"), (99.96, "100 ms"), (99.94, "99.9 ms"),
    (10.0, "10.0 ms"), (9.996, "10.0 ms"), (9.994, "9.99 ms"), (0.5, "0.50 ms"), (None, "—")])
def test_latencies_show_three_figures_never_an_exponent(value: float | None, shown: str) -> None:
    assert millis(value) == shown


def test_availability_shows_three_decimals_and_spans_their_unit() -> None:
    assert percent(719 / 720) == "99.861%" and percent(1.0) == "100.000%"
    assert percent(0.82, 1) == "82.0%" and percent(None) == "—"
    assert span(3599.6) == "60 minutes" and span(3600) == "1.0 hours"
    assert span(86399) == "24.0 hours" and span(86400) == "1.0 days"
