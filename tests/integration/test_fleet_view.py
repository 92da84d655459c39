"""The fleet view for every model, as a user who published their own model into the running
fleet sees it: ``tiered status`` lists it on every edge and center (``--model`` narrows the
view to it), and ``tiered demo --model NAME --data FILE`` sends their labelled rows (JSON Lines
texts, an ``.npz`` of features) through nginx in batches and reports the accuracy of the
served labels, the tier split and the latency; a wrong file or an unknown model is one line,
exit 2. A real fleet: Consul, ``registry serve``, a center, two edges and nginx (``Stack``)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from harness.processes import free_port
from tests.conftest import RegistryCli
from tests.kinds import tabular_release
from tiered.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]
NODES = {"center-1", "edge-eu-1", "edge-us-1"}
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> Iterator[Stack]:
    """The demo-like fleet serving ``tiny``, then the user's ``wine`` published into it while
    it runs (the registry command beside ``registry serve``, on its home)."""
    root = tmp_path_factory.mktemp("fleet-view")
    cli = RegistryCli(root / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    stack = Stack(root / "fleet", cli.home, "fleet-view-token-0123456789",
                  http_port=free_port(), consul_port=free_port())
    try:
        stack.up(timeout=180)
        model, features = tabular_release(root / "wine")
        cli("publish", model, "--name", "wine", "--input", "features:FP32:-1,13",
            "--calibration", features, "--labels", "a,b,c", timeout=300)
        yield stack
    finally:
        stack.stop()


def tiered(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """The checkout's ``tiered`` against the stack (its ``stack.json``), the demo model
    ``tiny``."""
    env = {**os.environ, "COLUMNS": "200", "TIERED_ROOT": str(stack.root),
           "TIERED_MODEL": "tiny", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tiered.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def status(stack: Stack, *args: str) -> list[dict[str, Any]]:
    shown = tiered(stack, "status", "--json", *args)
    assert shown.returncode == 0, shown.stderr
    rows: list[dict[str, Any]] = json.loads(shown.stdout)
    return rows


def active(rows: list[dict[str, Any]], model: str) -> set[str]:
    return {r["node"] for r in rows if r["model"] == model and r["state"] == "ACTIVE"}


def test_status_lists_the_users_model_on_every_node(fleet: Stack) -> None:
    deadline = time.monotonic() + 90
    while active(status(fleet), "wine") != NODES and time.monotonic() < deadline:
        time.sleep(0.5)
    rows = status(fleet)
    assert active(rows, "wine") == NODES and active(rows, "tiny") == NODES, rows
    assert {r["version"] for r in rows if r["model"] == "wine"} == {1}
    shown = tiered(fleet, "status")
    assert shown.returncode == 0, shown.stderr
    wine = [line for line in shown.stdout.splitlines() if " wine " in f" {line} "]
    assert len(wine) == len(NODES), shown.stdout  # one line per node serving it
    assert all(any(node in line for line in wine) for node in NODES), shown.stdout


def test_status_model_filter_lists_only_the_models_named(fleet: Stack) -> None:
    only = status(fleet, "--model", "wine")
    served = [r for r in only if r["model"] is not None]
    assert {r["model"] for r in served} == {"wine"}  # tiny, not named, is not listed
    assert {r["node"] for r in served} == NODES
    assert [r["model"] for r in only if r["service"] == "tiered-registry"] == [None]
    both = status(fleet, "--model", "tiny,wine")
    assert {(r["node"], r["model"]) for r in both if r["model"]} == {
        (n, m) for n in NODES for m in ("tiny", "wine")}
    assert status(fleet, "--model", "tiny", "--model", "wine") == both


def test_status_of_an_unknown_model_is_one_line(fleet: Stack) -> None:
    shown = tiered(fleet, "status", "--model", "wine,winery")
    assert shown.returncode == 2 and shown.stdout == ""
    assert len(shown.stderr.strip().splitlines()) == 1, shown.stderr
    assert "'winery'" in shown.stderr and "tiny, wine" in shown.stderr


def served_everywhere(stack: Stack, model: str, tensor: dict[str, Any]) -> list[str]:
    """Each row's label when the edge and the center answer it alike, else "": the label the
    demo is served whichever tier answers (a threshold of 0 keeps every row on the edge, 1
    sends every row to the center)."""
    labels = []
    for threshold in (0.0, 1.0):
        answer = httpx.post(f"{stack.url}/v2/models/{model}/infer", timeout=30,
                            json={"inputs": [tensor], "parameters": {"threshold": threshold}})
        assert answer.status_code == 200, answer.text
        outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
        assert set(outputs["tier"]) == {"edge" if threshold == 0 else "center"}
        labels.append(outputs["label"])
    return [e if e == c else "" for e, c in zip(*labels, strict=True)]


def check_demo(result: dict[str, Any], rows: int, batch: int, expected: float) -> None:
    assert result["sent"] == rows and result["failed"] == 0, result
    assert result["requests"] == math.ceil(rows / batch)
    assert result["accuracy"] == pytest.approx(expected, abs=1e-12)
    split = result["tier_split"]
    assert set(split) >= {"edge", "center", "edge-shed", "degraded"}
    assert sum(split.values()) == rows
    assert 0 < result["p50_ms"] <= result["p99_ms"]


def test_demo_with_a_json_lines_text_file_reports_the_served_accuracy(
        fleet: Stack, tiny_release: Path, tmp_path: Path) -> None:
    lines = [json.loads(line) for line in
             (tiny_release / "calibration.jsonl").read_text().splitlines()][:60]
    served = served_everywhere(fleet, "tiny", {"name": "text", "shape": [len(lines)],
                                               "datatype": "BYTES",
                                               "data": [r["text"] for r in lines]})
    rows = [r for r, label in zip(lines, served, strict=True) if label][:37]
    labels = [label for label in served if label][:37]
    assert len(rows) == 37
    names = httpx.get(f"{fleet.url}/v2/models/tiny", timeout=10).json()["parameters"]["labels"]
    truth = [r["label"] if isinstance(r["label"], str) else names.split(",")[r["label"]]
             for r in rows]  # by name here; the .npz test gives indices
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"text": r["text"], "label": t}) + "\n"
                            for r, t in zip(rows, truth, strict=True)))
    expected = np.mean([t == label for t, label in zip(truth, labels, strict=True)])
    assert 0 < expected < 1  # the tiny model is right on some rows only
    shown = tiered(fleet, "demo", "--model", "tiny", "--data", str(data), "--batch", "8",
                   "--json")
    assert shown.returncode == 0, shown.stderr
    check_demo(json.loads(shown.stdout), 37, 8, float(expected))


def test_demo_with_an_npz_of_features_reports_the_served_accuracy(
        fleet: Stack, tmp_path: Path) -> None:
    from tests.kinds import wine

    x, y = wine()
    pick = np.random.default_rng(3).permutation(len(x))[:50]
    served = served_everywhere(fleet, "wine", {"name": "features", "shape": [50, 13],
                                               "datatype": "FP32",
                                               "data": x[pick].reshape(-1).tolist()})
    keep = [i for i, label in zip(pick, served, strict=True) if label]
    labels = [label for label in served if label]
    truth = y[keep] - y.min()
    truth[:5] = (truth[:5] + 1) % 3  # some wrong labels, so the accuracy is not 1
    data = tmp_path / "mine.npz"
    np.savez(data, features=x[keep].astype(np.float64), labels=truth)
    expected = np.mean([("a", "b", "c")[t] == label for t, label in zip(truth, labels,
                                                                         strict=True)])
    assert 0 < expected < 1
    shown = tiered(fleet, "demo", "--model", "wine", "--data", str(data), "--batch", "16",
                   "--json")
    assert shown.returncode == 0, shown.stderr
    check_demo(json.loads(shown.stdout), len(keep), 16, float(expected))
    text = tiered(fleet, "demo", "--model", "wine", "--data", str(data), "--batch", "16")
    assert text.returncode == 0 and "answered by edge-shed" in text.stdout, text.stdout


@pytest.mark.parametrize("case", ["no such file", "a misnamed array", "an unknown model",
                                  "no data for a model without a demo", "a wrong row"])
def test_a_wrong_file_or_model_is_one_line_and_exit_2(fleet: Stack, tmp_path: Path,
                                                      case: str) -> None:
    misnamed, wrong = tmp_path / "misnamed.npz", tmp_path / "wrong.jsonl"
    np.savez(misnamed, feature=np.zeros((12, 13)), labels=np.zeros(12, dtype=np.int64))
    wrong.write_text(json.dumps({"features": [0.0] * 12, "label": "a"}) + "\n")
    args = {"no such file": ["--model", "wine", "--data", str(tmp_path / "nothing.jsonl")],
            "a misnamed array": ["--model", "wine", "--data", str(misnamed)],
            "an unknown model": ["--model", "winery", "--data", str(misnamed)],
            "no data for a model without a demo": ["--model", "wine"],
            "a wrong row": ["--model", "wine", "--data", str(wrong)]}[case]
    shown = tiered(fleet, "demo", *args)
    assert shown.returncode == 2, (shown.stdout, shown.stderr)
    assert len(shown.stderr.strip().splitlines()) == 1, shown.stderr
    assert "Traceback" not in shown.stderr and shown.stdout == ""
    hint = {"no such file": "no such file", "a misnamed array": "'features'",
            "an unknown model": "no such model", "no data for a model without a demo":
            "--data", "a wrong row": "[12]"}[case]
    assert hint in shown.stderr, shown.stderr
