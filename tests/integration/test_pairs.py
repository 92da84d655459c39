"""A sentence-pair model as a user publishes one (``registry publish FILE --calibration``
with ``text``/``text_pair`` rows) and serves it: the edge and the center answer a pair exactly
as the model answers the tokenizer's own pair encoding (not the first text's alone), over HTTP
and gRPC, from texts or from the three token tensors; the rows the edge escalates are answered
by the center for their own pair; every request that is not a pair is refused with a 400."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer
from torch import Tensor, nn

from harness.processes import code_path, free_port
from tests.conftest import RegistryCli
from tests.kinds import torchscript_file
from tests.servers import Server, start

pytestmark = pytest.mark.integration
WORDS = ["cats", "dogs", "rain", "music", "trains", "coffee", "books", "rivers"]
MAX_LENGTH = 32


class PairMatch(nn.Module):
    """Scores "does the second text start with the first text's first word": read from the
    segment ids (the first token of segment B), plus a small learned-looking part of the
    token and segment embeddings so each pair gets its own probabilities."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tokens, self.segments = nn.Embedding(30522, 8), nn.Embedding(2, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                token_type_ids: Tensor) -> Tensor:
        x = self.tokens(input_ids) + self.segments(token_type_ids)
        m = attention_mask.unsqueeze(-1).to(x.dtype)
        pooled = (x * m).sum(1) / m.sum(1).clamp(min=1.0)
        first_b = input_ids.gather(1, token_type_ids.argmax(1, keepdim=True))[:, 0]
        has_b = token_type_ids.amax(1) > 0
        same = ((input_ids[:, 1] == first_b) & has_b).to(x.dtype)
        sign = 2.0 * same - 1.0  # +1: the same first word, -1: another (or no second text)
        return self.head(pooled) + 3.0 * torch.stack([-sign, sign], 1)


def pairs(count: int, seed: int) -> list[tuple[str, str, str]]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        a, b = rng.choice(WORDS, 2, replace=False)
        second = a if i % 2 else b
        out.append((f"{a} are {rng.choice(WORDS)}", f"{second} and {rng.choice(WORDS)}",
                    "same" if i % 2 else "differ"))
    return out


def tokenizer() -> Tokenizer:
    from examples.sentiment.encoder import tokenizer_path

    tok = Tokenizer.from_file(str(tokenizer_path()))
    tok.enable_truncation(max_length=MAX_LENGTH)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


def encoded(rows: list[tuple[str, str, str]], single: bool = False) -> dict[str, np.ndarray]:
    """The tokenizer's own encoding of the pairs (or of their first texts alone)."""
    batch = tokenizer().encode_batch([r[0] for r in rows] if single else
                                     [(r[0], r[1]) for r in rows])
    return {"input_ids": np.array([e.ids for e in batch]),
            "attention_mask": np.array([e.attention_mask for e in batch]),
            "token_type_ids": np.array([e.type_ids for e in batch])}


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from examples.sentiment.encoder import tokenizer_path

    root = tmp_path_factory.mktemp("pairs")
    model = PairMatch().eval()
    path = torchscript_file(model, root / "pairs.pt")
    calibration = root / "calibration.jsonl"
    calibration.write_text("".join(json.dumps({"text": a, "text_pair": b, "label": label}) +
                                   "\n" for a, b, label in pairs(40, seed=1)))
    cli = RegistryCli(root / "registry")
    published = cli("publish", path, "--name", "pairs", "--tokenizer", tokenizer_path(),
                    "--calibration", calibration, "--labels", "differ,same", "--max-length",
                    str(MAX_LENGTH), "--json", timeout=300).json()
    for tier in ("center", "edge"):
        cli("pull", "pairs", "--tier", tier, "--store", root / tier)
    ports = [free_port(), free_port()]
    center = start("center", root / "center", root, "--grpc-port", str(ports[0]),
                   env=code_path())
    edge = start("edge", root / "edge", root, "--center-url", center.url, "--grpc-port",
                 str(ports[1]), "--cache-size", "0", env=code_path())
    onnx = next((root / "edge" / "pairs").glob("*/model.onnx"))
    try:
        yield {"manifest": published["manifest"], "center": center, "edge": edge,
               "grpc": {"center": ports[0], "edge": ports[1]}, "model": model,
               "onnx": ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])}
    finally:
        edge.stop()
        center.stop()


