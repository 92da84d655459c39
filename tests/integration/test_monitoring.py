"""Monitoring as ``tiered up`` runs it, through the real chain: Consul -> the target renderer ->
Prometheus (the repository's rules) -> Alertmanager (the shipped receiver config, its webhook
pointed at this test) -> the webhook. A fleet of Consul, the registry, a center, two edges and
nginx serves a text model and a digits model; the tests share it in file order: every node is
scraped and a node started later appears by itself; re-encoded digits fire no drift while
rotated ones do; every dashboard panel answers; a killed center pages as edges answer
degraded. Each alert's delay from the fault is printed (``-s``)."""

from __future__ import annotations

import io
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from examples.digits import build as digits_build
from harness.monitoring import Webhook, query, receiver_config
from harness.processes import free_port
from tests.conftest import RegistryCli
from tiered.monitoring.prometheus import MONITORING
from tiered.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DIGITS = ["--input", "image:FP32:-1,1,28,28", "--image", "scale=255,mean=0.1307,std=0.3081",
          "--labels", ",".join(str(i) for i in range(10))]
DASHBOARD = MONITORING / "dashboards" / "tiered.json"
TEXTS = ["A triumph of style over substance.", "Dull, lifeless and far too long.",
         "A warm, funny and moving film.", "It is a film.", "Not bad, not good either.",
         "One of the best films this year.", "I wanted my money back.", "Meh."]


@pytest.fixture(scope="module")
def webhook() -> Iterator[Webhook]:
    hook = Webhook().start()
    yield hook
    hook.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path,
          webhook: Webhook) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("monitoring")
    digits = root / "digits"
    digits_build.build(digits, digits_build.DigitsConfig())
    cli = RegistryCli(root / "registry")
    cli("publish", tiny_release, "--name", "tiny")
    cli("publish", digits / "edge.pt", "--name", "digits", *DIGITS, "--calibration",
        digits / "calibration.jsonl", timeout=300)
    stack = Stack(root / "fleet", cli.home, "monitoring-token-0123456789",
                  http_port=free_port(), consul_port=free_port(), monitoring=True,
                  alertmanager_config=receiver_config(webhook, root / "alertmanager.yml"))
    stack.notes["digits"] = {"folder": str(digits)}
    try:
        stack.up(timeout=180)
        yield stack
    finally:
        stack.stop()


def targets(stack: Stack) -> list[dict[str, Any]]:
    return list(httpx.get(f"{stack.prometheus_url}/api/v1/targets", timeout=5)
                .json()["data"]["activeTargets"])


def wait_for(condition: Any, timeout: float, what: str, poll: float = 0.5) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        try:
            if condition():
                return time.monotonic() - started
        except (httpx.HTTPError, KeyError, IndexError):  # no answer yet, or an empty one
            pass
        time.sleep(poll)
    raise AssertionError(f"{what}: not within {timeout} s")


def up(stack: Stack) -> dict[str, float]:
    """node -> the value of its ``up`` series (the nodes Prometheus found through Consul)."""
    return {r["metric"]["node"]: float(r["value"][1])
            for r in query(str(stack.prometheus_url), "up{node!=''}")}


