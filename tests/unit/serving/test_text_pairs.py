"""Sentence pairs (``TextInput.pair``): a client sends ``text`` and ``text_pair`` and the model
gets exactly what the release's tokenizer makes of the pair (``[CLS] a [SEP] b [SEP]``, segment
ids 0 then 1, truncated longest first), or sends the three token tensors itself; the center is
sent the pair as it came in; every wrong request is refused naming what the model takes; and
a single-text release's manifest stays byte for byte what it was."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest
from tokenizers import Tokenizer

from serving.errors import BadRequest
from serving.inputs.base import Bounds
from serving.inputs.text import TextCodec
from serving.protocol import v2
from serving.release.manifest import TensorSpec, TextInput, decode, encode

IDS, MASK, TYPES = "input_ids", "attention_mask", "token_type_ids"
THREE = [TensorSpec(n, "INT64", [-1, -1]) for n in (IDS, MASK, TYPES)]
PAIRS = [("a fine film", "the acting is great"), ("dull", "far too long and quite boring")]


def tokenizer_file() -> Any:
    from examples.sentiment.encoder import tokenizer_path

    return tokenizer_path()


def codec(pair: str | None = "text_pair", max_length: int = 32, inputs: list[TensorSpec] = THREE,
          max_rows: int = 4) -> TextCodec:
    return TextCodec(TextInput(max_length=max_length, pair=pair), inputs,
                     Bounds(max_rows=max_rows), lambda _: tokenizer_file())


def texts(first: list[str], second: list[str] | None = None,
          name: str = "text_pair") -> list[v2.Tensor]:
    sent = [v2.binary("text", "BYTES", first)]
    return sent + ([v2.binary(name, "BYTES", second)] if second is not None else [])


def reference(pairs: list[tuple[str, str]], max_length: int = 32) -> dict[str, np.ndarray]:
    """The tokenizer's own pair encoding, padded to the longest row."""
    tokenizer = Tokenizer.from_file(str(tokenizer_file()))
    tokenizer.enable_truncation(max_length=max_length)  # longest_first, the library's default
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    batch = tokenizer.encode_batch(pairs)
    return {IDS: np.array([e.ids for e in batch]), MASK: np.array([e.attention_mask
                                                                  for e in batch]),
            TYPES: np.array([e.type_ids for e in batch])}


def refused(c: TextCodec, tensors: list[v2.Tensor], **parameters: Any) -> str:
    with pytest.raises(BadRequest) as caught:
        c.decode(tensors, dict(parameters))
    return str(caught.value)


def test_a_pair_feeds_the_model_the_tokenizers_own_pair_encoding_with_segment_ids() -> None:
    c = codec()
    rows = c.decode(texts([a for a, _ in PAIRS], [b for _, b in PAIRS]), {}).rows
    feeds = c.collate(rows)
    expected = reference(PAIRS)
    assert sorted(feeds) == sorted(expected)
    for name in expected:
        assert feeds[name].tolist() == expected[name].tolist(), name
    assert feeds[TYPES][0].tolist() == [0] * 5 + [1] * 5  # [CLS] a fine film [SEP] | b [SEP]
    assert feeds[IDS][0, 4] == feeds[IDS][0, 9] == 102  # [SEP] closes each segment
    assert c.cost(rows[1]) == int(expected[MASK][1].sum())


def test_the_pairs_rows_are_not_the_first_texts_alone() -> None:
    pair = codec().decode(texts(["a fine film"], ["the acting is great"]), {}).rows[0]
    alone = codec(pair=None).decode(texts(["a fine film"]), {}).rows[0]
    assert alone.shape == (2, 5) and not alone[1].any()  # one segment, type ids all 0
    assert pair.shape == (2, 10) and pair[1].sum() == 5


@pytest.mark.parametrize("max_length", [9, 10, 11])
def test_a_long_pair_is_cut_longest_first_as_the_tokenizer_cuts_it(max_length: int) -> None:
    pair = [("one two three four five six seven eight", "nine ten")]
    c = codec(max_length=max_length)
    row = c.decode(texts([pair[0][0]], [pair[0][1]]), {}).rows[0]
    assert row.tolist() == [reference(pair, max_length)[IDS][0].tolist(),
                            reference(pair, max_length)[TYPES][0].tolist()]
    assert row.shape[1] == max_length
    assert row[1].sum() == 3  # the short second text keeps "nine ten [SEP]"
    assert "longer than the model's" in refused(c, texts([pair[0][0]], [pair[0][1]]),
                                                truncate=False)
    fits = codec(max_length=13)  # [CLS] 8 words [SEP] 2 words [SEP]: 13, just inside
    assert fits.decode(texts([pair[0][0]], [pair[0][1]]), {"truncate": False}).rows[0].shape \
        == (2, 13)


def test_the_center_is_sent_the_pair_as_it_came_in_and_decodes_the_same_rows() -> None:
    c = codec()
    first, second = ["x y", "a fine film", "dull"], ["z", "the acting is great", "boring"]
    decoded = c.decode(texts(first, second), {})
    forwarded = decoded.forward([2, 0])
    assert [(t.name, t.datatype, v2.strings(t)) for t in forwarded] == [
        ("text", "BYTES", ["dull", "x y"]), ("text_pair", "BYTES", ["boring", "z"])]
    again = c.decode(forwarded, {}).rows
    assert [r.tolist() for r in again] == [decoded.rows[2].tolist(), decoded.rows[0].tolist()]


