"""Releases published before input kinds keep serving on upgraded nodes: the tiny release is
published by the registry as it was before them (the commit before, from this repository's
history, run from a ``git archive`` of it), then pulled and served by this code's edge and
center, escalation included."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import httpx
import pytest

from harness.processes import BIN
from harness.stores import tiers

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
BEFORE = "6351096"  # main before input kinds (issue 48): its manifests have no "request"


def old_code(folder: Path) -> Path:
    """The registry package as it was at ``BEFORE``, unpacked into ``folder``."""
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", BEFORE,
                                  "registry", "serving", "sync"], capture_output=True,
                                 check=True, timeout=60).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"this checkout has no history to take the old registry from ({exc})")
    folder.mkdir()
    tar = folder / "old.tar"
    tar.write_bytes(archive)
    with tarfile.open(tar) as opened:
        opened.extractall(folder, filter="data")
    return folder


def test_a_release_published_before_input_kinds_serves_on_this_code(
        tmp_path: Path, tiny_release: Path) -> None:
    old = old_code(tmp_path / "old")
    home = tmp_path / "registry"
    env = {"PATH": str(BIN), "HOME": str(tmp_path), "PYTHONPATH": str(old),
           "REGISTRY_HOME": str(home), "REGISTRY_ACTOR": "old@publisher",
           "REGISTRY_MIN_FIDELITY": "0.9"}
    run_old = (f"import registry; assert registry.__file__.startswith({str(old)!r}); "
               f"from registry.cli.main import main; main()")  # the old code, not this one
    published = subprocess.run([sys.executable, "-c", run_old, "publish", str(tiny_release),
                                "--name", "tiny", "--json"], env=env,
                               cwd=old, capture_output=True, text=True, timeout=600)
    assert published.returncode == 0, published.stderr[-2000:]
    assert published.stdout, published.stderr[-2000:]
    manifest = json.loads(published.stdout)["manifest"]
    assert manifest["schema"] == 1 and "request" not in manifest  # written by the old code
    new = {**env, "PYTHONPATH": ""}
    for tier in ("center", "edge"):
        subprocess.run([str(BIN / "registry"), "pull", "tiny", "--tier", tier, "--store",
                        str(tmp_path / tier)], env=new, check=True, capture_output=True,
                       timeout=120)
    body = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES",
                        "data": ["a fine, touching film", "dull"]}],
            "parameters": {"threshold": 1.0}}  # every row to the center: both tiers answer
    with tiers(tmp_path, env={"PATH": str(BIN)}) as (_, edge):
        answer = httpx.post(f"{edge.url}/v2/models/tiny/infer", json=body, timeout=30)
        assert answer.status_code == 200, answer.text
        outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
        assert outputs["tier"] == ["center", "center"]
        assert answer.json()["parameters"]["center_version"] == "1"
        meta = httpx.get(f"{edge.url}/v2/models/tiny", timeout=10).json()
        assert [i["name"] for i in meta["inputs"]] == ["text", "input_ids", "attention_mask"]
