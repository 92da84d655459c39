from __future__ import annotations

import json
import logging
import struct

import numpy as np
import pytest

from serving.errors import BadRequest
from serving.protocol import v2
from serving.transport.responses import error_response
from tests.codecs import text_codec, texts_of

LIMITS = text_codec(max_rows=4, max_text_bytes=50, max_length=4, vocab_size=1000,
                   max_sequence=8)  # rows padded up to 8 (the tokenizer file's length) pass


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
    assert texts_of(parsed) == ["a", "b"] and parsed.id == "r1" and parsed.outputs == ["label"]
    assert texts_of(v2.parse(text([["a"], ["b"]], [2, 1]), LIMITS)) == ["a", "b"]
    parsed = v2.parse(tensors([[5, 6, 0]], [[1, 1, 0]], [1, 3]), LIMITS)
    assert parsed.inputs.rows[0].tolist() == [5, 6]
    long = v2.parse(tensors([1, 2, 3, 4, 5, 6], [1] * 6, [1, 6]), LIMITS)
    assert long.inputs.rows[0].tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize(("raw", "message"), [
    (b"{", "malformed JSON"),
    (body(inputs=[], extra=1), "unknown field"),
    (text(["a"], [2]), "holds 2 elements"),
    (text([]), "empty batch"),
    (text(["a"] * 5), "limit is 4"),
    (text(["x" * 51]), "limit is 50"),
    (text([1]), "must hold strings"),
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


def test_rows_padded_past_max_length_up_to_the_tokenizer_files_length_pass() -> None:
    padded = v2.parse(tensors([[7, 8, 9] + [0] * 5], [[1, 1, 1] + [0] * 5], [1, 8]), LIMITS)
    assert padded.inputs.rows[0].tolist() == [7, 8, 9]
    strict = text_codec(max_rows=4, max_text_bytes=50, max_length=4, vocab_size=1000)
    with pytest.raises(BadRequest, match="the limit is 4"):  # no max_sequence: max_length
        v2.parse(tensors([1] * 5, [1] * 5, [1, 5]), strict)


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(("raw", "message"), [
    # declared shapes refused before the data is looked at (data here is far too short)
    (tensors([1], [1], [4, 9]), "9 tokens per row; the limit is 8"),
    (tensors([1], [1], [5, 2]), "5 rows; the limit is 4"),
    (tensors([1], [1], [2 ** 62, 2 ** 62]), "the limit is 4"),
    (tensors([1], [1], [2 ** 63 - 1, 1]), "the limit is 4"),
    (tensors([1], [1], [1, 2, 3]), "not valid here"),
    (tensors([1], [1], [-1, 2]), "not valid here"),
    (text(["a"], [2 ** 63 - 1]), "the limit is 4"),
    (text(["a"], [2 ** 63]), "invalid inference request"),
    (body(inputs=[{"name": "text", "datatype": "BYTES", "shape": [2 ** 64], "data": []}]),
     "invalid inference request"),
    (body(inputs=[{"name": "text", "datatype": "BYTES", "shape": [1] * 9, "data": []}]),
     "invalid inference request"),
    # shape/data mismatches, flat and nested
    (tensors([[1, 2], [3]], [[1, 1], [1]], [2, 2]), "does not have shape"),
    (tensors([[1, 2, 3]], [[1, 1, 1]], [2, 3]), "does not have shape"),
    (tensors([1, 2, 3], [1, 1, 1], [2, 2]), "holds 4 elements but data has 3"),
    (text([["a"], ["b"]], [3, 1]), "does not have shape"),
    # numbers that are not INT64 values
    (tensors([1, 2 ** 63], [1, 1], [1, 2]), "must hold integers"),
    (tensors([1, -(2 ** 63) - 1], [1, 1], [1, 2]), "must hold integers"),
    (tensors([1, 10 ** 30], [1, 1], [1, 2]), "must hold integers"),
    (tensors([1, True], [1, 1], [1, 2]), "must hold integers"),
    (tensors([1, 2], [1.0, 1], [1, 2]), "must hold integers"),
    (tensors([1, None], [1, 1], [1, 2]), "must hold integers"),
    (tensors([1, "2"], [1, 1], [1, 2]), "must hold integers"),
    (tensors(5, 5, [1, 1]), "must hold integers"),
    (text("abc", [1]), "must hold strings"),
    (text([["a", ["b"]]], [1, 1]), "must hold strings"),
])
def test_declared_shapes_and_typed_data_are_refused(raw: bytes, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        v2.parse(raw, LIMITS)


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"1.0e3"])
def test_nan_inf_and_floats_where_token_ids_belong_are_400(literal: bytes) -> None:
    raw = tensors([5, 6], [1, 1], [1, 2]).replace(b"[5, 6]", b"[5, " + literal + b"]")
    with pytest.raises(BadRequest, match=r"malformed JSON|must hold integers"):
        v2.parse(raw, LIMITS)


NEST = "@"  # where the nested arrays go
DEEP_SOMEWHERE = {
    "data": '{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": @}]}',
    "data row": '{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], '
                '"data": [@]}]}',
    "shape": '{"inputs": [{"name": "text", "datatype": "BYTES", "shape": @, "data": ["a"]}]}',
    "parameters": '{"inputs": [], "parameters": {"truncate": true, "x": @}}',
    "input parameters": '{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], '
                        '"data": ["a"], "parameters": {"x": @}}]}',
    "output parameters": '{"inputs": [], "outputs": [{"name": "label", "parameters": {"x": @}}]}',
    "id": '{"inputs": [], "id": @}',
    "outputs": '{"inputs": [], "outputs": @}',
    "inputs": '{"inputs": [@]}',
    "top": "@",
    "objects": '{"inputs": [], "parameters": {"x": OBJECTS}}',
}


@pytest.mark.parametrize("where", list(DEEP_SOMEWHERE))
@pytest.mark.parametrize("depth", [2_000, 100_000])
def test_deep_nesting_anywhere_is_a_bad_request(where: str, depth: int) -> None:
    """Finding 9: msgspec's RecursionError was a 500 with a traceback; typed fields refuse an
    array at once, ``Any`` fields (parameters) and raw data hit msgspec's depth guard."""
    raw = DEEP_SOMEWHERE[where].replace(NEST, deep(depth)).replace(
        "OBJECTS", '{"a": ' * depth + "1" + "}" * depth)
    with pytest.raises(BadRequest, match=r"nested too deeply|invalid inference request|"
                                          r"must hold strings"):
        v2.parse(raw.encode(), LIMITS)


def test_moderate_nesting_in_parameters_is_still_accepted() -> None:
    nested = body(inputs=[{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
                  parameters={"x": [[[[[[[[1]]]]]]]]})
    assert texts_of(v2.parse(nested, LIMITS)) == ["a"]


def test_an_8_mib_token_body_with_a_huge_declared_shape_is_refused_unread() -> None:
    """Finding 7: [256, 8000] token ids; refused by its shape, the data is never decoded."""
    ids = "[" + ",".join("[" + ",".join(["1"] * 8000) + "]" for _ in range(256)) + "]"
    raw = (f'{{"inputs": [{{"name": "input_ids", "datatype": "INT64", "shape": [256, 8000], '
           f'"data": {ids}}}, {{"name": "attention_mask", "datatype": "INT64", '
           f'"shape": [256, 8000], "data": {ids}}}]}}').encode()
    assert len(raw) > 7 << 20
    big = text_codec(max_rows=256, max_text_bytes=50, max_length=64, vocab_size=1000,
                    max_sequence=128)
    with pytest.raises(BadRequest, match="8000 tokens per row; the limit is 128"):
        v2.parse(raw, big)


# -- the binary tensor extension ------------------------------------------------------------

def framed(header: dict[str, object], *chunks: bytes) -> tuple[bytes, str]:
    """A binary-extension body and its Inference-Header-Content-Length."""
    head = json.dumps(header).encode()
    return head + b"".join(chunks), str(len(head))


def strings(*values: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def binary_text(count: int, data: bytes, **extra: object) -> tuple[bytes, str]:
    return framed({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [count],
                               "parameters": {"binary_data_size": len(data)}}], **extra}, data)


def test_binary_inputs_parse_like_their_json_form() -> None:
    raw, length = binary_text(2, strings(b"caf\xc3\xa9", b""), id="b1")
    parsed = v2.parse(raw, LIMITS, length)
    assert texts_of(parsed) == ["café", ""] and parsed.id == "b1"
    ids = np.array([[101, 7, 102], [101, 102, 0]], dtype="<i8")
    mask = (ids != 0).astype("<i8")
    raw, length = framed({"inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": [2, 3],
         "parameters": {"binary_data_size": ids.nbytes}},
        {"name": "attention_mask", "datatype": "INT64", "shape": [2, 3],
         "data": mask.ravel().tolist()}]}, ids.tobytes())  # mixed: one binary, one JSON
    binary = v2.parse(raw, LIMITS, length)
    as_json = v2.parse(tensors(ids.ravel().tolist(), mask.ravel().tolist(), [2, 3]), LIMITS)
    assert [r.tolist() for r in binary.inputs.rows] == \
        [r.tolist() for r in as_json.inputs.rows] == [[101, 7, 102], [101, 102]]


