from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest

from edge.call import Call, Refused
from edge.centers import CenterURL, parse_list
from edge.escalation import Centers, CenterUnavailable, Transports
from edge.grpc_center import GrpcCenter
from edge.http_center import HttpCenter
from serving.protocol import v2


def texts(values: list[str]) -> list[v2.Tensor]:
    return [v2.binary("text", "BYTES", values)]


def test_a_busy_center_is_left_alone_for_its_retry_after() -> None:
    calls: list[str] = []

    def center(request: httpx.Request) -> httpx.Response:
        calls.append(str(request.url))
        return httpx.Response(503, headers={"Retry-After": "30"}, json={"error": "queue full"})

    async def main() -> None:
        client = Centers(Transports(1.0, None, httpx.MockTransport(center)),
                         parse_list("http://center-a"), failures=3, reset_s=5)
        for _ in range(3):
            with pytest.raises(CenterUnavailable, match=r"HTTP 503|circuit open"):
                await client.classify("m", texts(["text"]), 1, "rid", labels=2)
        assert client.circuits() == {"http://center-a": "open"}
        await client.close()

    asyncio.run(main())
    assert calls == ["http://center-a/v2/models/m/infer"]  # one call, then no hammering


def test_answers_come_back_in_row_order_with_the_trace_id() -> None:
    seen: dict[str, str] = {}

    def center(request: httpx.Request) -> httpx.Response:
        seen["rid"] = request.headers["x-request-id"]
        return httpx.Response(200, json={"model_name": "m", "model_version": "4", "outputs": [
            {"name": "probabilities", "shape": [2, 2], "datatype": "FP32",
             "data": [0.1, 0.9, 0.8, 0.2]}]})

    async def main() -> None:
        client = Centers(Transports(1.0, None, httpx.MockTransport(center)),
                         parse_list("http://c"), 3, 5)
        answer = await client.classify("m", texts(["a", "b"]), 2, "t-9", 2)
        assert answer.version == "4"
        assert np.allclose(answer.probabilities, [[0.1, 0.9], [0.8, 0.2]])
        await client.close()

    asyncio.run(main())
    assert seen == {"rid": "t-9"}


def answering(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"model_name": "m", "model_version": "1", "outputs": [
        {"name": "probabilities", "shape": [1, 2], "datatype": "FP32", "data": [0.5, 0.5]}]})


def test_a_failing_center_is_failed_over_and_counted_against_its_circuit() -> None:
    def center(request: httpx.Request) -> httpx.Response:
        if request.url.host == "down":
            return httpx.Response(500)
        return answering(request)

    async def main() -> None:
        client = Centers(Transports(1.0, None, httpx.MockTransport(center)),
                         parse_list("http://down,http://up"), 3, 5)
        for _ in range(2):  # round-robin: one of them starts at the failing center
            answer = await client.classify("m", texts(["t"]), 1, None, 2)
            assert answer.url == "http://up"
        assert client.breakers["http://down"].failures == 1
        await client.close()

    asyncio.run(main())


def test_with_a_fleet_ca_a_plain_center_is_refused_before_any_call() -> None:
    calls: list[httpx.Request] = []

    async def main() -> None:
        http = httpx.AsyncClient(transport=httpx.MockTransport(
            lambda r: calls.append(r) or answering(r)))
        center = HttpCenter(CenterURL.parse("http://c:8100"), http, pinned=True)
        with pytest.raises(Refused, match="not TLS"):
            await center.classify(Call("m", texts(["t"]), 1, None, 2))
        grpc_center = GrpcCenter(CenterURL.parse("grpc://c:8101"), 1.0, Path("ca.pem"))
        with pytest.raises(Refused, match="not TLS"):
            await grpc_center.classify(Call("m", texts(["t"]), 1, None, 2))
        await http.aclose()

    asyncio.run(main())
    assert calls == []


def test_one_parser_reads_every_center_url() -> None:
    from serving.fleet.discovery import Instance

    assert CenterURL.parse(" grpcs://[::1]:8101/ ") == CenterURL(
        "grpcs://[::1]:8101", "grpc", True, "[::1]:8101")
    assert CenterURL.parse("http://c:8100") == CenterURL("http://c:8100", "http", False,
                                                         "c:8100")
    assert [c.url for c in parse_list("http://a:1, ,https://b:2")] == ["http://a:1",
                                                                       "https://b:2"]
    for bad in ("c:8100", "ftp://c:1", "http:/c"):
        with pytest.raises(ValueError, match="expected http://"):
            CenterURL.parse(bad)
    found = Instance("c1", "10.0.0.1", 8100, meta={"grpc_port": "8101"})
    assert CenterURL.discovered(found, "grpc", True).url == "grpcs://10.0.0.1:8101"
    assert CenterURL.discovered(found, "http", False).url == "http://10.0.0.1:8100"
