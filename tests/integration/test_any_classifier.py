"""Any classifier, not only a two-input text model: a CNN ``forward(image)``, an encoder with
``token_type_ids`` and a tabular ``forward(features)``, each published as a user would
(``registry publish FILE --input ... --image ...``), served by a real fleet (Consul, registry,
a center, two edges, nginx), escalating their unsure rows, and answering tritonclient over
HTTP (binary) and gRPC through nginx, JPEG/PNG bytes included."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from examples.digits import build as digits_build
from examples.sentiment.encoder import tokenizer_path
from harness.processes import free_port
from tests.conftest import RegistryCli
from tests.kinds import encoder_release, tabular_release, wine
from tiered.stack import Stack

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DIGITS = ["--input", "image:FP32:-1,1,28,28", "--image", "scale=255,mean=0.1307,std=0.3081",
          "--labels", ",".join(str(i) for i in range(10))]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("kinds")
    digits = root / "digits"
    digits_build.build(digits, digits_build.DigitsConfig())
    encoder = encoder_release(root / "encoder", tiny_release / "calibration.jsonl",
                              tokenizer_path())
    table, table_data = tabular_release(root / "wine")
    return {"root": root, "digits": digits, "encoder": encoder, "wine": table,
            "wine_data": table_data}


@pytest.fixture(scope="module")
def fleet(built: dict[str, Any], tiny_release: Path) -> Iterator[Stack]:
    root: Path = built["root"]
    cli = RegistryCli(root / "registry")
    digits = built["digits"]
    cli("publish", digits / "edge.pt", "--name", "digits", *DIGITS, "--calibration",
        digits / "calibration.jsonl", timeout=300)
    cli("publish", built["encoder"], "--name", "encoder", "--tokenizer", tokenizer_path(),
        "--calibration", tiny_release / "calibration.jsonl", "--max-length", "64",
        "--labels", "rotten,fresh", timeout=300)
    cli("publish", built["wine"], "--name", "wine", "--input", "features:FP32:-1,13",
        "--calibration", built["wine_data"], "--labels", "a,b,c", timeout=300)
    stack = Stack(root / "fleet", cli.home, "kinds-token-0123456789", http_port=free_port(),
                  consul_port=free_port(), grpc_port=free_port())
    try:
        stack.up(timeout=180)
        yield stack
    finally:
        stack.stop()


def pngs(folder: Path, rows: int) -> tuple[list[bytes], list[str]]:
    lines = [json.loads(line) for line in (folder / "test.jsonl").read_text().splitlines()]
    return ([(folder / r["image"]).read_bytes() for r in lines[:rows]],
            [str(r["label"]) for r in lines[:rows]])


def pixels(data: list[bytes]) -> np.ndarray:
    return np.stack([np.asarray(Image.open(io.BytesIO(d)).convert("L")) for d in data])


def infer(stack: Stack, model: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{stack.url}/v2/models/{model}/infer", json=body, timeout=20)


def test_each_model_publishes_with_its_declared_inputs(fleet: Stack) -> None:
    for model, inputs in {"digits": [("image", "FP32", [-1, 1, 28, 28])],
                          "wine": [("features", "FP32", [-1, 13])]}.items():
        meta = httpx.get(f"{fleet.url}/v2/models/{model}", timeout=10).json()
        assert [(i["name"], i["datatype"], i["shape"]) for i in meta["inputs"]] == inputs
    meta = httpx.get(f"{fleet.url}/v2/models/encoder", timeout=10).json()
    # the encoder takes token_type_ids: clients may send it with the other token tensors
    assert [i["name"] for i in meta["inputs"]] == ["text", "input_ids", "attention_mask",
                                                   "token_type_ids"]


def test_images_as_png_bytes_uint8_and_fp32_get_the_same_answers_through_nginx(
        fleet: Stack, built: dict[str, Any]) -> None:
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    data, labels = pngs(built["digits"], 64)
    grey = pixels(data)
    floats = ((grey.astype(np.float32) / 255 - 0.1307) / 0.3081)[:, None]
    http = triton_http.InferenceServerClient(fleet.url.removeprefix("http://"))
    answers = {}
    for name, array, datatype in (("png", np.array(data, dtype=object), "BYTES"),
                                  ("uint8", grey[..., None], "UINT8"),
                                  ("fp32", floats, "FP32")):
        tensor = triton_http.InferInput("image", list(array.shape), datatype)
        tensor.set_data_from_numpy(array)  # binary, tritonclient's default
        result = http.infer("digits", [tensor])
        answers[name] = [v.decode() for v in result.as_numpy("label")]
    jpegs = []
    for image in grey:  # what a camera sends: JPEG (lossy, so answers may differ a little)
        out = io.BytesIO()
        Image.fromarray(image, "L").save(out, format="JPEG", quality=90)
        jpegs.append(out.getvalue())
    tensor = triton_http.InferInput("image", [len(jpegs)], "BYTES")
    tensor.set_data_from_numpy(np.array(jpegs, dtype=object))
    from_jpeg = [v.decode() for v in http.infer("digits", [tensor]).as_numpy("label")]
    http.close()
    assert answers["png"] == answers["uint8"] == answers["fp32"]
    for got in (answers["png"], from_jpeg):
        accuracy = np.mean([a == b for a, b in zip(got, labels, strict=True)])
        assert accuracy >= 0.9, accuracy
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{fleet.grpc_port}")
    tensor = triton_grpc.InferInput("image", [len(data)], "BYTES")
    tensor.set_data_from_numpy(np.array(data, dtype=object))
    result = client.infer("digits", [tensor])
    assert [v.decode() for v in result.as_numpy("label")] == answers["png"]
    # one file is its own center: the calibration sees nothing to gain, and escalates nothing;
    # a stricter threshold sends the unsure rows, and only those, to the center
    strict = client.infer("digits", [tensor], parameters={"threshold": 0.999})
    tiers = [v.decode() for v in strict.as_numpy("tier")]
    confidence = strict.as_numpy("confidence")
    assert "center" in tiers and "edge" in tiers
    assert all((t == "edge") == (c >= 0.999) for t, c in zip(tiers, confidence, strict=True)
               if t == "edge")
    client.close()


def test_the_encoder_and_the_tabular_model_answer_and_escalate(fleet: Stack) -> None:
    import tritonclient.grpc as triton_grpc
    import tritonclient.http as triton_http

    texts = ["a touching, funny film", "dull and far too long", "fine"]
    body = {"inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": texts}],
            "parameters": {"threshold": 1.0}}  # every row to the center
    escalated = infer(fleet, "encoder", body).json()
    assert next(o["data"] for o in escalated["outputs"] if o["name"] == "tier") == \
        ["center"] * 3
    x, y = wine()
    http = triton_http.InferenceServerClient(fleet.url.removeprefix("http://"))
    features = triton_http.InferInput("features", [len(x), 13], "FP32")
    features.set_data_from_numpy(x)
    result = http.infer("wine", [features])
    labels = [v.decode() for v in result.as_numpy("label")]
    assert np.mean([label == "abc"[t] for label, t in zip(labels, y, strict=True)]) >= 0.9
    http.close()
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{fleet.grpc_port}")
    features = triton_grpc.InferInput("features", [len(x), 13], "FP32")
    features.set_data_from_numpy(x)
    forced = client.infer("wine", [features], parameters={"threshold": 1.0})
    assert [v.decode() for v in forced.as_numpy("tier")] == ["center"] * len(x)
    assert [v.decode() for v in forced.as_numpy("label")] == labels  # same fp32 model
    client.close()


@pytest.mark.parametrize(("model", "inputs", "message"), [
    ("digits", [{"name": "image", "shape": [1], "datatype": "BYTES", "data": ["not a png"]}],
     "not a decodable JPEG or PNG"),
    ("digits", [{"name": "image", "shape": [1, 1, 28], "datatype": "FP32",
                 "data": [0.0] * 28}], "this model takes [-1, 1, 28, 28]"),
    ("digits", [{"name": "image", "shape": [1, 2], "datatype": "INT64", "data": [1, 2]}],
     "datatype INT64 is not taken"),
    ("wine", [{"name": "features", "shape": [1, 13], "datatype": "INT64",
               "data": [1] * 13}], "this model takes FP32 [-1, 13]"),
    ("wine", [{"name": "features", "shape": [1, 12], "datatype": "FP32",
               "data": [1.0] * 12}], "this model takes FP32 [-1, 13]"),
    ("wine", [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}],
     "unknown input 'text'"),
])
def test_bad_inputs_get_a_400_naming_what_the_model_takes(fleet: Stack, model: str,
                                                         inputs: list[Any],
                                                         message: str) -> None:
    answer = infer(fleet, model, {"inputs": inputs})
    assert answer.status_code == 400 and message in answer.json()["error"], answer.text


def test_a_decompression_bomb_and_nan_features_are_refused_and_the_edge_serves_on(
        fleet: Stack) -> None:
    for side, message in ((20_000, "claims more pixels than the limit"),  # 400 M pixels
                          (5_000, "5000x5000 pixels; the limit is 16777216")):  # 25 M
        bomb = io.BytesIO()
        Image.new("L", (side, side)).save(bomb, format="PNG")  # a few hundred KB
        raw = bomb.getvalue()
        head = json.dumps({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                                       "parameters": {"binary_data_size": len(raw) + 4}}]})
        answer = httpx.post(f"{fleet.url}/v2/models/digits/infer", timeout=20,
                            headers={"Inference-Header-Content-Length": str(len(head))},
                            content=head.encode() + len(raw).to_bytes(4, "little") + raw)
        assert answer.status_code == 400 and message in answer.json()["error"], answer.text
    import tritonclient.http as triton_http
    from tritonclient.utils import InferenceServerException

    x, _ = wine()
    http = triton_http.InferenceServerClient(fleet.url.removeprefix("http://"))
    features = triton_http.InferInput("features", [2, 13], "FP32")
    features.set_data_from_numpy(np.where(np.arange(13) == 3, np.nan, x[:2]).astype(np.float32))
    with pytest.raises(InferenceServerException, match="NaN or infinite"):
        http.infer("wine", [features])
    http.close()
    fine = {"inputs": [{"name": "features", "shape": [1, 13], "datatype": "FP32",
                        "data": x[0].tolist()}]}
    assert infer(fleet, "wine", fine).status_code == 200
