"""Human-readable tables for the registry CLI (``--json`` bypasses all of this)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgspec
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from registry.releases.reads import VersionRow
from registry.store.chain import Finding, Record
from registry.trust.anchor import SignedHead
from serving.protocol.visible import visible
from serving.release.manifest import ImageInput, Manifest, TextInput
from serving.release.signing import encode_signature

if TYPE_CHECKING:
    from registry.publish.pipeline import PublishResult


def shown(value: object) -> str:
    """A value that came from a node or a peer, for a rich table: control characters, C1
    controls and bidi marks as visible escapes (``serving.protocol.visible``), then rich's
    markup escaped."""
    return escape(visible("-" if value is None else str(value)))


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f}%"


def mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def threshold(value: float, neighbours: Sequence[float] = ()) -> str:
    """A confidence threshold with 4 decimals, or as many more (up to 12) as it takes to tell
    it apart from 0, from 1 and from ``neighbours``: 0.99996 is not "1.0000"."""
    others = [o for o in (0.0, 1.0, *neighbours) if o != value]
    for decimals in range(4, 13):
        text = f"{value:.{decimals}f}"
        if all(f"{o:.{decimals}f}" != text for o in others):
            return text
    return f"{value:.4f}"  # 1 + 1e-16 (escalate every row) is not told from 1 in 12 decimals


def ms(value: float) -> str:
    """Milliseconds with three significant digits (0.0123 ms, 1.23 ms, 123 ms)."""
    return f"{value:.3g} ms"


def version_dict(row: VersionRow, full: bool = False) -> dict[str, Any]:
    m = row.manifest
    data: dict[str, Any] = {
        "model": row.model, "version": row.version, "aliases": row.aliases,
        "published_at": row.created_at, "publisher": row.publisher,
        "manifest_sha256": row.manifest_sha256, "signing_key_id": row.key_id,
        "signature": encode_signature(row.signature) if row.signature else None,
        "threshold": m.calibration.threshold, "escalation_rate": m.calibration.escalation_rate,
        "fidelity": m.fidelity.top1_agreement,
        "fidelity_platform": msgspec.to_builtins(m.fidelity.platform)}
    if full:
        data["manifest"] = msgspec.to_builtins(m)
    return data


def publish_summary(console: Console, result: PublishResult) -> None:
    m = result.manifest
    if not result.created:
        console.print(f"{m.name}: unchanged since version {m.version} (same source files); "
                      f"nothing published")
        return
    console.print(_manifest_table(m, f"published {m.name} version {m.version}",
                                  result.edge_fp32_size))
    total = sum(result.seconds.values())
    console.print(f"took {total:.1f}s: " + ", ".join(f"{k} {v:.1f}s"
                                                      for k, v in result.seconds.items()))
    if not result.cascade:
        console.print(one_model_note(m))


def one_model_note(m: Manifest) -> str:
    """What a release from one model file is: an INT8 copy of the center at the edge, which
    rarely disagrees with it, so the calibrated cascade sends (almost) nothing to the center."""
    c = m.calibration
    if c.source == "labelled":
        figures = (f"the INT8 copy agrees with it on {pct(m.fidelity.top1_agreement)} of the "
                   f"calibration rows, so the calibrated threshold is {threshold(c.threshold)} "
                   f"and {pct(c.escalation_rate)} of rows escalate: the center stays nearly "
                   f"idle.")
    else:
        figures = (f"without --calibration the threshold is the default "
                   f"{threshold(c.threshold)}, not measured against the center.")
    return (f"One model file: the edge is an INT8 copy of the center; {figures} For a "
            f"cascade, publish a smaller edge model beside it: registry publish CENTER.pt "
            f"--edge EDGE.pt (TorchScript or fp32 ONNX) with the same options.")


def _manifest_table(m: Manifest, title: str, edge_fp32_size: int = 0) -> Table:
    c, f = m.calibration, m.fidelity
    table = Table(title=title, show_header=False)
    table.add_column(style="bold", overflow="fold")
    table.add_column(overflow="fold")
    edge = mib(m.edge.size) + (f" (fp32 {mib(edge_fp32_size)}, "
                               f"{edge_fp32_size / m.edge.size:.1f}x smaller)"
                               if edge_fp32_size else "")
    rows = [
        ("version", str(m.version)), ("labels", ", ".join(m.labels)),
        ("inputs", _inputs(m)),
        ("center (TorchScript fp32)", f"{mib(m.center.size)}  sha256 {m.center.sha256[:12]}"),
        ("edge (ONNX INT8)", f"{edge}  sha256 {m.edge.sha256[:12]}"),
        ("INT8 fidelity", f"{pct(f.top1_agreement)} top-1 agreement on {f.rows} {f.inputs} "
                          f"rows (floor {pct(f.minimum)}{', FORCED' if f.forced else ''})"),
        ("measured on", f"{f.platform.describe()}, {f.platform.runtime}" if f.platform
         else "- (published before the CPU was recorded)"),
        ("quantization", _quantization(m)),
        ("INT8 candidates", _candidates(m)),
        ("probe", f"{m.probe.size / 1024:.0f} KiB, every node checks it (publisher: "
                  f"{pct(f.probe_agreement)})" if m.probe else "none: nodes do not check"),
        ("threshold", f"{threshold(c.threshold)} ({c.source})"),
        ("escalation rate", pct(c.escalation_rate)),
        ("center accuracy", pct(c.center_accuracy)),
        ("edge INT8 accuracy", pct(c.edge_accuracy)),
        ("cascade accuracy", pct(c.cascade_accuracy)),
        ("cost per row", _cost(m)),
        ("publisher", f"{m.publisher} at {m.published_at}"),
    ]
    for key, value in rows:
        table.add_row(key, escape(value))
    return table


def _inputs(m: Manifest) -> str:
    """What clients send (the request input's kind) and what the model takes."""
    model = ", ".join(f"{i.name} {i.datatype} {i.shape}" for i in m.inputs)
    kinds = []
    for spec in m.request_inputs():
        if isinstance(spec, ImageInput):
            kinds.append(f"image: JPEG/PNG, UINT8 or FP32 -> {spec.channels}x{spec.height}x"
                         f"{spec.width} {spec.layout}")
        elif isinstance(spec, TextInput):
            what = f"text + {spec.pair} (sentence pairs)" if spec.pair else "text"
            kinds.append(f"{what}: tokenized, max {spec.max_length} tokens" if spec.tokenizer
                         else f"{what}: token tensors only")
        else:
            kinds.append(f"tensor {spec.name}")
    return f"{'; '.join(kinds)} ({model}; schema {m.schema})"


def _candidates(m: Manifest) -> str:
    """Each INT8 method tried, with its agreement; the kept one marked."""
    found = m.fidelity.candidates
    if not found:
        return "- (published before they were recorded)"
    kept = m.quantization.method if m.quantization else ""
    return ", ".join(f"{method} {pct(value)}" + (" (kept)" if method == kept else "")
                     for method, value in found.items())


def _cost(m: Manifest) -> str:
    """Each tier's cost per row, measured at publish, and how many times cheaper the edge is."""
    cost = m.cost
    if cost is None:
        return "- (not measured)"
    where = cost.platform.cpu if cost.platform and cost.platform.cpu else "the publisher's CPU"
    return (f"center TorchScript fp32 {ms(cost.center_ms)}, edge INT8 ONNX {ms(cost.edge_ms)}: "
            f"the edge {_times(cost.ratio)} (batch {cost.batch}, median of {cost.repeats}"
            f" passes over {cost.rows} rows, on {where})")


def _times(ratio: float) -> str:
    """How a row on the edge compares with one on the center: 12.3x cheaper, 1.5x dearer."""
    return f"{ratio:.1f}x cheaper" if ratio >= 1 else f"{1 / ratio:.1f}x dearer"


def _quantization(m: Manifest) -> str:
    q = m.quantization
    if q is None:
        return m.edge.precision or "-"
    return (f"{q.method} {q.weight_type}, {'per-channel' if q.per_channel else 'per-tensor'}"
            f"{', 7-bit weights (reduce_range)' if q.reduce_range else ''}")


def version_detail(console: Console, row: VersionRow) -> None:
    table = _manifest_table(row.manifest, f"{row.model} version {row.version}"
                            + (f" [{', '.join(row.aliases)}]" if row.aliases else ""))
    table.add_row("signed by", f"key {row.key_id} (Ed25519)" if row.key_id else
                  "[red]unsigned[/]")
    console.print(table)
    curve = row.manifest.calibration.curve
    if curve:
        table = Table(title="calibration curve (edge confidence < threshold -> center)")
        for col in ("threshold", "escalated", "cascade accuracy"):
            table.add_column(col, justify="right", overflow="fold")
        points = curve[:: max(1, len(curve) // 12)]
        for i, point in enumerate(points):
            near = [p.threshold for p in points[max(0, i - 1):i + 2]]
            table.add_row(threshold(point.threshold, near), pct(point.escalation_rate),
                          pct(point.cascade_accuracy))
        console.print(table)


def models_table(console: Console, models: list[dict[str, Any]]) -> None:
    if not models:
        console.print("no models yet: registry publish PATH --name NAME")
        return
    table = Table(title="models")
    for col in ("name", "versions", "latest", "production", "canary", "created"):
        table.add_column(col, overflow="fold")
    for m in models:
        table.add_row(m["name"], str(m["versions"]), str(m["latest"]),
                      str(m["production"] or ("retired" if m.get("retired") else "-")),
                      str(m["canary"] or "-"), m["created_at"])
    console.print(table)


def versions_table(console: Console, name: str, rows: list[VersionRow]) -> None:
    table = Table(title=f"{name} versions")
    for col in ("version", "aliases", "threshold", "escalation", "cascade acc", "fidelity",
                "published", "publisher"):
        table.add_column(col, overflow="fold")
    for r in rows:
        c = r.manifest.calibration
        table.add_row(str(r.version), ", ".join(r.aliases) or "-", threshold(c.threshold),
                      pct(c.escalation_rate), pct(c.cascade_accuracy),
                      pct(r.manifest.fidelity.top1_agreement), r.created_at, r.publisher)
    console.print(table)


def audit_table(console: Console, rows: list[Record]) -> None:
    table = Table(title="audit log")
    for col in ("seq", "at", "actor", "action", "model", "version", "hash"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(str(r.seq), r.at, shown(r.actor), shown(r.action), shown(r.model),
                      str(r.version or "-"), r.hash[:16])
    console.print(table)


def audit_verdict(console: Console, checked: int, finding: Finding | None,
                  head: SignedHead | None = None, problem: str | None = None,
                  nodes_seen: int = 0, rewound: str | None = None) -> None:
    if finding is None:
        console.print(f"[green]audit chain intact[/]: {checked} records verified")
    else:
        console.print(f"[red]audit chain broken at record {finding.seq}[/]: "
                      f"{shown(finding.reason)} ({checked} records before it verified)")
    if problem is not None:
        console.print(f"[red]signed head check failed[/]: {shown(problem)}")
    elif head is not None:
        console.print(f"[green]signed head holds[/]: record {head.head.seq} "
                      f"({head.head.hash[:16]}), key {head.key_id}, signed {head.at}")
    if rewound is not None:
        console.print(f"[red]nodes saw more[/]: {shown(rewound)}")
    elif nodes_seen:
        console.print(f"[green]nodes agree[/]: the highest seq a node reported is {nodes_seen}")


def _fidelity(row: dict[str, Any]) -> str:
    """The node's last probe measurement, naming the version when it is not the served one."""
    if row["fidelity"] is None:
        return "-"
    other = row["fidelity_version"] != row["version"]
    return pct(row["fidelity"]) + (f" (v{row['fidelity_version']})" if other else "")


STATUS_COLUMNS = ("node", "tier", "region", "version", "desired", "state", "last seen",
                  "escalation", "p99", "fidelity", "cpu")


def fits(renderable: RenderableType, width: int) -> bool:
    """Whether ``renderable`` fits ``width`` columns without wrapping a cell."""
    console = Console(width=100_000)  # a measurement is capped at the console's width
    return Measurement.get(console, console.options, renderable).maximum <= width


def _status_cells(r: dict[str, Any]) -> list[str]:
    online = "" if r["connected"] else " [dim](offline)[/]"
    state = {"ACTIVE": "green", "FAILED": "red"}.get(r["state"], "yellow")
    detail = f" {shown(r['reason'])}" if r["reason"] else ""
    return [shown(r["node"]) + online, shown(r["tier"]), shown(r["region"]),
            str(r["version"] or "-"), str(r["desired"] or "-"),
            f"[{state}]{shown(r['state'])}[/]{detail}", shown(r["last_seen"]),
            pct(r["escalation_rate"]) if r["tier"] == "edge" else "-",
            "-" if r["p99_ms"] is None else f"{r['p99_ms']:.1f} ms",
            _fidelity(r), shown(" ".join(r["cpu_features"]) or "-")]


def table_or_blocks(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                    width: int, lead: int = 0, empty: str = "") -> RenderableType:
    """A table when it fits ``width`` columns, else one block per row (``label  value``
    lines, column ``lead`` first and bold); values fold, never cut short with an ellipsis."""
    table = Table(title=title)
    for col in columns:
        table.add_column(col, overflow="fold")
    for cells in rows:
        table.add_row(*cells)
    if fits(table, width):
        return table
    blocks: list[RenderableType] = [Text(title, style="bold italic")]
    if not rows and empty:
        blocks.append(Text(empty))
    order = [lead, *(i for i in range(len(columns)) if i != lead)]
    for cells in rows:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        for i in order:
            cell = cells[i]
            if i == lead:
                cell = Text.from_markup(cell) if isinstance(cell, str) else cell.copy()
                cell.stylize("bold")
            grid.add_row(columns[i], cell)
        blocks += [Text(""), grid]
    return Group(*blocks)


def status_view(model: str, rows: list[dict[str, Any]], width: int) -> RenderableType:
    """The nodes of one model (see ``table_or_blocks``)."""
    return table_or_blocks(f"{model}: nodes", STATUS_COLUMNS,
                           [_status_cells(r) for r in rows], width)


CASCADE_COLUMNS = ("node", "tier", "capacity", "threshold", "budget", "escalation", "shed",
                   "audit agreement", "expected", "est. accuracy", "drift")


def _rate(value: object, digits: int = 1) -> str:
    return f"{value:.{digits}f}/s" if isinstance(value, int | float) and value else "-"


def _cascade_cells(r: dict[str, Any]) -> list[str]:
    """One node's controller and audit figures (``-`` where its tier has none)."""
    edge = r["tier"] == "edge"
    audited = edge and bool(r.get("audit_rows"))
    agreement = (f"{pct(r['audit_agreement'])} ± {pct(r['audit_interval'])} "
                 f"({r['audit_rows']} rows)" if audited else "-")
    accuracy = (f"{pct(r['estimated_accuracy'])} ± {pct(r['accuracy_interval'])}"
                if audited and r.get("estimated_accuracy") else "-")
    return [shown(r["node"]), shown(r["tier"]), _rate(r.get("capacity_rows_s")),
            threshold(r["threshold"]) if edge and r.get("threshold") is not None else "-",
            (_rate(r.get("budget_rows_s")) if r.get("budget_rows_s") else "none") if edge
            else "-",
            pct(r["escalation_rate"]) if edge else "-",
            pct(r.get("shed_rate")) if edge else "-", agreement,
            pct(r.get("audit_expected")) if audited and r.get("audit_expected") else "-",
            accuracy, _drift(r) if edge else "-"]


def _drift(r: dict[str, Any]) -> str:
    kinds = [kind for kind, key in (("agreement", "drift"), ("confidence", "confidence_drift"))
             if r.get(key)]
    psi = r.get("confidence_psi")
    seen = f" (PSI {psi:.2f})" if psi else ""
    return (f"[red]{' + '.join(kinds)}[/]" if kinds else "no") + seen


def status_tables(console: Console, rows: list[dict[str, Any]]) -> None:
    """``registry status``: the nodes of each model (see ``status_view``), then the nodes that
    lag their desired version."""
    if not rows:
        console.print("no nodes have subscribed yet (edge/center with --registry HOST:PORT)")
        return
    for model in sorted({r["model"] for r in rows}):
        console.print(status_view(shown(model), [r for r in rows if r["model"] == model],
                                  console.width))
        cascade = [r for r in rows if r["model"] == model and r.get("report_at")]
        if cascade:
            console.print(table_or_blocks(f"{model}: cascade", CASCADE_COLUMNS,
                                          [_cascade_cells(r) for r in cascade], console.width))
        lagging = [r["node"] for r in rows if r["model"] == model and r["lagging"]]
        console.print(f"{model}: " + (f"[yellow]lagging[/] {', '.join(map(shown, lagging))}"
                                      if lagging else "[green]every node runs its desired "
                                      "version[/]"))


def wave_states(rollout: dict[str, Any]) -> list[str]:
    """Each wave of a rollout (``Rollout.to_json``) as a word: passed, its state, or waiting."""
    current, state = rollout["wave"] - 1, rollout["state"]
    states = []
    for i in range(len(rollout["waves"])):
        if state == "done" or i < current:
            states.append("passed")
        elif i == current:
            states.append(state)
        else:
            states.append("-")
    return states


def rollout_view(console: Console, rollout: dict[str, Any]) -> None:
    """``registry rollout show`` and the rollouts part of ``registry status``."""
    r = rollout
    console.print(f"[bold]{shown(r['model'])}[/] version {r['version']} in waves "
                  f"(from version {r['previous'] if r['previous'] is not None else '-'}): "
                  f"[bold]{r['state']}[/] at wave {r['wave']}/{len(r['waves'])}")
    table = Table("wave", "share", "state", "nodes", "installed", "failed", "agreement new/old",
                  "drift new/old", "p99 new/old ms", box=None)
    for i, (share, state) in enumerate(zip(r["waves"], wave_states(r), strict=True)):
        f = r["figures"].get(f"wave {i + 1}", {})
        new, old = f.get("new", {}), f.get("previous", {})
        nodes = r.get("nodes", {}) if i == r["wave"] - 1 else {}
        table.add_row(str(i + 1), share, state,
                      str(f.get("nodes", nodes.get("wave", "-"))),
                      str(f.get("installed", nodes.get("installed", "-"))),
                      str(f.get("failed", nodes.get("failed", "-"))),
                      f"{_figure(new.get('agreement'))}/{_figure(old.get('agreement'))}",
                      f"{_figure(new.get('drift_share'))}/{_figure(old.get('drift_share'))}",
                      f"{_figure(new.get('p99_ms'))}/{_figure(old.get('p99_ms'))}")
    console.print(table)
    if r.get("reason"):
        console.print(f"reason: {shown(r['reason'])}")
    if r["state"] == "held":
        console.print(f"[yellow]held ({shown(r.get('held'))})[/]: the gate could not judge; "
                      f"nothing advances until a person decides:")
        console.print(f"  registry rollout resume {shown(r['model'])} --reason TEXT   "
                      f"# passes the gate, audited")
        console.print(f"  registry rollout abort {shown(r['model'])}   "
                      f"# every node back to production")


def _figure(value: object) -> str:
    return "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def trust_view(console: Console, tuf: dict[str, Any]) -> None:
    """``registry key``'s TUF summary: root version, each role's keys and threshold, what
    awaits signatures."""
    console.print(f"TUF root version {tuf['root_version']} (expires {tuf['root_expires']})")
    for role, held in tuf["roles"].items():
        version = (tuf["versions"].get(role) or {}) if role != "root" else {}
        at = f", version {version['version']} expires {version['expires']}" if version else ""
        console.print(f"  {role:<9} keys {', '.join(held['keys'])} "
                      f"(threshold {held['threshold']}){at}")
    waiting = tuf.get("awaiting_signatures")
    if waiting:
        console.print(f"  [yellow]targets version {waiting['version']} awaits signatures "
                      f"({waiting['signed']} of {waiting['threshold']}): "
                      f"{', '.join(waiting['releases'])}[/]")
