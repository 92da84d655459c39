"""The security review's image attacks against a real edge and center serving an image model:
each refused at once with 400 naming its bound, by the center too (a stolen edge escalates
what it likes), while an honest client keeps being answered; the edge leaves a warning line
and a count for each, with the access log off."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from PIL import Image

from harness.processes import TierProcess
from harness.stores import fill_stores, tiers
from tests import image_attacks as attack
from tests.kinds import image_release

pytestmark = [pytest.mark.integration, pytest.mark.slow]
MODEL = "bright"
FLAGS = ("--input", "image:FP32:-1,1,8,8", "--image", "scale=255", "--labels", "dark,bright")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TierProcess,
                                                                        TierProcess]]:
    root = tmp_path_factory.mktemp("image-guards")
    model, calibration = image_release(root / "release")
    fill_stores(root, model, MODEL, *FLAGS, "--calibration", calibration)
    with tiers(root) as pair:
        yield pair


def infer(server: TierProcess, images: list[bytes], rid: str) -> httpx.Response:
    """The images as the binary extension carries them (a JSON header, then the bytes)."""
    raw = b"".join(len(i).to_bytes(4, "little") + i for i in images)
    header = json.dumps({"inputs": [{"name": "image", "datatype": "BYTES",
                                     "shape": [len(images)],
                                     "parameters": {"binary_data_size": len(raw)}}]}).encode()
    return httpx.post(f"{server.url}/v2/models/{MODEL}/infer", content=header + raw,
                      headers={"Inference-Header-Content-Length": str(len(header)),
                               "content-type": "application/octet-stream",
                               "x-request-id": rid}, timeout=30)


def png(level: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((8, 8), level, np.uint8), "L").save(out, format="PNG")
    return out.getvalue()


ATTACKS = {"scans": attack.scan_bomb_of(256 * 1024),
           "metadata": attack.with_segments(attack.small_jpeg(), attack.com(), 200_000),
           "compressed": attack.ztxt_bomb()}


def test_attacks_are_refused_by_edge_and_center_while_an_honest_client_is_answered(
        served: tuple[TierProcess, TierProcess]) -> None:
    center, edge = served
    honest = [png(30), png(230)]
    labels = [o for o in infer(edge, honest, "honest-0").json()["outputs"]
              if o["name"] == "label"]
    assert labels[0]["data"] == ["dark", "bright"]
    stop, latencies, statuses = threading.Event(), [], []

    def honest_client() -> None:
        while not stop.is_set():
            started = time.monotonic()
            statuses.append(infer(edge, honest, "honest").status_code)
            latencies.append(time.monotonic() - started)

    client = threading.Thread(target=honest_client)
    client.start()
    try:
        for reason, data in ATTACKS.items():
            for server in (edge, center):
                started = time.monotonic()
                answer = infer(server, [data], f"attack-{reason}-{server.tier}")
                assert time.monotonic() - started < 2.0  # the review's took 9 s to 40 s
                assert answer.status_code == 400, answer.text
                assert answer.json()["error"].startswith("image row 0: ")
        for _ in range(6):  # the review's six at once
            assert infer(edge, [ATTACKS["scans"]], "attack-again").status_code == 400
    finally:
        stop.set()
        client.join()
    assert statuses and set(statuses) == {200}
    assert max(latencies) < 2.0, max(latencies)
    lines = [json.loads(line) for line in edge.log.read_text().splitlines()
             if line.startswith("{") and '"serving.telemetry.refusals"' in line]
    named = {(line["request_id"], line["reason"]) for line in lines}
    assert {(f"attack-{r}-edge", r) for r in ATTACKS} <= named
    assert all(line["level"] == "warning" and line["model"] == MODEL for line in lines)
    metrics = httpx.get(f"{edge.url}/metrics", timeout=10).text
    assert f'edge_request_refused_total{{model="{MODEL}",reason="scans"}} 7.0' in metrics
