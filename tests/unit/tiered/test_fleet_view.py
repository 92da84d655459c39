"""The fleet view for every model, without a fleet: ``tiered status`` rows for each model a
node reports or should run (``missing`` where it should run one it does not report), its
``--model`` filter on both sides, and ``tiered demo --data``'s reading of a user's labelled
rows into batched V2 requests (JSON Lines texts, images and tensors, ``.npz`` arrays), with
each mistake in the file named in one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from serving.fleet.discovery import SERVICES
from tiered.demo_data import DataError, read_rows
from tiered.fleet_models import names
from tiered.views import MISSING, status_rows

TABULAR = {"name": "wine", "inputs": [{"name": "features", "datatype": "FP32",
                                       "shape": [-1, 3]}],
           "parameters": {"labels": "a,b,c", "threshold": 0.5}}
TEXT = {"name": "tiny", "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]},
                                   {"name": "input_ids", "datatype": "INT64", "shape": [-1, -1]}],
        "parameters": {"labels": "rotten,fresh"}}
IMAGE = {"name": "digits", "inputs": [{"name": "image", "datatype": "FP32",
                                       "shape": [-1, 1, 8, 8]}],
         "parameters": {"labels": "dark,bright"}}


def entry(node: str, tier: str, region: str = "eu") -> dict[str, Any]:
    return {"Service": {"ID": node, "Address": "127.0.0.1", "Port": 8200,
                        "Meta": {"tier": tier, "region": region}},
            "Checks": [{"ServiceID": node, "Status": "passing"}]}


def fleet() -> dict[str, list[dict[str, Any]]]:
    return {SERVICES["registry"]: [entry("registry-1", "")],
            SERVICES["center"]: [entry("center-1", "center", "local")],
            SERVICES["edge"]: [entry("edge-eu-1", "edge"), entry("edge-us-1", "edge", "us")]}


def reported(*pairs: tuple[str, str]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(n, m): {"version": 2, "desired": 2, "state": "ACTIVE"} for n, m in pairs}


def wants(*models: str) -> Any:
    """Every edge and center should run ``models`` at version 2."""
    return lambda node, tier, region: {m: 2 for m in models} if tier in ("edge",
                                                                         "center") else {}


def shown(rows: list[dict[str, Any]]) -> set[tuple[str, str | None, str | None]]:
    return {(r["node"], r["model"], r["state"]) for r in rows}


def test_every_model_a_node_reports_is_listed_not_only_the_demos() -> None:
    rollout = reported(*[(n, m) for n in ("center-1", "edge-eu-1", "edge-us-1")
                         for m in ("sentiment", "digits", "wine")])
    rows = status_rows(fleet(), rollout, wants("sentiment", "digits", "wine"))
    assert shown(rows) == {("registry-1", None, None)} | {
        (n, m, "ACTIVE") for n in ("center-1", "edge-eu-1", "edge-us-1")
        for m in ("digits", "sentiment", "wine")}


def test_a_model_a_node_should_run_but_does_not_report_is_missing_there() -> None:
    rollout = reported(("center-1", "wine"), ("edge-eu-1", "wine"))
    rows = status_rows(fleet(), rollout, wants("wine"))
    (us,) = [r for r in rows if r["node"] == "edge-us-1"]
    assert (us["model"], us["version"], us["desired"], us["state"]) == ("wine", None, 2, MISSING)
    assert {r["state"] for r in rows if r["node"] != "edge-us-1" and r["model"]} == {"ACTIVE"}


def test_a_model_neither_reported_nor_wanted_is_not_listed() -> None:
    """A model taken off the nodes (no longer wanted, no longer reported) is gone."""
    rows = status_rows(fleet(), reported(("center-1", "tiny")), wants())
    assert shown(rows) == {("registry-1", None, None), ("center-1", "tiny", "ACTIVE"),
                           ("edge-eu-1", None, None), ("edge-us-1", None, None)}


def test_the_model_filter_lists_the_models_named_and_no_other() -> None:
    rollout = reported(("center-1", "tiny"), ("center-1", "wine"), ("edge-eu-1", "tiny"))
    rows = status_rows(fleet(), rollout, wants("tiny"), ["wine"])
    assert shown(rows) == {("registry-1", None, None), ("center-1", "wine", "ACTIVE"),
                           ("edge-eu-1", "wine", MISSING), ("edge-us-1", "wine", MISSING)}
    both = status_rows(fleet(), rollout, wants("tiny"), ["tiny", "wine"])
    assert {(r["node"], r["model"]) for r in both if r["model"]} == {
        (n, m) for n in ("center-1", "edge-eu-1", "edge-us-1") for m in ("tiny", "wine")}


def test_model_names_come_repeated_or_comma_separated_once_each() -> None:
    assert names(["wine", "tiny,wine", " digits , ,tiny"]) == ["wine", "tiny", "digits"]
    assert names([]) == []


def lines(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def body(request: Any) -> dict[str, Any]:
    parsed: dict[str, Any] = json.loads(request.content)
    return parsed


def test_text_rows_go_in_batches_with_labels_by_name_or_index(tmp_path: Path) -> None:
    data = lines(tmp_path / "mine.jsonl", [{"text": f"review {i}", "label": i % 2 or "rotten"}
                                           for i in range(5)])
    rows = read_rows(data, TEXT)
    assert rows.labels == ["rotten", "fresh", "rotten", "fresh", "rotten"]
    requests = rows.requests(2)
    assert [r.labels for r in requests] == [["rotten", "fresh"], ["rotten", "fresh"], ["rotten"]]
    (tensor,) = body(requests[0])["inputs"]
    assert tensor == {"name": "text", "shape": [2], "datatype": "BYTES",
                      "data": ["review 0", "review 1"]}
    assert len(rows.requests(5)) == 1 and len(rows.requests(4)) == 2  # the batch bound


def test_tensor_rows_from_json_lines_and_npz_are_the_same_requests(tmp_path: Path) -> None:
    x = np.arange(12, dtype=np.float64).reshape(4, 3) / 7
    np.savez(tmp_path / "mine.npz", features=x, labels=np.array([0, 2, 1, 2]))
    from_npz = read_rows(tmp_path / "mine.npz", TABULAR)
    from_lines = read_rows(lines(tmp_path / "mine.jsonl", [
        {"features": row.tolist(), "label": "abc"[t]} for row, t in zip(x, [0, 2, 1, 2],
                                                                         strict=True)]),
        TABULAR)
    assert from_npz.labels == from_lines.labels == ["a", "c", "b", "c"]
    for a, b in zip(from_npz.requests(3), from_lines.requests(3), strict=True):
        assert a == b
    (tensor,) = body(from_npz.requests(3)[0])["inputs"]
    assert tensor["shape"] == [3, 3] and tensor["datatype"] == "FP32"
    assert tensor["data"] == x[:3].astype(np.float32).reshape(-1).tolist()


def test_image_rows_carry_the_files_bytes_in_the_binary_extension(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(b"\x89PNG-a")
    (tmp_path / "bb.png").write_bytes(b"\x89PNG-bb")
    rows = read_rows(lines(tmp_path / "mine.jsonl", [{"image": "a.png", "label": "dark"},
                                                     {"image": "bb.png", "label": 1}]), IMAGE)
    (request,) = rows.requests(8)
    assert request.header_length is not None
    head = json.loads(request.content[:request.header_length])
    assert head["inputs"][0]["shape"] == [2] and head["inputs"][0]["datatype"] == "BYTES"
    blob = request.content[request.header_length:]
    assert blob == b"\x06\x00\x00\x00\x89PNG-a\x07\x00\x00\x00\x89PNG-bb"
    assert head["inputs"][0]["parameters"]["binary_data_size"] == len(blob)
    assert request.labels == ["dark", "bright"]


@pytest.mark.parametrize(("rows", "metadata", "says"), [
    ([{"text": "fine", "label": "great"}], TEXT, "unknown label 'great'"),
    ([{"text": "fine", "label": 2}], TEXT, "unknown label 2"),  # just past the last index
    ([{"text": "fine", "label": True}], TEXT, "unknown label True"),
    ([{"text": "fine"}], TEXT, "expected {\"text\""),
    ([{"features": [1, 2], "label": "a"}], TABULAR, "shape [2]"),
    ([{"features": [1, 2, 3, 4], "label": "a"}], TABULAR, "shape [4]"),
    ([{"features": ["x", 2, 3], "label": "a"}], TABULAR, "not a FP32 row"),
    ([{"image": "gone.png", "label": "dark"}], IMAGE, "cannot read the image"),
    ([], TABULAR, "no labelled rows"),
])
def test_a_row_that_does_not_fit_the_model_is_named(tmp_path: Path, rows: list[Any],
                                                    metadata: dict[str, Any],
                                                    says: str) -> None:
    with pytest.raises(DataError) as refused:
        read_rows(lines(tmp_path / "mine.jsonl", rows), metadata)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_a_row_of_the_models_width_is_taken(tmp_path: Path) -> None:
    rows = read_rows(lines(tmp_path / "ok.jsonl", [{"features": [1, 2, 3], "label": 2}]),
                     TABULAR)
    assert rows.labels == ["c"] and rows.kind == "tensor"


@pytest.mark.parametrize(("arrays", "says"), [
    ({"feature": np.zeros((4, 3)), "labels": np.zeros(4, dtype=int)}, "'features'"),
    ({"features": np.zeros((4, 3))}, "'labels'"),
    ({"features": np.zeros((4, 4)), "labels": np.zeros(4, dtype=int)}, "shape [4, 4]"),
    ({"features": np.zeros((4, 3)), "labels": np.zeros(3, dtype=int)}, "4 rows and 3 labels"),
    ({"features": np.zeros((4, 3)), "labels": np.array([0, 1, 2, 3])}, "unknown label 3"),
])
def test_an_npz_that_does_not_fit_the_model_is_named(tmp_path: Path, arrays: dict[str, Any],
                                                     says: str) -> None:
    np.savez(tmp_path / "mine.npz", **arrays)
    with pytest.raises(DataError) as refused:
        read_rows(tmp_path / "mine.npz", TABULAR)
    assert says in str(refused.value)


def test_a_file_that_is_not_there_or_not_the_format_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        read_rows(tmp_path / "gone.jsonl", TEXT)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match=r"not an \.npz file"):
        read_rows(tmp_path / "bad.npz", TABULAR)
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:1: not JSON"):
        read_rows(tmp_path / "bad.jsonl", TEXT)