@pytest.mark.parametrize(("length", "message"), [
    ("abc", "not a byte count"), ("-5", "not a byte count"), ("0", "the body has"),
    ("99999", "the body has"), ("1" * 13, "not a byte count"), ("١٢", "not a byte count"),
])
def test_a_bad_header_length_is_a_bad_request(length: str, message: str) -> None:
    raw, _ = binary_text(1, strings(b"x"))
    with pytest.raises(BadRequest, match=message):
        v2.parse(raw, LIMITS, length)


def test_a_header_length_of_the_whole_body_leaves_no_binary_data_and_is_a_400() -> None:
    """The boundary of Inference-Header-Content-Length: equal to the body length, the header
    is the whole body and the binary part is empty, so a JSON naming binary data is refused
    (a V2 400, the binary part named); one byte less cuts the JSON; one more is past the body.
    Only a header naming no binary data may be the whole body."""
    declared = strings(b"x")
    whole = body(inputs=[{"name": "text", "datatype": "BYTES", "shape": [1],
                          "parameters": {"binary_data_size": len(declared)}}])
    with pytest.raises(BadRequest, match="but the binary part has 0 bytes") as refused:
        v2.parse(whole, LIMITS, str(len(whole)))
    answer = error_response(refused.value, logging.getLogger(__name__))
    assert answer.status == 400 and b"binary part has 0 bytes" in answer.body
    with pytest.raises(BadRequest, match="malformed JSON"):
        v2.parse(whole, LIMITS, str(len(whole) - 1))
    with pytest.raises(BadRequest, match=f"is {len(whole) + 1}, but the body has {len(whole)}"):
        v2.parse(whole, LIMITS, str(len(whole) + 1))
    framed_raw, length = binary_text(1, declared)
    assert int(length) == len(framed_raw) - len(declared)  # the header ends where data starts
    assert texts_of(v2.parse(framed_raw, LIMITS, length)) == ["x"]
    json_only = text(["x"])
    assert texts_of(v2.parse(json_only, LIMITS, str(len(json_only)))) == ["x"]


