"""The gRPC transport's request decoding (``serving.transport.rpc.GrpcRequest``), without a
server: typed ``contents`` are read from the field of the input's datatype; the servicer over the
test data plane (``test_dataplane``): which calls the access log names.

Run by ``test_rpc.py`` in a process of its own: these load the tiers' gRPC stubs (package
``inference``), and protobuf allows one definition of ``inference.*`` per process, the test
process's being tritonclient's (tests/integration/test_protocols.py, test_stack.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import grpc
import pytest

from serving.config.settings import ServingSettings
from serving.errors import BadRequest, Overloaded
from serving.gen import grpc_predict_v2_pb2 as pb
from serving.protocol import v2
from serving.transport.rpc import GrpcRequest, InferenceServicer
from tests.codecs import text_codec, texts_of
from tests.unit.serving.test_dataplane import plane

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


class Context:
    """A servicer context as gRPC gives one: no metadata in, the code a call is aborted with."""

    def __init__(self) -> None:
        self.code: grpc.StatusCode | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ()

    def set_trailing_metadata(self, metadata: object) -> None:
        pass

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        raise grpc.aio.AbortError()


def logged_calls(caplog: pytest.LogCaptureFixture, access_log: bool) -> list[str]:
    """What the gRPC transport logged for an answered inference, an unknown model (a client's
    NOT_FOUND), an inference failing inside the server (INTERNAL) and one refused by a full
    queue (UNAVAILABLE), each call aborted with its code."""
    request = int64_request([101, 102], [1, 1], [1, 2])
    request.model_name = "sentiment"
    cases = [(plane(), request, None),
             (plane(), pb.ModelInferRequest(model_name="nope"), grpc.StatusCode.NOT_FOUND),
             (plane(fail=RuntimeError("boom")), request, grpc.StatusCode.INTERNAL),
             (plane(fail=Overloaded("queue full")), request, grpc.StatusCode.UNAVAILABLE)]
    with caplog.at_level(logging.INFO, logger="serving.grpc"):
        for (p, tier), message, code in cases:
            tier.settings = ServingSettings(access_log=access_log)
            context = Context()
            with contextlib.suppress(grpc.aio.AbortError):  # how a call is aborted
                asyncio.run(InferenceServicer(p).ModelInfer(message, context))
            assert context.code == code
    return [r.getMessage() for r in caplog.records  # the access log's lines, not the traceback
            if r.name == "serving.grpc" and r.getMessage().startswith("grpc ")]


def test_with_the_access_log_off_only_server_faults_are_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    """REST's rule over gRPC: an answered call or a client's mistake leaves no line, a server
    fault always does."""
    assert logged_calls(caplog, access_log=False) == ["grpc ModelInfer INTERNAL",
                                                      "grpc ModelInfer UNAVAILABLE"]


def test_with_the_access_log_on_every_call_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    assert logged_calls(caplog, access_log=True) == [
        "grpc ModelInfer OK", "grpc ModelInfer NOT_FOUND", "grpc ModelInfer INTERNAL",
        "grpc ModelInfer UNAVAILABLE"]
