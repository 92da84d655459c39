"""``tiered report``: the figures of the last ``--since`` from the stack's Prometheus (or
``--prometheus``) as markdown and a PNG plot, or as JSON."""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import click
import httpx
from pydantic import ValidationError

from tiered.report import figures, markdown, plot
from tiered.report.query import Prometheus, PrometheusError, parse_duration
from tiered.report.window import window
from tiered.running import load_state
from tiered.settings import TieredSettings

PLOT = "tiered-report.png"  # the plot's name in the current folder without --out


def duration(ctx: click.Context, param: click.Parameter, value: str) -> tuple[str, float]:
    try:
        return value, parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def moment(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """Unix seconds, or an RFC 3339 time with its zone (``2024-06-01T00:00:00Z``)."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r}: Unix seconds or RFC 3339 "
                                 f"(2024-06-01T00:00:00Z)") from exc
    if parsed.tzinfo is None:
        raise click.BadParameter(f"{value!r} has no time zone (add Z for UTC)")
    return parsed.timestamp()


def stack_prometheus() -> str:
    """The running stack's Prometheus (``prometheus`` in its ``stack.json``)."""
    try:
        root = TieredSettings().root
    except ValidationError as exc:
        raise click.UsageError(f"invalid settings: {exc}") from exc
    url = (load_state(root) or {}).get("prometheus")
    if not url:
        raise click.UsageError(f"no running stack's Prometheus in {root / 'stack.json'} "
                               f"(tiered up writes it): pass --prometheus URL")
    return str(url) if "://" in str(url) else f"http://{url}"


@click.command("report")
@click.option("--prometheus", "url", default=None, metavar="URL",
              help="Prometheus to read (default: the running stack's, from its stack.json).")
@click.option("--since", default="30d", show_default=True, callback=duration,
              help="The window: a Prometheus duration (90m, 6h, 30d, 1d12h), at least 1m.")
@click.option("--until", default=None, callback=moment, metavar="TIME",
              help="The window's end: Unix seconds or RFC 3339 (default: now).")
@click.option("--out", "folder", default=None, type=click.Path(path_type=Path, file_okay=False),
              help="Write report.md and report.png into this folder (made if missing) "
                   f"instead of printing the markdown and writing ./{PLOT}.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the figures as JSON; write no file unless --out is given.")
def report_cmd(url: str | None, since: tuple[str, float], until: float | None,
               folder: Path | None, as_json: bool) -> None:
    """Availability per tier (scrapes up, requests answered), p50/p99/mean latency, requests
    and rows, the edge share and the center rows avoided, per release too, over the last
    --since, from Prometheus's own data; markdown and a PNG plot."""
    prom = Prometheus(url or stack_prometheus(), httpx.Client(timeout=60))
    try:
        w = window(prom, since[0], since[1], time.time() if until is None else until)
        report = figures.gather(prom, w)
        points = plot.series(prom, w) if folder or not as_json else None
    except PrometheusError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        prom.client.close()
    title = f"Tiered: the last {w.since} to {markdown.when(w.end)}"
    if folder:
        folder.mkdir(parents=True, exist_ok=True)
        assert points is not None
        plot.draw(points, title, folder / "report.png")
        (folder / "report.md").write_text(markdown.render(report, "report.png"))
        if as_json:
            (folder / "report.json").write_text(json.dumps(to_json(report), indent=2) + "\n")
    if as_json:
        click.echo(json.dumps(to_json(report), indent=2))
    elif folder:
        click.echo(f"wrote {folder / 'report.md'} and {folder / 'report.png'}", err=True)
    else:
        assert points is not None
        plot.draw(points, title, Path(PLOT))
        click.echo(markdown.render(report, PLOT), nl=False)


def to_json(report: figures.Report) -> dict[str, Any]:
    data = dataclasses.asdict(report)
    w = report.window
    data["window"] |= {"seconds": w.seconds, "covered_seconds": w.covered,
                       "start_utc": markdown.when(w.start), "end_utc": markdown.when(w.end),
                       "first_sample_utc": markdown.when(w.first_sample)}
    return data
