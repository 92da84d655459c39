"""``make demo-test``: what a newcomer gets from ``make up`` on a machine without the full demo
release, end to end with the real one. The quick release answers first; the full release is
trained behind it (~12 minutes of both cores), published and rolled out while a client keeps
sending reviews through nginx: not one request may fail. Prints the figures the README quotes
(first answer, every check passing, full release live) for this machine.

Opt-in (``--demo``): it trains the full release from scratch every run (~15-20 minutes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from harness.processes import BIN, free_port
from serving.release.hardware import cpu

pytestmark = [pytest.mark.demo, pytest.mark.integration, pytest.mark.slow]
BODY = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                    "data": ["A tedious slog."]}]}
LIVE_TIMEOUT_S = 3600


@pytest.mark.timeout(LIVE_TIMEOUT_S + 600)
def test_make_up_answers_first_then_rolls_out_the_full_release_with_no_failed_request(
        tmp_path: Path) -> None:
    root, http_port = tmp_path / "stack", free_port()
    env = {"PATH": f"{BIN}:/usr/sbin:/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "200",
           "REGISTRY_HOME": str(tmp_path / "registry"), "TIERED_ROOT": str(root),
           "TIERED_QUICK_RELEASE": str(tmp_path / "quick"),
           "TIERED_RELEASE": str(tmp_path / "full"), "TIERED_HTTP_PORT": str(http_port),
           "TIERED_GRPC_PORT": str(free_port()), "TIERED_CONSUL_PORT": str(free_port())}
    url = f"http://127.0.0.1:{http_port}/v2/models/sentiment/infer"
    started = time.monotonic()
    with (tmp_path / "up.log").open("w") as log:
        up = subprocess.Popen([str(BIN / "tiered"), "up"], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=log)
    figures: dict[str, float] = {}
    try:
        assert up.stdout is not None
        figures["first answer (s)"] = first_answer(url, up, started)
        for line in up.stdout:
            if "tiered is up" in line:
                figures["every check passing (s)"] = time.monotonic() - started
                break
        answers, versions = keep_sending(url, root, started, figures)
        assert set(answers) == {"200"}, answers  # not one failed request during the rollout
        assert versions[-1] == "2" and "1" in versions
        demo = subprocess.run([str(BIN / "tiered"), "demo", "--json"], env=env,
                              capture_output=True, text=True, timeout=600)
        assert demo.returncode == 0, demo.stderr
        result = json.loads(demo.stdout)
        assert result["by_version"]["2"]["release"] == "full"
        assert result["accuracy"] > 0.78
        figures["full release accuracy (%)"] = 100 * result["accuracy"]
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(timeout=120)
        if up.stdout is not None:
            up.stdout.close()
        name, flags = cpu()
        print(f"\n{name} ({' '.join(flags)}), {os.cpu_count()} cores")
        for name, value in figures.items():
            print(f"{name:>28}: {value:.1f}")
    assert up.returncode == 0


def first_answer(url: str, up: subprocess.Popen[str], started: float) -> float:
    while up.poll() is None:
        try:
            if httpx.post(url, json=BODY, timeout=5).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"tiered up exited with {up.returncode} before answering")


def keep_sending(url: str, root: Path, started: float,
                 figures: dict[str, float]) -> tuple[Counter[str], list[str]]:
    """One client, ~20 requests/s, until the full release is live on every node; returns the
    status codes seen and the model version of every answer."""
    answers: Counter[str] = Counter()
    versions: list[str] = []
    with httpx.Client(timeout=30) as client:
        while time.monotonic() - started < LIVE_TIMEOUT_S:
            try:
                response = client.post(url, json=BODY)
                answers[str(response.status_code)] += 1
                if response.status_code == 200:
                    version = response.json()["model_version"]
                    if not versions or versions[-1] != version:
                        versions.append(version)
            except httpx.HTTPError as exc:
                answers[type(exc).__name__] += 1
            note = json.loads((root / "stack.json").read_text()).get("notes", {}).get(
                "full release", {})
            assert note.get("state") not in ("failed", "stalled"), note
            if note.get("state") == "live":
                figures["full release live (s)"] = time.monotonic() - started
                figures["requests during training and rollout"] = sum(answers.values())
                return answers, versions
            time.sleep(0.05)
    raise AssertionError(f"the full release was not live within {LIVE_TIMEOUT_S} s")