@pytest.mark.parametrize(("count", "data", "declared", "message"), [
    (1, strings(b"x") + b"extra", None, "after its 1 elements"),
    (2, strings(b"x"), None, "ends before element 1"),
    (1, struct.pack("<I", 1000) + b"x", None, "declares 1000 bytes"),
    (1, b"\x01\x00", None, "ends before element 0"),
    (1, strings(b"\xff\xfe"), None, "not valid UTF-8"),
    (1, strings(b"x"), 100, "binary part has"),
    (1, strings(b"x"), 6, "6 bytes of binary data declared at offset 0, but the binary part has 5"),
    (1, strings(b"x"), 2, "follow the last input"),
    (1, strings(b"x"), -1, "non-negative integer"),
    (1, strings(b"x"), "5", "non-negative integer"),
    (1, strings(b"x"), True, "non-negative integer"),
])
def test_malformed_binary_framing_is_a_bad_request(count: int, data: bytes,
                                                   declared: object, message: str) -> None:
    size = len(data) if declared is None else declared
    raw, length = framed({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [count],
                                      "parameters": {"binary_data_size": size}}]}, data)
    with pytest.raises(BadRequest, match=message):
        v2.parse(raw, LIMITS, length)


def test_binary_limits_are_those_of_json() -> None:
    raw, length = binary_text(5, strings(*[b"x"] * 5))
    with pytest.raises(BadRequest, match="rows"):
        v2.parse(raw, LIMITS, length)
    raw, length = binary_text(1, strings(b"x" * 51))
    with pytest.raises(BadRequest, match="the limit is"):
        v2.parse(raw, LIMITS, length)
    ids = np.array([[101, 5000]], dtype="<i8")  # past the vocabulary
    raw, length = framed({"inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": [1, 2],
         "parameters": {"binary_data_size": 16}},
        {"name": "attention_mask", "datatype": "INT64", "shape": [1, 2], "data": [1, 1]}]},
        ids.tobytes())
    with pytest.raises(BadRequest, match=r"must lie in \[0, 1000\)"):
        v2.parse(raw, LIMITS, length)
    raw, length = framed({"inputs": [
        {"name": "input_ids", "datatype": "INT64", "shape": [1, 2],
         "parameters": {"binary_data_size": 12}},
        {"name": "attention_mask", "datatype": "INT64", "shape": [1, 2], "data": [1, 1]}]},
        ids.tobytes()[:12])
    with pytest.raises(BadRequest, match="takes 16 bytes"):
        v2.parse(raw, LIMITS, length)


