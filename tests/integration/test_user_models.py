"""A user's own models published into a running ``tiered up`` stack by following
docs/models.md alone: the test runs the lines of its "Publish your model into the running fleet"
block, as written, from the clone's root (here a fresh folder standing in for it), then once
more from another folder with ``REGISTRY_HOME``. Four models as users bring them (a tabular
MLP, an RGB CNN, a Hugging Face BERT export as traced, a Hugging Face sentence-pair export),
each with a smaller edge: each is ACTIVE on every node, answers through nginx with the labels
the models give, shows a cascade (a calibrated threshold that escalates some rows and not all),
and ``registry retire`` takes one off every node while the others keep answering."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as triton

from harness.processes import BIN, free_port
from tests.conftest import TEST_FLOOR

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "models.md"
MODELS = ("tumours", "photos", "debates", "pairs")


def doc_steps() -> list[str]:
    """The commands of docs/models.md's steps block, continuation lines joined, comments cut."""
    text = DOCS.read_text(encoding="utf-8")
    block = text.split("<!-- steps:", 1)[1].split("<!-- /steps -->", 1)[0]
    body = block.split("```sh\n", 1)[1].split("```", 1)[0]
    joined = re.sub(r"\\\n\s*", "", body)
    return [line.split("  #", 1)[0].strip() for line in joined.splitlines() if line.strip()]


def run(command: str, cwd: Path, env: dict[str, str],
        timeout: float = 600) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def request(model: str, folder: Path, rows: int) -> tuple[list[Any], list[str]]:
    """tritonclient inputs (binary, as it sends them) holding the first ``rows`` calibration
    rows of ``model``, and their labels."""
    if model == "tumours":
        data = np.load(folder / "calibration.npz")
        features, labels = data["features"][:rows], data["labels"][:rows]
        tensor = triton.InferInput("features", list(features.shape), "FP32")
        tensor.set_data_from_numpy(features.astype(np.float32))
        return [tensor], [["malignant", "benign"][i] for i in labels]
    lines = [json.loads(line) for line in
             (folder / "calibration.jsonl").read_text().splitlines()[:rows]]
    columns = {"photos": ["image"], "debates": ["text"], "pairs": ["text", "text_pair"]}[model]
    inputs = []
    for name in columns:
        values = [(folder / r[name]).read_bytes() if name == "image" else r[name].encode()
                  for r in lines]
        tensor = triton.InferInput(name, [rows], "BYTES")
        tensor.set_data_from_numpy(np.array(values, dtype=object))
        inputs.append(tensor)
    return inputs, [r["label"] for r in lines]


def _client(url: str, stop: threading.Event, answers: Counter[str]) -> None:
    """One client asking ``debates`` about one statement, ~20 requests/s."""
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                        "data": ["We need to bring jobs back to this country."]}]}
    with httpx.Client(base_url=url, timeout=10) as client:
        while not stop.wait(0.05):
            try:
                response = client.post("/v2/models/debates/infer", json=body)
                answers[str(response.status_code)] += 1
            except httpx.HTTPError as exc:
                answers[type(exc).__name__] += 1


def _status(clone: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    out = subprocess.run([str(BIN / "tiered"), "status", "--json"], cwd=clone, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout))