def test_token_tensors_carry_type_ids_checked_and_forwarded() -> None:
    c = codec()
    sent = reference(PAIRS)
    tensors = [v2.binary(n, "INT64", sent[n]) for n in (IDS, MASK, TYPES)]
    decoded = c.decode(tensors, {})
    assert c.collate(decoded.rows)[TYPES].tolist() == sent[TYPES].tolist()
    forwarded = {t.name: v2.array(t).tolist() for t in decoded.forward([1])}
    assert forwarded[TYPES] == [sent[TYPES][1][:int(sent[MASK][1].sum())].tolist()]
    two = c.decode(tensors[:2], {}).rows  # ids and mask only: one segment
    assert not c.collate(two)[TYPES].any()
    ones = sent[TYPES].copy()
    ones[:] = 1  # just inside: every token in segment B
    assert c.decode([*tensors[:2], v2.binary(TYPES, "INT64", ones)], {}).rows
    for bad in (2, -1):  # just outside on each side
        wrong = sent[TYPES].copy()
        wrong[0, 0] = bad
        assert refused(c, [*tensors[:2], v2.binary(TYPES, "INT64", wrong)]) == \
            "'token_type_ids' must hold only 0 and 1 (segment A, segment B)"
    assert "must have datatype INT64, got INT32" in refused(
        c, [*tensors[:2], v2.binary(TYPES, "INT32", sent[TYPES].astype(np.int32))])
    assert "differs from 'token_type_ids' shape" in refused(
        c, [*tensors[:2], v2.binary(TYPES, "INT64", sent[TYPES][:, :3])])
    assert refused(c, [tensors[2]]) == "token input needs both 'input_ids' and 'attention_mask'"
    two_inputs = codec(pair=None, inputs=THREE[:2])
    assert "unknown input 'token_type_ids'" in refused(two_inputs, tensors)


@pytest.mark.parametrize(("tensors", "message"), [
    (texts(["a"]), "this model takes sentence pairs: send 'text' and 'text_pair' (BYTES, one "
                   "'text_pair' per 'text'; 'text_pair' is missing)"),
    ([v2.binary("text_pair", "BYTES", ["a"])], "'text' is missing"),
    (texts(["a", "b"], ["c"]), "'text' has 2 rows, 'text_pair' 1: send one 'text_pair' per"),
    (texts(["a"], ["b"], name="hypothesis"), "unknown input 'hypothesis': this model takes "
                                             "'text' + 'text_pair' (BYTES, sentence pairs)"),
    ([v2.binary("text", "BYTES", ["a", "b"], shape=[1, 2])], "'text_pair' is missing"),
    (texts(["a"], ["b"]) + texts(["c"]), "send each once"),
])
def test_a_pair_release_refuses_what_is_not_a_pair(tensors: list[v2.Tensor],
                                                   message: str) -> None:
    assert message in refused(codec(), tensors)


def test_a_single_text_release_names_what_it_takes_when_sent_a_pair() -> None:
    single = codec(pair=None)
    assert refused(single, texts(["a"], ["b"])) == (
        "unknown input 'text_pair': this model takes single texts, 'text' (BYTES) or "
        "'input_ids' + 'attention_mask' [+ 'token_type_ids'] (INT64)")
    assert "this model takes single texts" in refused(
        single, [v2.binary("text", "BYTES", ["a", "b"], shape=[1, 2])])


def test_the_metadata_lists_both_texts_and_the_three_token_tensors() -> None:
    assert [(i["name"], i["datatype"]) for i in codec().metadata()] == [
        ("text", "BYTES"), ("text_pair", "BYTES"), (IDS, "INT64"), (MASK, "INT64"),
        (TYPES, "INT64")]
    assert [i["name"] for i in codec(pair=None, inputs=THREE[:2]).metadata()] == [
        "text", IDS, MASK]


def test_drift_statistics_count_both_segments_of_a_pair() -> None:
    c = codec()
    rows = c.decode(texts(["a fine film", "dull"], ["\u0b85\u0b86", "boring"]), {}).rows
    stats = c.stats(rows)
    assert stats[:, 0].tolist() == [float(r.shape[1]) for r in rows]  # tokens, both segments
    unknown = [float((r[0] == c.unknown).sum() / r.shape[1]) for r in rows]
    assert unknown[0] > 0 and stats[:, 1].tolist() == unknown


def test_calibration_pairs_become_the_rows_requests_of_the_same_pairs_get() -> None:
    c = codec()
    items = c.items([list(p) for p in PAIRS])
    decoded = c.decode(texts([a for a, _ in PAIRS], [b for _, b in PAIRS]), {}).rows
    assert [r.tolist() for r in items] == [r.tolist() for r in decoded]
    with pytest.raises(ValueError, match="every row needs 'text' and 'text_pair'"):
        c.items(["a single text"])


def test_generated_rows_have_a_second_segment_only_for_a_pair_release() -> None:
    pairs, singles = codec().sample(20, seed=3), codec(pair=None).sample(20, seed=3)
    assert all((np.diff(r[1]) >= 0).all() and r[1, 0] == 0 for r in pairs)  # A, then B
    assert all(r[1].any() for r in pairs if r.shape[1] > 1)
    assert not any(r[1].any() for r in singles)
    assert [r[0].tolist() for r in pairs] == [r[0].tolist() for r in singles]


def test_a_pair_must_be_named_apart_and_refuses_nothing_else() -> None:
    for name in ("text", IDS):
        with pytest.raises(ValueError, match="must be named apart"):
            codec(pair=name)


def test_a_single_text_manifest_is_written_as_before_and_a_pair_round_trips() -> None:
    from tests.unit.serving.test_inputs import manifest

    single = msgspec.structs.replace(manifest(2), schema=2, request=[TextInput(max_length=16)])
    raw = encode(single)
    assert b'"pair"' not in raw and decode(raw) == single
    pair = msgspec.structs.replace(single, schema=3,
                                   request=[TextInput(max_length=16, pair="text_pair")])
    raw = encode(pair)
    assert b'"pair": "text_pair"' in raw and decode(raw) == pair
