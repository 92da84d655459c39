from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from edge.centers import parse_list
from edge.escalation import Centers, CenterUnavailable, Transports


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
                await client.classify("m", ["text"], [np.array([1, 2])], "rid", labels=2)
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
        answer = await client.classify("m", ["a", "b"], [np.array([1]), np.array([2])], "t-9", 2)
        assert answer.version == "4"
        assert np.allclose(answer.probabilities, [[0.1, 0.9], [0.8, 0.2]])
        await client.close()

    asyncio.run(main())
    assert seen == {"rid": "t-9"}