def test_both_data_and_binary_or_neither_is_refused() -> None:
    raw, length = framed({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                                      "data": ["x"], "parameters": {"binary_data_size": 5}}]},
                         strings(b"x"))
    with pytest.raises(BadRequest, match="both data and binary"):
        v2.parse(raw, LIMITS, length)
    with pytest.raises(BadRequest, match="neither data nor"):
        v2.parse(body(inputs=[{"name": "text", "datatype": "BYTES", "shape": [1]}]), LIMITS)


def response(*names: str) -> v2.InferResponse:
    outputs = {"label": v2.ResponseOutput("label", [2], "BYTES", ["pos", "négatif"]),
               "confidence": v2.ResponseOutput("confidence", [2], "FP32",
                                               np.array([0.75, 0.5], dtype=np.float32))}
    return v2.InferResponse("m", "1", [outputs[n] for n in names], id="r",
                            parameters={"node_id": "e"})


@pytest.mark.parametrize(("request_extra", "binary"), [
    ({}, set()),
    ({"parameters": {"binary_data_output": True}}, {"label", "confidence"}),
    ({"outputs": [{"name": "label", "parameters": {"binary_data": True}},
                  {"name": "confidence"}]}, {"label"}),
    ({"parameters": {"binary_data_output": True},
      "outputs": [{"name": "label", "parameters": {"binary_data": False}},
                  {"name": "confidence"}]}, {"confidence"}),
])
def test_outputs_come_back_binary_where_asked(request_extra: dict[str, object],
                                              binary: set[str]) -> None:
    parsed = v2.parse(text(["a", "b"], **request_extra), LIMITS)
    encoded, header = v2.encode_http(response("label", "confidence"), parsed)
    if not binary:
        assert header is None and json.loads(encoded)["outputs"][1]["data"] == [0.75, 0.5]
        return
    assert header is not None
    head, tail = json.loads(encoded[:header]), encoded[header:]
    assert head["id"] == "r" and head["parameters"] == {"node_id": "e"}
    expected = {"label": strings(b"pos", "négatif".encode()),
                "confidence": np.array([0.75, 0.5], dtype="<f4").tobytes()}
    offset = 0
    for output in head["outputs"]:
        if output["name"] in binary:
            size = output["parameters"]["binary_data_size"]
            assert "data" not in output and tail[offset:offset + size] == expected[output["name"]]
            offset += size
        else:
            assert output["data"] in (["pos", "négatif"], [0.75, 0.5])
    assert offset == len(tail)


@pytest.mark.parametrize("extra", [
    {"parameters": {"binary_data_output": "yes"}},
    {"outputs": [{"name": "label", "parameters": {"binary_data": 1}}]},
])
def test_binary_flags_must_be_booleans(extra: dict[str, object]) -> None:
    with pytest.raises(BadRequest, match="must be a boolean"):
        v2.parse(text(["a"], **extra), LIMITS)


