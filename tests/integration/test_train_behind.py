"""Serve first, train behind: a stack started on one release trains another in a child
process at low priority, publishes it and rolls it out while clients keep sending; no request
fails, ``tiered status`` follows it and ``tiered demo`` names the release that answered. (The
full demo release itself, ~12 minutes of training: ``make demo-test``.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from harness.processes import BIN, free_port
from tests.conftest import TEST_FLOOR, RegistryCli
from tiered import releases
from tiered.settings import TieredSettings
from tiered.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BODY = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                    "data": ["A triumph of style over substance."]}]}
TINY_BUILD = ("import sys; from pathlib import Path; from examples.sentiment.tiny import "
              "build_tiny_release; build_tiny_release(Path(sys.argv[1]), seed=1)")


@pytest.mark.timeout(300)
def test_the_release_trained_behind_rolls_out_live_and_no_request_fails(
        tmp_path: Path, tiny_release: Path) -> None:
    cli = RegistryCli(tmp_path / "registry")
    cli("publish", tiny_release, "--name", "tiny")  # the "quick" release the stack starts on
    stack = Stack(tmp_path / "stack", cli.home, "behind-token-0123456789",
                  http_port=free_port(), consul_port=free_port(), regions=("eu", "us"))
    s = TieredSettings(model="tiny", release=tmp_path / "full", quick_release=tiny_release,
                       registry_home=cli.home, root=stack.root)
    behind = releases.Behind(stack, s, [sys.executable, "-c", TINY_BUILD, str(s.release)],
                             publish_env={"REGISTRY_MIN_FIDELITY": str(TEST_FLOOR)})
    answers: Counter[str] = Counter()
    last: list[str] = []
    try:
        stack.up(timeout=120)
        behind.start()
        with httpx.Client(base_url=stack.url, timeout=10) as client:
            while behind.is_alive():  # one client through nginx, ~100 requests/s at most:
                # under nginx's per-client rate limit, which answers 429 past it
                time.sleep(0.01)
                response = client.post("/v2/models/tiny/infer", json=BODY)
                answers[str(response.status_code)] += 1
                if response.status_code == 200:
                    last = [*last[-19:], response.json()["model_version"]]
            behind.join()
            note = stack.notes["full release"]
            assert note["state"] == "live", note
            assert set(answers) == {"200"}, answers  # not one failed request
            assert last and set(last) == {"2"}  # the trained release answers now
            env = {**os.environ, "TIERED_ROOT": str(stack.root), "TIERED_MODEL": "tiny",
                   "TIERED_RELEASE": str(s.release), "TIERED_QUICK_RELEASE": str(tiny_release),
                   "COLUMNS": "200"}
            status = subprocess.run([str(BIN / "tiered"), "status"], env=env,
                                    capture_output=True, text=True, timeout=60)
            assert "full release: live" in status.stdout, status.stdout + status.stderr
            demo = subprocess.run([str(BIN / "tiered"), "demo", "--rows", "40", "--json"],
                                  env=env, capture_output=True, text=True, timeout=120)
            assert demo.returncode == 0, demo.stderr
            assert json.loads(demo.stdout)["by_version"]["2"]["release"] == "full"
            shown = subprocess.run([str(BIN / "tiered"), "demo", "--rows", "40"], env=env,
                                   capture_output=True, text=True, timeout=120)
            assert "release v2 (full)" in shown.stdout, shown.stdout
    finally:
        stack.stop()
    trainer = stack.children["trainer"]
    assert trainer.process.returncode == 0  # ran to its end, stopped with the stack