@pytest.mark.timeout(1500)
def test_user_models_publish_into_the_running_stack_as_docs_models_md_says(
        tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    clone.mkdir()
    http_port, grpc_port, consul_port = free_port(), free_port(), free_port()
    env = {"PATH": f"{BIN}:/usr/sbin:/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "200",
           "TIERED_TRAINER": "examples.sentiment.tiny", "REGISTRY_MIN_FIDELITY": str(TEST_FLOOR),
           "TIERED_HTTP_PORT": str(http_port)}
    with (tmp_path / "up.log").open("w") as log:
        up = subprocess.Popen([str(BIN / "tiered"), "up", "--http-port", str(http_port),
                               "--grpc-port", str(grpc_port), "--consul-port",
                               str(consul_port), "--prometheus-port", "0",
                               "--alertmanager-port", "0"], env=env, cwd=clone, text=True,
                              stdout=subprocess.PIPE, stderr=log)
    url = f"http://127.0.0.1:{http_port}"
    stop, answers = threading.Event(), Counter[str]()
    client: threading.Thread | None = None
    try:
        assert up.stdout is not None
        for line in up.stdout:
            if "tiered is up" in line:
                break
        else:
            raise AssertionError(f"tiered up ended: {(tmp_path / 'up.log').read_text()[-3000:]}")
        said = [run(step, clone, env).stderr for step in doc_steps()]
        homes = [line for text in said for line in text.splitlines()
                 if line.startswith("registry home:")]
        # each publish said where it wrote: the running stack's registry, found from its root
        assert len(homes) == 4 and all(h.startswith(
            f"registry home: {clone / 'var' / 'registry'} (the running stack's") for h in homes), \
            said
        # from another folder, the stack's registry named: a fifth model, same files
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        yours = clone / "var" / "yours"
        run(f"registry publish {yours}/tumours/center.pt --edge {yours}/tumours/edge.pt "
            f"--name tumours-b --input features:FP32:-1,30 --labels malignant,benign "
            f"--calibration {yours}/tumours/calibration.npz", elsewhere,
            {**env, "REGISTRY_HOME": str(clone / "var" / "registry")})
        assert not (elsewhere / "var").exists()  # nothing created where it ran
        deadline = time.monotonic() + 180
        wanted = {*MODELS, "tumours-b"}
        while True:
            nodes = [r for r in _status(clone, env) if r["service"] != "tiered-registry"]
            active = {(r["node"], r["model"]) for r in nodes if r["state"] == "ACTIVE"}
            if all((n, m) in active for n in {r["node"] for r in nodes} for m in wanted):
                break
            assert time.monotonic() < deadline, nodes
            time.sleep(2)
        triton_client = triton.InferenceServerClient(f"127.0.0.1:{http_port}",
                                                     network_timeout=60)
        with httpx.Client(base_url=url, timeout=60) as http:
            for model in MODELS:
                inputs, labels = request(model, yours / model, 40)
                result = triton_client.infer(model, inputs)
                out = {name: [v.decode() for v in result.as_numpy(name)]
                       for name in ("label", "tier")}
                accuracy = np.mean([a == b for a, b in zip(out["label"], labels, strict=True)])
                show = json.loads(run(f"registry show {model}@production --json", clone,
                                      env).stdout)
                calibration = show["manifest"]["calibration"]
                # a cascade: the calibrated threshold escalates some rows, not all of them
                assert 0 < calibration["escalation_rate"] < 1, (model, calibration)
                assert accuracy >= calibration["cascade_accuracy"] - 0.25, (model, accuracy)
                assert set(out["tier"]) <= {"edge", "center"}, out["tier"]
            # retire one model while another keeps answering
            client = threading.Thread(target=_client, args=(url, stop, answers))
            client.start()
            run("registry retire tumours-b", clone, env)
            deadline = time.monotonic() + 120
            while any(r["model"] == "tumours-b" for r in _status(clone, env)):
                assert time.monotonic() < deadline
                time.sleep(2)
            time.sleep(2)
            stop.set()
            client.join()
            assert set(answers) == {"200"} and answers["200"] > 20, answers
            features = np.load(yours / "tumours" / "calibration.npz")["features"][:1]
            body = {"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 30],
                                "data": features.ravel().tolist()}]}
            gone = http.post("/v2/models/tumours-b/infer", json=body)
            assert gone.status_code == 404, gone.text
            assert http.post("/v2/models/tumours/infer", json=body).status_code == 200
    finally:
        stop.set()
        if client is not None and client.is_alive():
            client.join()
        up.send_signal(signal.SIGINT)
        up.wait(timeout=60)
        if up.stdout is not None:
            up.stdout.close()
    assert up.returncode == 0
