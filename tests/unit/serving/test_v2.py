from __future__ import annotations

import json

import pytest

from serving import v2
from serving.errors import BadRequest

LIMITS = v2.Limits(max_rows=4, max_text_bytes=50, max_length=4, vocab_size=1000)


def body(**request: object) -> bytes:
    return json.dumps(request).encode()


def text(data: list[object], shape: list[int] | None = None, **extra: object) -> bytes:
    return body(inputs=[{"name": "text", "datatype": "BYTES",
                         "shape": shape or [len(data)], "data": data}], **extra)


def tensors(ids: object, mask: object, shape: list[int], **extra: object) -> bytes:
    return body(inputs=[
        {"name": "input_ids", "datatype": "INT64", "shape": shape, "data": ids},
        {"name": "attention_mask", "datatype": "INT64", "shape": shape, "data": mask}], **extra)


def test_text_and_tensor_requests_parse() -> None:
    parsed = v2.parse(text(["a", "b"], id="r1", outputs=[{"name": "label"}]), LIMITS)
    assert parsed.texts == ["a", "b"] and parsed.id == "r1" and parsed.outputs == ["label"]
    assert v2.parse(text([["a"], ["b"]], [2, 1]), LIMITS).texts == ["a", "b"]
    parsed = v2.parse(tensors([[5, 6, 0]], [[1, 1, 0]], [1, 3]), LIMITS)
    assert parsed.token_rows is not None and parsed.token_rows[0].tolist() == [5, 6]
    long = v2.parse(tensors([1, 2, 3, 4, 5, 6], [1] * 6, [1, 6]), LIMITS)
    assert long.token_rows is not None and long.token_rows[0].tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize(("raw", "message"), [
    (b"{", "malformed JSON"),
    (body(inputs=[], extra=1), "unknown field"),
    (text(["a"], [2]), "holds 2 elements"),
    (text([]), "empty batch"),
    (text(["a"] * 5), "limit is 4"),
    (text(["x" * 51]), "limit is 50"),
    (text([1]), "expected a string"),
    (text(["a", "b"], [1, 2]), "shape must be"),
    (tensors([1, 2], [1, 1], [1, 3]), "holds 3 elements"),
    (tensors([1, 2], [1, 2], [1, 2]), "only 0 and 1"),
    (tensors([1, 2000], [1, 1], [1, 2]), "must lie in"),
    (tensors([1, 2], [0, 0], [1, 2]), "no tokens"),
    (tensors([1.5, 2], [1, 1], [1, 2]), "integers"),
    (tensors([1, 2, 3, 4, 5, 6], [1] * 6, [1, 6], parameters={"truncate": False}),
     "truncate=false"),
    (body(inputs=[{"name": "input_ids", "datatype": "INT64", "shape": [1, 1], "data": [1]}]),
     "needs both"),
    (body(inputs=[{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]},
                  {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}]),
     "duplicate"),
])
def test_client_mistakes_are_bad_requests(raw: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        v2.parse(raw, LIMITS)
