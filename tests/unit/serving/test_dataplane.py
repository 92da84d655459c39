"""The transport-neutral data plane: what both transports get from it, with a tier that answers
fixed rows and a repository of one model."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from serving.config.settings import ServingSettings
from serving.dataplane import PARSE_INLINE_BYTES, DataPlane
from serving.errors import BadRequest, ModelNotFound, NotReady, Overloaded
from serving.protocol import v2
from serving.runtime.repository import Resident
from serving.telemetry.metrics import Metrics
from tests.codecs import text_codec
from tests.unit.serving.test_store import manifest

BODY = b'{"id": "r1", "inputs": [{"name": "input_ids", "shape": [1, 2], "datatype": "INT64", ' \
       b'"data": [5, 6]}, {"name": "attention_mask", "shape": [1, 2], "datatype": "INT64", ' \
       b'"data": [1, 1]}]}'


class OneModel:
    """A repository holding ``sentiment`` version 1 (or nothing)."""

    tier = "edge"

    def __init__(self, loaded: bool = True) -> None:
        self.loaded, self.started, self.stopped = loaded, False, False
        self.resident = Resident(manifest(1), runtime=None, batcher=None,  # type: ignore[arg-type]
                                 codec=text_codec(max_rows=256, max_length=128))

    def models(self) -> list[str]:
        return ["sentiment"] if self.loaded else []

    def versions(self, model: str) -> list[int]:
        return [1]

    def get(self, model: str, version: str | None = None) -> Resident:
        if not self.loaded or model != "sentiment" or version not in (None, "1"):
            raise ModelNotFound(f"model {model!r} has no version {version}")
        return self.resident

    async def refresh(self) -> None:
        self.started = True

    async def watch(self) -> None:
        await asyncio.Event().wait()

    async def stop(self) -> None:
        self.stopped = True


class Tier:
    name, platform = "tiered-test", "test_platform"

    def __init__(self, repository: OneModel, fail: Exception | None = None) -> None:
        self.repository, self.fail = repository, fail
        self.metrics, self.settings = Metrics("test"), ServingSettings()
        self.parsed: list[v2.Parsed] = []

    async def infer(self, resident: Resident, parsed: v2.Parsed) -> v2.InferResponse:
        if self.fail is not None:
            raise self.fail
        self.parsed.append(parsed)
        return v2.InferResponse(model_name="sentiment", model_version="1", outputs=[],
                                id=parsed.id)

    def watches(self) -> dict[str, Any]:
        return {}

    async def stop(self) -> None:
        return None


class Counted:
    """A request that says how it was parsed: on the loop's thread or in a worker."""

    def __init__(self, body: bytes, size: int) -> None:
        self.body, self.size, self.threads = body, size, []  # type: list[bool]

    def parse(self, limits: v2.Limits) -> v2.Parsed:
        import threading
        self.threads.append(threading.current_thread() is threading.main_thread())
        return v2.parse(self.body, limits)


def plane(loaded: bool = True, fail: Exception | None = None) -> tuple[DataPlane, Tier]:
    tier = Tier(OneModel(loaded), fail)
    return DataPlane.of(tier), tier  # type: ignore[arg-type]


def sample(tier: Tier, name: str, **labels: str) -> float:
    return tier.metrics.registry.get_sample_value(name, labels) or 0.0


def test_infer_parses_within_the_model_limits_and_counts_the_success() -> None:
    p, tier = plane()
    answer = asyncio.run(p.infer("sentiment", None, v2.HttpRequest(BODY)))
    assert answer.id == "r1" and [list(r) for r in tier.parsed[0].inputs.rows] == [[5, 6]]
    assert sample(tier, "test_request_success_total", model="sentiment", version="1") == 1
    assert sample(tier, "test_request_duration_seconds_count", model="sentiment",
                  version="1") == 1


@pytest.mark.parametrize(("body", "error"), [(b"{", BadRequest), (BODY, Overloaded)])
def test_a_failure_is_raised_and_counted_by_its_reason(body: bytes,
                                                       error: type[Exception]) -> None:
    p, tier = plane(fail=Overloaded("queue full"))
    with pytest.raises(error):
        asyncio.run(p.infer("sentiment", "1", v2.HttpRequest(body)))
    assert sample(tier, "test_request_failure_total", model="sentiment", version="1",
                  reason=error.__name__) == 1
    assert sample(tier, "test_request_success_total", model="sentiment", version="1") == 0


def test_an_unknown_model_is_not_found_before_anything_is_parsed() -> None:
    p, _ = plane()
    request = Counted(b"not even json", 13)
    with pytest.raises(ModelNotFound):
        asyncio.run(p.infer("nope", None, request))
    assert request.threads == []


def test_large_requests_are_parsed_off_the_event_loop_thread() -> None:
    p, _ = plane()
    small, large = Counted(BODY, len(BODY)), Counted(BODY, PARSE_INLINE_BYTES + 1)
    asyncio.run(p.infer("sentiment", None, small))
    asyncio.run(p.infer("sentiment", None, large))
    assert small.threads == [True] and large.threads == [False]


def test_readiness_and_metadata() -> None:
    empty, _ = plane(loaded=False)
    with pytest.raises(NotReady, match="no model loaded"):
        empty.ready()
    p, _ = plane()
    assert p.ready() == ["sentiment"]
    assert p.server_metadata()["name"] == "tiered-test"
    meta = p.model_metadata("sentiment")
    assert meta["versions"] == ["1"] and meta["platform"] == "test_platform"
    assert meta["parameters"] == {"labels": "neg,pos", "threshold": 0.9}
    assert p.model_ready("sentiment", "1") == {"name": "sentiment", "version": "1",
                                               "ready": True}
    assert b"test_request_success" in p.exposition()


def test_start_serves_the_store_and_stop_drains_the_repository() -> None:
    p, tier = plane()

    async def run() -> None:
        await p.start()
        assert tier.repository.started
        await p.stop()

    asyncio.run(run())
    assert tier.repository.stopped


def test_rows_are_numpy_int64() -> None:
    p, tier = plane()
    asyncio.run(p.infer("sentiment", None, v2.HttpRequest(BODY)))
    (row,) = tier.parsed[0].inputs.rows
    assert row.dtype == np.int64
