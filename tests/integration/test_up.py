"""``tiered up`` then ``tiered demo`` and ``tiered status``, as the README says to run them, on a
machine without the full demo release: it builds and publishes the quick release (pretrained
MiniLM, logistic heads; under a minute) and serves it. Training the full release behind it is
off here (``TIERED_TRAIN_BEHIND=false``: 12 minutes of both cores); that flow is in
``test_train_behind.py`` with a tiny stand-in, and in ``make demo-test`` with the real one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from harness.processes import BIN, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.timeout(600)
def test_tiered_up_then_tiered_demo(tmp_path: Path) -> None:
    """What the README says to run, on the quick release (built on first use)."""
    root, http_port, consul_port = tmp_path / "stack", free_port(), free_port()
    env = {"PATH": f"{BIN}:/usr/sbin:/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "200",
           "REGISTRY_HOME": str(tmp_path / "registry"), "TIERED_ROOT": str(root),
           "TIERED_QUICK_RELEASE": str(tmp_path / "quick"),
           "TIERED_RELEASE": str(tmp_path / "full"), "TIERED_TRAIN_BEHIND": "false"}
    with (tmp_path / "up.log").open("w") as log:
        up = subprocess.Popen([str(BIN / "tiered"), "up", "--http-port", str(http_port),
                               "--consul-port", str(consul_port)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=log)
    try:
        assert up.stdout is not None
        for line in up.stdout:
            if "tiered is up" in line:
                break
        else:
            raise AssertionError(f"tiered up ended: {(tmp_path / 'up.log').read_text()[-3000:]}")
        state = json.loads((root / "stack.json").read_text())
        demo = subprocess.run([str(BIN / "tiered"), "demo", "--rows", "400", "--json"],
                              env=env, capture_output=True, text=True, timeout=300)
        assert demo.returncode == 0, demo.stderr
        result = json.loads(demo.stdout)
        assert result["failed"] == 0 and result["accuracy"] > 0.7  # the quick release: ~76%
        assert result["by_version"]["1"]["release"] == "quick"
        assert set(result["by_node"]) == {"edge-eu-1", "edge-us-1"}
        # a weak edge: the center answers most rows, the edge the ones it is sure of
        assert result["rows_by_tier"]["center"] > 0 and result["rows_by_tier"]["edge"] > 0
        status = subprocess.run([str(BIN / "tiered"), "status", "--json"], env=env,
                                capture_output=True, text=True, timeout=60)
        rows = json.loads(status.stdout)
        assert {r["health"] for r in rows} == {"passing"} and len(rows) == 4
        assert {r["state"] for r in rows if r["service"] != "tiered-registry"} == {"ACTIVE"}
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
        assert up.stdout is not None
        up.stdout.close()
    assert up.returncode == 0
    for child in state["children"].values():  # every child stopped, by PID
        with pytest.raises(ProcessLookupError):
            os.kill(child["pid"], 0)
