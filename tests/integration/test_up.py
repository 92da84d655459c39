"""``tiered up`` then ``tiered demo`` and ``tiered status``, as the README says to run them: from
the clone's root (here a fresh folder standing in for it), default settings, relative paths,
on a machine without the full demo release. It builds and publishes the quick release
(pretrained MiniLM, logistic heads; under a minute), serves it, trains the "full" release
behind it and rolls that out live while a client keeps sending. The full release is the tiny
one here (``TIERED_TRAINER=examples.sentiment.tiny``, seconds instead of 12 minutes of both
cores); ``make demo-test`` runs the real one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from harness.processes import BIN, free_port
from tests.conftest import TEST_FLOOR

pytestmark = [pytest.mark.integration, pytest.mark.slow]
BODY = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                    "data": ["A triumph of style over substance."]}]}


def _client(url: str, stop: threading.Event, answers: Counter[str],
            versions: list[str]) -> None:
    """One client through nginx, ~50 requests/s (under nginx's per-client rate limit)."""
    with httpx.Client(base_url=url, timeout=10) as client:
        while not stop.wait(0.02):
            try:
                response = client.post("/v2/models/sentiment/infer", json=BODY)
            except httpx.HTTPError as exc:
                answers[type(exc).__name__] += 1
                continue
            answers[str(response.status_code)] += 1
            if response.status_code == 200:
                versions[:] = [*versions[-19:], response.json()["model_version"]]


def _note(clone: Path, what: str = "full release") -> dict[str, str]:
    state = clone / "var" / "stack" / "stack.json"
    if not state.is_file():
        return {}
    return dict(json.loads(state.read_text())["notes"].get(what, {}))


@pytest.mark.timeout(600)
def test_tiered_up_from_the_clone_root_serves_quick_then_full_live(tmp_path: Path) -> None:
    """What the README says to run, relative paths and all: the release trained behind is
    published into the stack's own registry (./var/registry) and goes live on every node."""
    clone = tmp_path / "clone"
    clone.mkdir()
    http_port, grpc_port, consul_port = free_port(), free_port(), free_port()
    # the tiny release's INT8 agreement depends on the CPU: the floor every tiny-release test
    # publishes with (REGISTRY_* settings tiered runs with apply to its publishes)
    env = {"PATH": f"{BIN}:/usr/sbin:/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "200",
           "TIERED_TRAINER": "examples.sentiment.tiny", "REGISTRY_MIN_FIDELITY": str(TEST_FLOOR)}
    with (tmp_path / "up.log").open("w") as log:
        up = subprocess.Popen([str(BIN / "tiered"), "up", "--http-port", str(http_port),
                               "--grpc-port", str(grpc_port), "--consul-port",
                               str(consul_port), "--prometheus-port", "0",
                               "--alertmanager-port", "0"], env=env, cwd=clone, text=True,
                              stdout=subprocess.PIPE, stderr=log)
    stop, answers, versions = threading.Event(), Counter[str](), list[str]()
    client = threading.Thread(target=_client, args=(f"http://127.0.0.1:{http_port}", stop,
                                                    answers, versions))
    try:
        assert up.stdout is not None
        for line in up.stdout:
            if "tiered is up" in line:
                break
        else:
            raise AssertionError(f"tiered up ended: {(tmp_path / 'up.log').read_text()[-3000:]}")
        state = json.loads((clone / "var" / "stack" / "stack.json").read_text())
        client.start()
        deadline = time.monotonic() + 300
        while _note(clone).get("state") not in ("live", "failed", "stalled"):
            assert time.monotonic() < deadline, _note(clone)
            time.sleep(1)
        assert _note(clone)["state"] == "live", _note(clone)
        time.sleep(2)  # the client sees the full release answer
        stop.set()
        client.join()
        assert set(answers) == {"200"}, answers  # not one failed request throughout
        assert set(versions) == {"2"}, versions  # the full release answers now
        # one registry, where the README says: nothing published from the stack's folder
        assert (clone / "var" / "registry" / "registry.sqlite3").is_file()
        assert not (clone / "var" / "stack" / "var").exists()
        status = subprocess.run([str(BIN / "tiered"), "status"], env=env, cwd=clone,
                                capture_output=True, text=True, timeout=60)
        assert "full release: live" in status.stdout, status.stdout + status.stderr
        while _note(clone, "digits release").get("state") not in ("live", "failed", "stalled"):
            assert time.monotonic() < deadline, _note(clone, "digits release")
            time.sleep(1)
        assert _note(clone, "digits release")["state"] == "live"  # the image demo, beside
        images = subprocess.run([str(BIN / "tiered"), "demo", "--model", "digits", "--rows",
                                 "200", "--json"], env=env, cwd=clone, capture_output=True,
                                text=True, timeout=300)
        assert images.returncode == 0, images.stderr
        result = json.loads(images.stdout)
        assert result["failed"] == 0 and result["accuracy"] > 0.9, result
        assert set(result["rows_by_tier"]) == {"edge", "center"}, result  # unsure rows escalate
        demo = subprocess.run([str(BIN / "tiered"), "demo", "--rows", "200", "--json"],
                              env=env, cwd=clone, capture_output=True, text=True, timeout=300)
        assert demo.returncode == 0, demo.stderr
        result = json.loads(demo.stdout)
        assert result["failed"] == 0
        assert set(result["by_version"]) == {"2"}
        assert result["by_version"]["2"]["release"] == "full"
        assert set(result["by_node"]) == {"edge-eu-1", "edge-us-1"}
        status = subprocess.run([str(BIN / "tiered"), "status", "--json"], env=env, cwd=clone,
                                capture_output=True, text=True, timeout=60)
        rows = json.loads(status.stdout)
        assert {r["health"] for r in rows} == {"passing"} and len(rows) == 1 + 3 * 2
        assert {(r["model"], r["state"]) for r in rows if r["service"] != "tiered-registry"} \
            == {("sentiment", "ACTIVE"), ("digits", "ACTIVE")}  # both models on every node
        # Prometheus found every node through Consul (none written by hand) and scrapes it
        targets = httpx.get(f"{state['prometheus']}/api/v1/targets", timeout=5).json()
        health = {t["labels"].get("node", t["labels"]["job"]): t["health"]
                  for t in targets["data"]["activeTargets"]}
        assert {n for n, c in state["children"].items() if c["role"] in ("center", "edge")} \
            <= set(health), health
        assert set(health.values()) == {"up"}, health
        assert httpx.get(f"{state['alertmanager']}/-/ready", timeout=5).status_code == 200
    finally:
        stop.set()
        if client.is_alive():
            client.join()
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
        assert up.stdout is not None
        up.stdout.close()
    assert up.returncode == 0
    for child in state["children"].values():  # every child stopped, by PID
        with pytest.raises(ProcessLookupError):
            os.kill(child["pid"], 0)
