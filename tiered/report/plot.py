"""The report's PNG: requests/s and p99 per tier and the edge share over the window (about
200 points each, from ``/api/v1/query_range``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from tiered.report.figures import SERVING
from tiered.report.query import Prometheus, promql_duration
from tiered.report.window import Window

POINTS = 200
SHORTEST_RATE = 60.0  # a rate over less than a minute holds too few scrapes (15 s apart)
Points = list[tuple[float, float]]


@dataclass(frozen=True)
class Plot:
    requests: dict[str, Points]  # per tier, requests per second
    p99_ms: dict[str, Points]
    edge_share: Points  # 0..1
    step: float


def step_of(w: Window) -> float:
    """Seconds between points: the covered window over ``POINTS``, at least a second."""
    return max(w.covered / POINTS, 1.0)


def series(prom: Prometheus, w: Window) -> Plot:
    step = step_of(w)
    r = promql_duration(max(step, SHORTEST_RATE))
    start = max(w.start, w.first_sample)

    def line(query: str, scale: float = 1.0) -> Points:
        found = prom.range(query, start, w.end, step)
        return [(t, v * scale) for t, v in found[0][1] if v == v] if found else []

    requests = {t: line(f'sum(rate({{__name__=~"{t}_request_(success|failure)_total"}}[{r}]))')
                for t in SERVING}
    p99 = {t: line(f"histogram_quantile(0.99, sum by (le) (rate("
                   f"{t}_request_duration_seconds_bucket[{r}])))", 1000.0) for t in SERVING}
    share = line(f'sum(rate(edge_rows_total{{tier="edge"}}[{r}])) / '
                 f"sum(rate(edge_rows_total[{r}]))")
    return Plot(requests, p99, share, step)


def draw(plot: Plot, title: str, path: Path) -> Path:
    """The three panels, one above the other, into ``path`` (PNG). matplotlib is imported here:
    only a report that draws pays for it."""
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 7.5), dpi=100, layout="constrained")
    top, middle, bottom = figure.subplots(3, 1, sharex=True)
    for axes, lines, label in ((top, plot.requests, "requests/s"),
                               (middle, plot.p99_ms, "p99 (ms)")):
        for tier, points in lines.items():
            if points:
                axes.plot(*dates(points), label=tier)
        axes.set_ylabel(label)
        axes.set_ylim(bottom=0)
        axes.grid(alpha=0.3)
        if any(lines.values()):
            axes.legend(loc="upper left")
    if plot.edge_share:
        times, shares = dates(plot.edge_share)
        bottom.plot(times, [s * 100 for s in shares], color="tab:green")
    bottom.set_ylabel("edge share (%)")
    bottom.set_ylim(0, 100)
    bottom.grid(alpha=0.3)
    locator = AutoDateLocator()
    bottom.xaxis.set_major_locator(locator)
    bottom.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    top.set_title(title)
    figure.savefig(path, format="png")
    return path


def dates(points: Points) -> tuple[list[datetime], list[float]]:
    return ([datetime.fromtimestamp(t, UTC) for t, _ in points], [v for _, v in points])