@pytest.mark.parametrize(("datatype", "low", "high"), [("INT8", -128, 127), ("UINT8", 0, 255),
                                                       ("INT16", -32768, 32767)])
@pytest.mark.parametrize("form", ["flat", "nested", "contents"])
def test_integers_at_their_datatypes_limits_pass_and_one_past_them_is_a_400(
        datatype: str, low: int, high: int, form: str) -> None:
    def tensor(values: list[int]) -> v2.Tensor:
        shape = [1, len(values)]
        if form == "contents":  # gRPC's typed contents: int_contents / uint_contents
            return v2.Tensor("x", shape, datatype, values=values)
        data = json.dumps([values] if form == "nested" else values).encode()
        return v2.Tensor("x", shape, datatype, json=data)

    assert v2.array(tensor([low, high])).tolist() == [[low, high]]
    for outside in ([low - 1, high], [low, high + 1]):
        with pytest.raises(BadRequest, match=rf"values must lie in \[{low}, {high}\]"):
            v2.array(tensor(outside))


@pytest.mark.parametrize(("datatype", "top"), [("FP32", "3.4028234663852886e+38"),
                                               ("FP16", "65504.0")])
def test_floats_at_their_datatypes_limit_pass_and_past_it_are_a_400_not_inf(
        datatype: str, top: str) -> None:
    """JSON numbers are float64: one past FP32's (FP16's) range would be cast to inf."""
    at = v2.array(v2.Tensor("x", [1, 2], datatype, json=f"[-{top}, {top}]".encode()))
    assert at.tolist() == [[-float(top), float(top)]]
    past = repr(float(top) * 1.001)
    for outside in (f"[{past}, 0]", f"[0, -{past}]"):
        with pytest.raises(BadRequest, match=r"values must lie in \[-"):
            v2.array(v2.Tensor("x", [1, 2], datatype, json=outside.encode()))


@pytest.mark.parametrize("shape", [[-1, 3], [2, -3]])
def test_a_negative_dimension_is_refused_before_any_data_is_read(shape: list[int]) -> None:
    with pytest.raises(BadRequest, match=r"shape \[.*\] is not valid here"):
        v2.check_rows(v2.Tensor("x", shape, "FP32", raw=b""), (2,), 8)
    assert v2.check_rows(v2.Tensor("x", [2, 3], "FP32", raw=b""), (2,), 8) == 2


def test_nested_data_must_have_the_declared_shape_not_just_its_element_count() -> None:
    assert v2.array(v2.Tensor("x", [2, 2], "FP32", json=b"[[1, 2], [3, 4]]")).tolist() == \
        [[1.0, 2.0], [3.0, 4.0]]
    with pytest.raises(BadRequest, match=r"nested data does not have shape \[1, 4\]"):
        v2.array(v2.Tensor("x", [1, 4], "FP32", json=b"[[1, 2], [3, 4]]"))
    assert v2.strings(v2.Tensor("t", [2, 2], "BYTES", json=b'[["a", "b"], ["c", "d"]]')) == \
        ["a", "b", "c", "d"]
    with pytest.raises(BadRequest, match=r"nested data does not have shape \[2, 2\]"):
        v2.strings(v2.Tensor("t", [2, 2], "BYTES", json=b'[["a"], ["b", "c", "d"]]'))


@pytest.mark.parametrize("tensor", [
    v2.Tensor("x", [1, 2], "INT64", json=b"[[1.5, 2]]"),  # nested JSON
    v2.Tensor("x", [1, 2], "INT64", values=[1.5, 2.0]),  # gRPC contents of the wrong type
    v2.Tensor("x", [1, 2], "UINT8", values=[255.0, 0.0]),
])
def test_a_float_among_integers_is_a_400_never_truncated(tensor: v2.Tensor) -> None:
    with pytest.raises(BadRequest, match=rf"must hold integers \({tensor.datatype}\)"):
        v2.array(tensor)
    whole = v2.Tensor("x", [1, 2], tensor.datatype, values=[1, 2])
    assert v2.array(whole).tolist() == [[1, 2]]