def expected(fleet: dict[str, Any], tier: str, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """The tier's model run directly on ``feeds``."""
    if tier == "center":
        with torch.no_grad():
            logits = fleet["model"](*(torch.from_numpy(feeds[n]) for n in
                                      ("input_ids", "attention_mask", "token_type_ids")))
        return softmax(logits.numpy().astype(np.float64))
    session: ort.InferenceSession = fleet["onnx"]
    names = [i.name for i in session.get_inputs()]
    return softmax(session.run(None, {n: feeds[n] for n in names})[0].astype(np.float64))


def infer(server: Server, inputs: list[dict[str, Any]], **parameters: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/v2/models/pairs/infer", timeout=30,
                      json={"inputs": inputs, "parameters": parameters})


def text_inputs(rows: list[tuple[str, str, str]]) -> list[dict[str, Any]]:
    return [{"name": "text", "shape": [len(rows)], "datatype": "BYTES",
             "data": [r[0] for r in rows]},
            {"name": "text_pair", "shape": [len(rows)], "datatype": "BYTES",
             "data": [r[1] for r in rows]}]


def answer(response: httpx.Response) -> dict[str, list[Any]]:
    assert response.status_code == 200, response.text
    return {o["name"]: o["data"] for o in response.json()["outputs"]}


def probabilities(data: dict[str, list[Any]]) -> np.ndarray:
    return np.asarray(data["probabilities"], dtype=np.float64).reshape(-1, 2)


def test_a_pair_release_is_published_as_such_and_lists_what_it_takes(
        fleet: dict[str, Any]) -> None:
    manifest = fleet["manifest"]
    assert manifest["schema"] == 3
    assert manifest["request"] == [{"kind": "text", "name": "text",
                                    "tokenizer": "tokenizer.json", "max_length": MAX_LENGTH,
                                    "pair": "text_pair"}]
    assert manifest["calibration"]["source"] == "labelled"
    for tier in ("center", "edge"):
        meta = httpx.get(f"{fleet[tier].url}/v2/models/pairs", timeout=10).json()
        assert [(i["name"], i["datatype"]) for i in meta["inputs"]] == [
            ("text", "BYTES"), ("text_pair", "BYTES"), ("input_ids", "INT64"),
            ("attention_mask", "INT64"), ("token_type_ids", "INT64")]


@pytest.mark.parametrize("tier", ["center", "edge"])
def test_each_tier_answers_a_pair_as_its_model_answers_the_tokenizers_pair_encoding(
        fleet: dict[str, Any], tier: str) -> None:
    rows = pairs(12, seed=7)
    served = probabilities(answer(infer(fleet[tier], text_inputs(rows), threshold=0.0)))
    assert np.allclose(served, expected(fleet, tier, encoded(rows)), atol=1e-5)
    alone = expected(fleet, tier, encoded(rows, single=True))  # segment B read as segment A
    assert np.abs(served - alone).max() > 0.5
    labels = np.array([r[2] == "same" for r in rows])
    assert ((served[:, 1] > 0.5) == labels).all()  # the model's answer needs the segments
    tokens = encoded(rows)
    sent = [{"name": n, "shape": list(v.shape), "datatype": "INT64", "data": v.ravel().tolist()}
            for n, v in tokens.items()]
    from_tokens = probabilities(answer(infer(fleet[tier], sent, threshold=0.0)))
    assert np.allclose(from_tokens, served, atol=1e-6)
    one_segment = probabilities(answer(infer(fleet[tier], sent[:2], threshold=0.0)))
    zeros = {**tokens, "token_type_ids": np.zeros_like(tokens["token_type_ids"])}
    assert np.allclose(one_segment, expected(fleet, tier, zeros), atol=1e-5)


def test_grpc_clients_send_pairs_and_escalated_rows_get_the_centers_answer_for_their_pair(
        fleet: dict[str, Any]) -> None:
    import tritonclient.grpc as triton_grpc

    rows = pairs(16, seed=11)
    direct = probabilities(answer(infer(fleet["center"], text_inputs(rows))))
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{fleet['grpc']['edge']}")
    tensors = []
    for name, values in (("text", [r[0] for r in rows]), ("text_pair", [r[1] for r in rows])):
        tensor = triton_grpc.InferInput(name, [len(rows)], "BYTES")
        tensor.set_data_from_numpy(np.array(values, dtype=object))
        tensors.append(tensor)
    edge_only = client.infer("pairs", tensors, parameters={"threshold": 0.0})
    confidence = edge_only.as_numpy("confidence")
    threshold = float(np.median(confidence))  # about half the rows go to the center
    mixed = client.infer("pairs", tensors, parameters={"threshold": threshold})
    client.close()
    tiers = [t.decode() for t in mixed.as_numpy("tier")]
    got = mixed.as_numpy("probabilities").reshape(-1, 2).astype(np.float64)
    up = [i for i, t in enumerate(tiers) if t == "center"]
    assert up and len(up) < len(rows)
    assert [i for i in range(len(rows)) if confidence[i] < threshold] == up
    assert np.allclose(got[up], direct[up], atol=1e-6)  # each row's own pair, not a neighbour's
    assert np.allclose(edge_only.as_numpy("probabilities").reshape(-1, 2), expected(
        fleet, "edge", encoded(rows)), atol=1e-5)


@pytest.mark.parametrize(("inputs", "message"), [
    ([{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["cats are dogs"]}],
     "this model takes sentence pairs: send 'text' and 'text_pair'"),
    ([{"name": "text_pair", "shape": [1], "datatype": "BYTES", "data": ["cats"]}],
     "'text' is missing"),
    ([{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]},
      {"name": "text_pair", "shape": [1], "datatype": "BYTES", "data": ["c"]}],
     "'text' has 2 rows, 'text_pair' 1"),
    ([{"name": "input_ids", "shape": [1, 3], "datatype": "INT64", "data": [101, 5, 102]},
      {"name": "attention_mask", "shape": [1, 3], "datatype": "INT64", "data": [1, 1, 1]},
      {"name": "token_type_ids", "shape": [1, 3], "datatype": "INT64", "data": [0, 2, 0]}],
     "'token_type_ids' must hold only 0 and 1"),
])
@pytest.mark.parametrize("tier", ["center", "edge"])
def test_what_is_not_a_pair_gets_a_400_naming_what_the_model_takes(
        fleet: dict[str, Any], tier: str, inputs: list[dict[str, Any]], message: str) -> None:
    response = infer(fleet[tier], inputs)
    assert response.status_code == 400 and message in response.json()["error"], response.text


def test_calibration_rows_must_all_be_pairs_or_none(tmp_path: Path) -> None:
    from examples.sentiment.encoder import tokenizer_path

    path = torchscript_file(PairMatch().eval(), tmp_path / "pairs.pt")
    rows = [{"text": a, "text_pair": b, "label": label} for a, b, label in pairs(12, seed=2)]
    rows[5].pop("text_pair")  # one row of twelve without its second text
    calibration = tmp_path / "mixed.jsonl"
    calibration.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cli = RegistryCli(tmp_path / "registry")
    result = cli("publish", path, "--name", "pairs", "--tokenizer", tokenizer_path(),
                 "--calibration", calibration, "--labels", "differ,same", check=False)
    assert result.code == 2 and result.stderr.strip().splitlines() == [
        "error: the release takes sentence pairs: every calibration row needs 'text_pair' "
        "(row 6 has none)"], result.stderr