def test_prometheus_scrapes_every_node_from_consul_and_a_later_one_by_itself(
        fleet: Stack) -> None:
    nodes = {"center-1": "center", "edge-eu-1": "edge", "edge-us-1": "edge"}
    def every_target_up() -> dict[str, Any]:
        found = {t["labels"]["node"]: t for t in targets(fleet) if "node" in t["labels"]}
        healthy = set(nodes) <= set(found) and all(t["health"] == "up" for t in found.values())
        return found if healthy else {}

    # (a target the renderer just rewrote is "unknown" until its first scrape)
    wait_for(every_target_up, 60, "every node a target, up")
    found = every_target_up()
    for node, job in nodes.items():
        assert found[node]["labels"]["job"] == job and found[node]["health"] == "up"
    assert found["edge-eu-1"]["labels"]["region"] == "eu"
    assert found["edge-us-1"]["labels"]["region"] == "us"
    assert found["edge-eu-1"]["scrapeUrl"].startswith("https://")  # over the fleet's TLS
    (registry,) = [t for t in found.values() if t["labels"]["job"] == "registry"]
    assert registry["health"] == "up"
    # nothing in the configuration names a node: they come from the file_sd files only
    config = (fleet.root / "prometheus" / "prometheus.yml").read_text()
    assert "edge-eu-1" not in config and "file_sd_configs" in config

    started = time.monotonic()
    fleet.start_edge("edge-eu-2", "eu")
    seconds = wait_for(lambda: up(fleet).get("edge-eu-2") == 1.0, 60, "the new edge scraped")
    print(f"\nan edge started later: scraped up {seconds:.1f} s after its start")
    fleet.children["edge-eu-2"].kill_group()
    wait_for(lambda: up(fleet).get("edge-eu-2") == 0.0, 30, "the killed edge's up at 0")
    print(f"killed: up == 0 after {time.monotonic() - started - seconds:.1f} s")


def test_the_console_on_the_entry_is_never_anonymous_and_shows_the_fleet(fleet: Stack) -> None:
    console = f"{fleet.url}/console/"
    assert httpx.get(console, timeout=10).status_code == 401
    assert httpx.get(console, auth=("operator", "wrong"), timeout=10).status_code == 401
    secret = fleet.console_credential.read_text().strip()
    page = httpx.get(console, auth=("operator", secret), timeout=10)
    assert page.status_code == 200
    assert 'id="counts-digits"' in page.text and 'id="counts-tiny"' in page.text
    assert str(fleet.prometheus_url) in page.text and f"{fleet.consul}/ui" in page.text
    nodes = httpx.get(f"{console}nodes", params={"tier": "edge", "site": "us"},
                      auth=("operator", secret), timeout=10)
    assert "edge-us-1" in nodes.text and "edge-eu-1" not in nodes.text
    assert httpx.post(console, auth=("operator", secret), timeout=10).status_code == 405


def digit_images(stack: Stack, rows: int) -> list[np.ndarray]:
    folder = Path(stack.notes["digits"]["folder"])
    lines = [json.loads(line) for line in (folder / "test.jsonl").read_text().splitlines()]
    return [np.asarray(Image.open(folder / r["image"]).convert("L")) for r in lines[:rows]]


def encoded(image: np.ndarray, fmt: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image, "L").save(out, format=fmt, **({"quality": 90} if fmt == "JPEG"
                                                         else {}))
    return out.getvalue()


@contextmanager
def sending(stack: Stack, images: list[bytes], failed: list[str]) -> Iterator[None]:
    """Eight images a request through nginx, round and round, until exit."""
    stop = threading.Event()

    def send() -> None:
        import tritonclient.http as triton_http

        client = triton_http.InferenceServerClient(stack.url.removeprefix("http://"))
        i = 0
        while not stop.wait(0.05):
            batch = [images[(i + k) % len(images)] for k in range(8)]
            i += 8
            tensor = triton_http.InferInput("image", [8], "BYTES")
            tensor.set_data_from_numpy(np.array(batch, dtype=object))  # binary, as tritonclient
            try:
                client.infer("digits", [tensor])
            except Exception as exc:  # kept, and asserted on at the end
                failed.append(repr(exc)[:200])
        client.close()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


def alerts(stack: Stack, name: str) -> list[dict[str, Any]]:
    return [a for a in httpx.get(f"{stack.prometheus_url}/api/v1/alerts", timeout=5)
            .json()["data"]["alerts"] if a["labels"]["alertname"] == name]


