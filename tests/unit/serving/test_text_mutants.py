"""The text kind (``serving.inputs.text``) on both sides of each bound, token tensors
included: the tests that kill `make mutate`'s mutants the older tests let through."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from serving.errors import BadRequest
from serving.inputs.base import Bounds
from serving.inputs.text import TextCodec
from serving.protocol import v2
from serving.release.manifest import TensorSpec, TextInput
from tests.codecs import TOKENS, text_codec

IDS, MASK = "input_ids", "attention_mask"


def tokens(ids: list[list[int]], mask: list[list[int]] | None = None,
           datatype: str = "INT64") -> list[v2.Tensor]:
    mask = mask if mask is not None else [[1] * len(r) for r in ids]
    return [v2.binary(IDS, datatype, ids), v2.binary(MASK, "INT64", mask)]


def rows(codec: TextCodec, tensors: list[v2.Tensor], **parameters: object) -> list[list[int]]:
    return [r.tolist() for r in codec.decode(tensors, dict(parameters)).rows]


def test_token_rows_keep_the_masked_in_tokens_and_forward_as_padded_tokens() -> None:
    codec = text_codec(max_length=4)
    decoded = codec.decode(tokens([[5, 6, 7, 0], [8, 0, 0, 0]], [[1, 1, 1, 0], [1, 0, 0, 0]]),
                           {})
    assert [r.tolist() for r in decoded.rows] == [[5, 6, 7], [8]]
    ids, mask = decoded.forward([1, 0])
    assert (ids.name, ids.datatype, mask.name, mask.datatype) == (IDS, "INT64", MASK, "INT64")
    assert v2.array(ids).tolist() == [[8, 0, 0], [5, 6, 7]]
    assert v2.array(mask).tolist() == [[1, 0, 0], [1, 1, 1]]
    assert codec.cost(decoded.rows[0]) == 3


def test_token_ids_lie_in_the_vocabulary_just_inside_and_outside() -> None:
    codec = text_codec(vocab_size=1000)
    assert rows(codec, tokens([[0, 999]])) == [[0, 999]]
    for bad in (-1, 1000):
        with pytest.raises(BadRequest, match=r"'input_ids' must lie in \[0, 1000\)"):
            codec.decode(tokens([[1, bad]]), {})


def test_a_mask_holds_only_zeros_and_ones_and_a_row_needs_one_token() -> None:
    codec = text_codec()
    with pytest.raises(BadRequest, match="'attention_mask' must hold only 0 and 1"):
        codec.decode(tokens([[1, 2]], [[1, 2]]), {})
    with pytest.raises(BadRequest, match=r"row 1 has no tokens \(attention_mask all 0\)"):
        codec.decode(tokens([[1, 2], [3, 4]], [[1, 0], [0, 0]]), {})


def test_token_rows_are_bounded_by_the_sequence_length_just_inside_and_outside() -> None:
    codec = text_codec(max_length=4, max_sequence=6)
    assert rows(codec, tokens([[1, 2, 3, 4]]), truncate=False) == [[1, 2, 3, 4]]
    assert rows(codec, tokens([[1, 2, 3, 4, 5, 6]])) == [[1, 2, 3, 4]]  # truncated
    with pytest.raises(BadRequest, match=r"row 0 has 5 tokens; the model takes 4 "
                                         r"\(parameters.truncate=false\)"):
        codec.decode(tokens([[1, 2, 3, 4, 5]]), {"truncate": False})
    with pytest.raises(BadRequest, match=r"input 'input_ids': 7 tokens per row; the limit is 6 "
                                         r"\(the model takes 4, padding included\)"):
        codec.decode(tokens([[1, 2, 3, 4, 5, 6, 7]]), {})


def test_token_tensors_are_int64_of_one_shape_both_named() -> None:
    codec = text_codec(max_rows=2)
    with pytest.raises(BadRequest, match="input 'input_ids' must have datatype INT64, got INT32"):
        codec.decode(tokens([[1, 2]], datatype="INT32"), {})
    wrong_mask = [v2.binary(IDS, "INT64", [[1, 2]]), v2.binary(MASK, "INT32", [[1, 1]])]
    with pytest.raises(BadRequest, match="input 'attention_mask' must have datatype INT64"):
        codec.decode(wrong_mask, {})
    with pytest.raises(BadRequest, match=r"'input_ids' shape \[1, 2\] differs from "
                                         r"'attention_mask' shape \[1, 3\]"):
        codec.decode(tokens([[1, 2]], [[1, 1, 1]]), {})
    with pytest.raises(BadRequest, match="token input needs both 'input_ids' and "
                                         "'attention_mask'"):
        codec.decode(tokens([[1, 2]])[:1], {})
    with pytest.raises(BadRequest, match=r"unknown input 'extra': this model takes 'text' "
                                         r"\(BYTES\) or 'input_ids' \+ 'attention_mask'"):
        codec.decode([*tokens([[1, 2]]), v2.binary("extra", "INT64", [[1]])], {})
    assert len(rows(codec, tokens([[1], [2]]))) == 2
    with pytest.raises(BadRequest, match="3 rows; the limit is 2"):
        codec.decode(tokens([[1], [2], [3]]), {})


def test_texts_are_bounded_in_bytes_just_inside_and_outside_and_shaped_as_rows() -> None:
    codec = text_codec(max_text_bytes=10)
    assert len(codec.decode([v2.binary("text", "BYTES", ["é" * 5])], {}).rows) == 1  # 10 bytes
    with pytest.raises(BadRequest, match="input 'text' row 1: 11 bytes; the limit is 10"):
        codec.decode([v2.binary("text", "BYTES", ["ok", "a" * 11])], {})
    column = v2.binary("text", "BYTES", ["good", "bad"], shape=[2, 1])
    assert len(codec.decode([column], {}).rows) == 2
    with pytest.raises(BadRequest, match=r"input 'text': shape must be \[rows\] or \[rows, 1\]"):
        codec.decode([v2.binary("text", "BYTES", ["good", "bad"], shape=[1, 2])], {})
    with pytest.raises(BadRequest, match="input 'text' must have datatype BYTES, got INT64"):
        codec.decode([v2.binary("text", "INT64", [1, 2])], {})
    with pytest.raises(BadRequest, match=r"^parameters\.truncate must be a boolean$"):
        codec.decode([v2.binary("text", "BYTES", ["good"])], {"truncate": 1})


def test_a_long_text_is_truncated_unless_the_client_says_not_to() -> None:
    codec = text_codec(max_length=4)
    long, short = "a truly wonderful and moving film", "fine"
    (row,) = codec.decode([v2.binary("text", "BYTES", [long])], {}).rows
    assert len(row) == 4
    assert len(codec.decode([v2.binary("text", "BYTES", [short])], {"truncate": False}).rows) == 1
    with pytest.raises(BadRequest, match=r"text row 1 is longer than the model's 4 tokens "
                                         r"\(parameters.truncate=false\)"):
        codec.decode([v2.binary("text", "BYTES", [short, long])], {"truncate": False})


def test_items_are_the_rows_a_request_of_the_same_texts_gets() -> None:
    codec = text_codec(max_length=8)
    texts = ["a fine film", "dull"]
    asked = codec.decode([v2.binary("text", "BYTES", texts)], {}).rows
    assert [r.tolist() for r in codec.items(texts)] == [r.tolist() for r in asked]
    assert [len(r) for r in asked] == [5, 3]  # [CLS] ... [SEP]


def test_without_a_tokenizer_only_tokens_are_taken_and_described() -> None:
    bare = TextCodec(TextInput(tokenizer=None, max_length=8), TOKENS, Bounds(), Path)
    assert bare.metadata() == [{"name": IDS, "datatype": "INT64", "shape": [-1, -1]},
                               {"name": MASK, "datatype": "INT64", "shape": [-1, -1]}]
    assert bare.max_sequence == 8 and bare.vocab is None
    assert rows(bare, tokens([[70000, 3]])) == [[70000, 3]]  # no vocabulary to check against
    with pytest.raises(BadRequest, match="this model has no tokenizer: send 'input_ids' and "
                                         "'attention_mask' INT64 tensors"):
        bare.decode([v2.binary("text", "BYTES", ["good"])], {})
    with pytest.raises(ValueError, match=r"^texts need the release's tokenizer$"):
        bare.items(["good"])
    described = text_codec().metadata()
    assert described[0] == {"name": "text", "datatype": "BYTES", "shape": [-1]}
    assert described[1:] == bare.metadata()


def test_generated_rows_are_seeded_within_the_vocabulary_and_the_length() -> None:
    codec = text_codec(max_length=4)
    sample = codec.sample(50, seed=3)
    assert len(sample) == 50
    assert all(1 <= len(r) <= 4 and r.dtype == np.int64 for r in sample)
    assert {len(r) for r in sample} == {1, 2, 3, 4}
    values = np.concatenate(sample)
    assert values.min() >= 1 and values.max() < 100 and values.max() >= 90
    assert [r.tolist() for r in codec.sample(50, seed=3)] == [r.tolist() for r in sample]
    assert [r.tolist() for r in codec.sample(50, seed=4)] != [r.tolist() for r in sample]
    small = text_codec(vocab_size=10)
    ids = np.concatenate(small.sample(50))
    assert ids.max() == 9 and ids.min() == 1  # every id of the vocabulary but the padding 0
    long = text_codec(max_length=512).sample(200)
    assert max(len(r) for r in long) == 48


def test_the_tokenizers_own_length_widens_what_token_clients_may_send() -> None:
    from examples.sentiment.encoder import tokenizer_path

    codec = TextCodec(TextInput(tokenizer="tokenizer.json", max_length=4), TOKENS, Bounds(),
                      lambda _: tokenizer_path())
    assert codec.max_sequence > 4 and codec.vocab is not None and codec.vocab > 1000


def test_one_unknown_input_is_refused_naming_each_input_and_what_it_carries() -> None:
    with pytest.raises(BadRequest) as caught:
        text_codec().decode([v2.binary("words", "BYTES", ["good"])], {})
    assert str(caught.value) == ("unknown input 'words': this model takes 'text' (BYTES) or "
                                 "'input_ids' (INT64) or 'attention_mask' (INT64)")


def test_texts_go_on_to_the_center_as_the_texts_sent_under_the_input_name() -> None:
    from examples.sentiment.encoder import tokenizer_path

    codec = TextCodec(TextInput(name="review", tokenizer="tokenizer.json", max_length=16),
                      TOKENS, Bounds(), lambda _: tokenizer_path())
    decoded = codec.decode([v2.binary("review", "BYTES", ["a fine film", "dull"])], {})
    (sent,) = decoded.forward([1])
    assert (sent.name, sent.datatype) == ("review", "BYTES")
    assert v2.blobs(sent) == [b"dull"]


def test_a_text_model_with_an_input_other_than_tokens_is_refused_when_the_codec_is_made(
        ) -> None:
    model = [*TOKENS, TensorSpec("pixels", "FP32", [-1, 3])]
    with pytest.raises(ValueError, match=r"^a text model takes input_ids, attention_mask and "
                                         r"optionally token_type_ids; this one takes "):
        TextCodec(TextInput(max_length=4), model, Bounds(), Path)
