"""What publish and ``registry show`` print beside a release: thresholds with the digits that
tell them apart (0.99996 is not "1.0000"), each INT8 candidate's agreement, each tier's cost per
row, and for a one-file release what the user got (an INT8 copy, a nearly idle center) and how
to get a cascade. Releases recorded before these figures keep their bytes."""

from __future__ import annotations

import msgspec
import pytest
from rich.console import Console

from registry.cli import tables
from registry.publish.pipeline import PublishResult
from registry.releases.reads import VersionRow
from serving.release.hardware import Platform
from serving.release.manifest import (
    Calibration,
    Cost,
    CurvePoint,
    Manifest,
    Quantization,
    decode,
    encode,
)
from tests.unit.serving.test_store import manifest as plain_manifest

COST = Cost(center_ms=2.5, edge_ms=0.1, batch=32, rows=96, repeats=3,
            platform=Platform(cpu="Intel(R) Xeon(R) Processor", machine="x86_64"))


def labelled(threshold: float, escalation: float) -> Calibration:
    return Calibration(source="labelled", threshold=threshold, escalation_rate=escalation,
                       center_accuracy=0.95, edge_accuracy=0.95, cascade_accuracy=0.95,
                       rows=200)


def release(calibration: Calibration, **fields: object) -> Manifest:
    return msgspec.structs.replace(plain_manifest(), calibration=calibration, **fields)


def printed(draw: object) -> str:
    console = Console(width=250, record=True, highlight=False)
    draw(console)  # type: ignore[operator]
    return console.export_text()


@pytest.mark.parametrize(("value", "neighbours", "text"), [
    (0.99996, [], "0.99996"),  # not "1.0000"
    (1.0, [], "1.0000"),
    (0.5, [], "0.5000"),
    (0.5, [0.50001], "0.50000"),
    (0.50001, [0.5], "0.50001"),
    (0.5, [0.5, 0.6], "0.5000"),  # an equal neighbour needs no more digits
    (0.00004, [], "0.00004"),  # not "0.0000"
    (0.0, [], "0.0000"),
    (0.9160123, [], "0.9160"),
    (1.0000000000000002, [], "1.0000"),  # escalate every row: past 12 decimals
])
def test_thresholds_print_with_the_digits_that_tell_them_apart(
        value: float, neighbours: list[float], text: str) -> None:
    assert tables.threshold(value, neighbours) == text


def test_show_and_publish_print_a_near_one_threshold_as_it_is() -> None:
    curve = [CurvePoint(0.5, 0.1, 0.9), CurvePoint(0.50001, 0.2, 0.91),
             CurvePoint(0.99996, 0.6675, 0.95)]
    m = release(msgspec.structs.replace(labelled(0.99996, 0.6675), curve=curve))
    row = VersionRow("m", 1, m, "0" * 64, "t", "now", [])
    shown = printed(lambda c: tables.version_detail(c, row))
    assert "0.99996 (labelled)" in shown and "66.75%" in shown
    assert "1.0000" not in shown
    assert "0.50000" in shown and "0.50001" in shown  # curve neighbours told apart
    listed = printed(lambda c: tables.versions_table(c, "m", [row]))
    assert "0.99996" in listed and "1.0000" not in listed


def test_each_int8_candidate_and_each_tier_cost_print_beside_the_accuracies() -> None:
    fidelity = msgspec.structs.replace(plain_manifest().fidelity,
                                       candidates={"dynamic": 0.985, "static": 0.9925})
    m = release(labelled(0.8, 0.2), fidelity=fidelity, cost=COST,
                quantization=Quantization(method="static"))
    shown = printed(lambda c: tables.publish_summary(c, PublishResult(m, True)))
    assert "dynamic 98.50%, static 99.25% (kept)" in shown
    assert ("center TorchScript fp32 2.5 ms, edge INT8 ONNX 0.1 ms: the edge 25.0x cheaper"
            in shown)
    assert "Intel(R) Xeon(R) Processor" in shown
    dearer = msgspec.structs.replace(COST, edge_ms=5.0)
    shown = printed(lambda c: tables.publish_summary(
        c, PublishResult(release(labelled(0.8, 0.2), cost=dearer), True)))
    assert "the edge 2.0x dearer" in shown
    old = printed(lambda c: tables.publish_summary(c, PublishResult(release(labelled(0.8, 0.2)),
                                                                    True)))
    assert "not measured" in old and "published before they were recorded" in old


def test_one_file_says_what_the_user_got_and_how_to_get_a_cascade() -> None:
    m = release(labelled(0.0, 0.0))
    one = printed(lambda c: tables.publish_summary(c, PublishResult(m, True, cascade=False)))
    note = " ".join(one.split())
    assert "the edge is an INT8 copy of the center" in note
    assert "threshold is 0.0000 and 0.00% of rows escalate" in note
    assert "--edge EDGE.pt" in note
    two = printed(lambda c: tables.publish_summary(c, PublishResult(m, True, cascade=True)))
    assert "INT8 copy" not in two and "--edge" not in two
    default = tables.one_model_note(release(plain_manifest().calibration))
    assert "default 0.9000" in default and "--edge" in default


def test_a_release_recorded_before_costs_and_candidates_keeps_its_bytes() -> None:
    old = plain_manifest()
    data = encode(old)
    assert b"cost" not in data and b"candidates" not in data
    assert encode(decode(data)) == data
    new = msgspec.structs.replace(old, cost=COST, fidelity=msgspec.structs.replace(
        old.fidelity, candidates={"dynamic": 1.0}))
    again = decode(encode(new))
    assert again.cost == COST and again.fidelity.candidates == {"dynamic": 1.0}
    assert again.cost is not None and again.cost.ratio == 25.0
