from __future__ import annotations

import torch

from examples.sentiment import data, encoder
from examples.sentiment.bert import load_pretrained
from serving.model import torchscript
from serving.model.text import encode, load_tokenizer


def test_split_is_deterministic_disjoint_and_sized() -> None:
    rows = data.load_reviews()
    assert 12_000 < len(rows) < 13_500
    a, b = data.split(rows, seed=7), data.split(rows, seed=7)
    assert a == b
    assert (len(a.val), len(a.test)) == (2000, 2000) and len(a.train) == len(rows) - 4000
    assert not set(a.train.texts) & set(a.test.texts)
    assert not set(a.val.texts) & set(a.test.texts)
    assert set(a.train.labels) == {0, 1}
    assert data.split(rows, seed=8).test != a.test


def test_tokenizer_pads_to_the_longest_input_not_to_128() -> None:
    tokenizer = load_tokenizer(encoder.tokenizer_path(), max_length=16)
    enc = encode(tokenizer, ["good", "a rather long sentence " * 10])
    assert enc.input_ids.shape == (2, 16)  # truncated to max_length
    short = encode(tokenizer, ["good", "bad film"])
    assert short.input_ids.shape == (2, 4)  # [CLS] bad film [SEP]
    assert short.attention_mask.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]


def test_minilm_loads_and_scripts_with_identical_outputs() -> None:
    model = load_pretrained(encoder.weights_path(), num_layers=2).eval()
    enc = encode(load_tokenizer(encoder.tokenizer_path(), 32), ["a great movie", "dull"])
    ids, mask = torch.from_numpy(enc.input_ids), torch.from_numpy(enc.attention_mask)
    scripted = torchscript.script(model)
    with torch.inference_mode():
        assert torch.allclose(model(ids, mask), scripted(ids, mask), atol=1e-5)
    names = [a.name for a in scripted.forward.schema.arguments][1:]
    assert names == ["input_ids", "attention_mask"]


def test_padding_does_not_change_a_rows_logits() -> None:
    """Mean pooling and the attention mask ignore pad tokens: batching is invisible."""
    model = load_pretrained(encoder.weights_path(), num_layers=1).eval()
    tokenizer = load_tokenizer(encoder.tokenizer_path(), 32)
    alone = encode(tokenizer, ["fine"])
    batched = encode(tokenizer, ["fine", "a much longer review of a film"])
    with torch.inference_mode():
        a = model(torch.from_numpy(alone.input_ids), torch.from_numpy(alone.attention_mask))
        b = model(torch.from_numpy(batched.input_ids), torch.from_numpy(batched.attention_mask))
    assert torch.allclose(a[0], b[0], atol=1e-5)