def test_reencoded_digits_fire_no_drift_and_rotated_ones_page(fleet: Stack,
                                                               webhook: Webhook) -> None:
    # every image distinct (the edge's cache answers repeats without measuring them): the
    # drift window is the last 1,000 rows the model ran
    images = digit_images(fleet, 1000)
    failed: list[str] = []
    prometheus = str(fleet.prometheus_url)
    shift = "max(registry_node_input_shift{model='digits',tier='edge'})"
    measured = "min(registry_node_input_shift{model='digits',tier='edge'})"
    with sending(fleet, [encoded(i, "JPEG") for i in images], failed):
        # reports of a full window, then the drift alert's whole hold: nothing may fire
        wait_for(lambda: float(query(prometheus, measured)[0]["value"][1]) > 0, 120,
                 "digits measured on every edge")
        time.sleep(80)
        calm = float(query(prometheus, shift)[0]["value"][1])
        assert alerts(fleet, "TieredInputDrift") == [], calm
    print(f"\nre-encoded (JPEG q90) digits: input shift {calm:.2f}, no drift alert")
    assert 0.0 < calm < 1.0  # measured, and below the alert's bound
    started = time.monotonic()
    with sending(fleet, [encoded(np.rot90(i).copy(), "PNG") for i in images], failed):
        hit = webhook.wait("TieredInputDrift", started, 300)
    print(f"rotated digits: TieredInputDrift at the webhook after {hit.at - started:.0f} s "
          f"({hit.alert['labels']})")
    assert hit.alert["labels"].get("model") == "digits"
    assert failed == []


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """Every panel's (title, PromQL), Grafana's variables replaced by what an operator picks
    (``$__rate_interval`` and friends by 1m, a template variable by "any value")."""
    found = []
    panels = list(dashboard["panels"])
    while panels:
        panel = panels.pop()
        panels += panel.get("panels", [])
        for target in panel.get("targets", []):
            expr = re.sub(r"\$\{?__\w+\}?", "1m", target["expr"])
            found.append((panel["title"], re.sub(r"\$\{?\w+(:\w+)?\}?", ".*", expr)))
    return found


def test_every_dashboard_panel_answers_non_empty(fleet: Stack, tiny_release_b: Path) -> None:
    # a wave rollout, for the rollout panels (its gate may hold it: two edges, little audit)
    RegistryCli(fleet.registry_home)("publish", tiny_release_b, "--name", "tiny", "--waves",
                                     "50%,100%", "--wave-bake-s", "5", timeout=300)
    with httpx.Client(base_url=fleet.url, timeout=20) as client:  # text traffic for the tiny
        for i in range(60):  # model (the digits model has had its share)
            client.post("/v2/models/tiny/infer", json={"inputs": [{
                "name": "text", "shape": [4], "datatype": "BYTES",
                "data": [TEXTS[(i + k) % len(TEXTS)] for k in range(4)]}]})
    empty: list[str] = []
    exprs = expressions(json.loads(DASHBOARD.read_text()))
    assert len(exprs) >= 10

    def answered() -> bool:
        empty[:] = [f"{title}: {e}" for title, e in exprs
                    if not query(str(fleet.prometheus_url), e)]
        return not empty

    try:
        wait_for(answered, 90, "every panel answered", poll=5)
    except AssertionError:
        raise AssertionError("panels without data:\n" + "\n".join(empty)) from None


def test_a_killed_center_pages_as_the_edges_answer_degraded(fleet: Stack,
                                                            webhook: Webhook) -> None:
    fleet.children["center-1"].kill_group()
    started = time.monotonic()
    degraded = 0
    with httpx.Client(base_url=fleet.url, timeout=20) as client:
        deadline = started + 300
        while time.monotonic() < deadline and not webhook.firing("TieredCenterUnreachable"):
            answer = client.post("/v2/models/tiny/infer", json={"inputs": [{
                "name": "text", "shape": [len(TEXTS)], "datatype": "BYTES", "data": TEXTS}],
                "parameters": {"threshold": 0.99}})  # every unsure row escalates
            assert answer.status_code == 200, answer.text
            degraded += answer.json()["parameters"].get("degraded", 0)
            time.sleep(0.2)
    hit = webhook.wait("TieredCenterUnreachable", started, 1)
    print(f"\ncenter killed: TieredCenterUnreachable at the webhook after "
          f"{hit.at - started:.0f} s ({degraded} rows answered degraded meanwhile)")
    assert degraded > 0
    assert hit.alert["labels"]["layer"] in ("center", "edge")
