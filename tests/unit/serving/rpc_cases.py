"""The gRPC transport's request decoding (``serving.transport.rpc.GrpcRequest``), without a
server: typed ``contents`` are read from the field of the input's datatype.

Run by ``test_rpc.py`` in a process of its own: these load the tiers' gRPC stubs (package
``inference``), and protobuf allows one definition of ``inference.*`` per process, the test
process's being tritonclient's (tests/integration/test_protocols.py, test_stack.py)."""

from __future__ import annotations

import pytest

from serving.errors import BadRequest
from serving.gen import grpc_predict_v2_pb2 as pb
from serving.protocol import v2
from serving.transport.rpc import GrpcRequest
from tests.codecs import text_codec, texts_of

LIMITS = text_codec(max_rows=4, max_text_bytes=50, max_length=4, vocab_size=1000,
                   max_sequence=8)


def int64_request(ids: list[int], mask: list[int], shape: list[int]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", id="g1")
    for name, values in (("input_ids", ids), ("attention_mask", mask)):
        tensor = request.inputs.add(name=name, datatype="INT64", shape=shape)
        tensor.contents.int64_contents.extend(values)
    return request


def test_int64_inputs_are_decoded_from_contents_int64_contents() -> None:
    request = int64_request([101, 7, 102, 101, 102, 0], [1, 1, 1, 1, 1, 0], [2, 3])
    parsed = GrpcRequest(request).parse(LIMITS)
    assert parsed.id == "g1" and texts_of(parsed) is None
    assert [r.tolist() for r in parsed.inputs.rows] == [[101, 7, 102], [101, 102]]
    # the same tensors as JSON decode alike
    as_json = v2.parse(b'{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [2, 3],'
                       b' "data": [101, 7, 102, 101, 102, 0]}, {"name": "attention_mask",'
                       b' "datatype": "INT64", "shape": [2, 3], "data": [1, 1, 1, 1, 1, 0]}]}',
                       LIMITS)
    assert [r.tolist() for r in as_json.inputs.rows] == \
        [r.tolist() for r in parsed.inputs.rows]


def test_int64_values_in_another_contents_field_are_not_read() -> None:
    """INT64 ids given in ``int_contents`` (the INT32 field) are not INT64 contents."""
    request = pb.ModelInferRequest(model_name="m")
    for name, values in (("input_ids", [101, 102]), ("attention_mask", [1, 1])):
        tensor = request.inputs.add(name=name, datatype="INT64", shape=[1, 2])
        tensor.contents.int_contents.extend(values)
    with pytest.raises(BadRequest, match="contents have 0"):
        GrpcRequest(request).parse(LIMITS)
