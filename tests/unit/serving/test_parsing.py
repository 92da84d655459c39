"""The parse pool (``serving.runtime.parsing``): bounded by threads and queue (503 beyond),
by a deadline (503, the rest undecoded), abandoned when the client goes; and the warning line
and count a refused or slow request leaves (``serving.telemetry.refusals``)."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from serving.config.settings import ServingSettings
from serving.dataplane import DataPlane
from serving.errors import ClientGone, InputRefused, ParseBusy, ParseDeadline
from serving.inputs import pixels, work
from serving.inputs.base import Bounds
from serving.inputs.image import ImageCodec
from serving.protocol import v2
from serving.release.manifest import ImageInput, TensorSpec
from serving.runtime.parsing import ParsePool
from serving.runtime.repository import Resident
from serving.telemetry.logs import request_id
from serving.transport import rest
from tests import image_attacks as attack
from tests.unit.serving.test_dataplane import OneModel, Tier
from tests.unit.serving.test_store import manifest

LOGGER = "serving.telemetry.refusals"
SPEC = ImageInput(height=8, width=8, channels=1)


def codec() -> ImageCodec:
    return ImageCodec(SPEC, [TensorSpec("image", "FP32", [-1, 1, 8, 8])], Bounds(), Path)


class Blocking:
    """A parse that holds its thread until released; says whether it ran."""

    def __init__(self) -> None:
        self.release, self.ran = threading.Event(), threading.Event()

    def __call__(self) -> str:
        self.ran.set()
        self.release.wait(10)
        return "parsed"


def test_a_full_pool_answers_503_with_retry_after_and_one_waiting_is_taken() -> None:
    async def scenario() -> None:
        pool = ParsePool(threads=1, queue=1, deadline_s=10)
        first, second = Blocking(), Blocking()
        running = asyncio.ensure_future(pool.run(pool.job(), first))
        await asyncio.sleep(0.05)
        waiting = asyncio.ensure_future(pool.run(pool.job(), second))  # the queue's one place
        await asyncio.sleep(0.05)
        with pytest.raises(ParseBusy) as busy:
            await pool.run(pool.job(), Blocking())
        assert busy.value.status == 503 and busy.value.headers == {"Retry-After": "1"}
        assert "1 parse threads busy and 1 requests waiting" in str(busy.value)
        first.release.set()
        second.release.set()
        assert await running == await waiting == "parsed"
        assert pool.held == 0  # and a place is free again
        assert await pool.run(pool.job(), lambda: "again") == "again"
        pool.close()

    asyncio.run(scenario())


def test_past_the_deadline_the_answer_is_503_and_a_queued_parse_never_starts() -> None:
    async def scenario() -> None:
        pool = ParsePool(threads=1, queue=4, deadline_s=0.2)
        slow, queued = Blocking(), Blocking()
        running = asyncio.ensure_future(pool.run(pool.job(), slow))
        await asyncio.sleep(0.05)  # it holds the thread
        with pytest.raises(ParseDeadline) as late:
            await pool.run(pool.job(), queued)
        assert late.value.status == 503 and "more than 0.2 s (parse_deadline_s)" in str(late.value)
        with pytest.raises(ParseDeadline):
            await running  # its own deadline passed too
        slow.release.set()
        await asyncio.sleep(0.1)
        assert slow.ran.is_set() and not queued.ran.is_set()
        assert pool.held == 0
        pool.close()

    asyncio.run(scenario())


def test_a_client_gone_abandons_its_queued_parse_and_one_within_the_deadline_is_answered(
        ) -> None:
    async def scenario() -> None:
        pool = ParsePool(threads=1, queue=4, deadline_s=10)
        blocker, abandoned = Blocking(), Blocking()
        running = asyncio.ensure_future(pool.run(pool.job(), blocker))
        await asyncio.sleep(0.05)  # it holds the thread
        left = asyncio.Event()
        with pytest.raises(ClientGone):
            await asyncio.gather(pool.run(pool.job(), abandoned, left.wait),
                                 _set_later(left))
        cancelled = asyncio.ensure_future(pool.run(pool.job(), abandoned))  # a gRPC cancel
        await asyncio.sleep(0.05)
        cancelled.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        blocker.release.set()
        assert await running == "parsed"
        await asyncio.sleep(0.1)
        assert not abandoned.ran.is_set() and pool.held == 0
        stays = asyncio.Event()  # a client that stays: its parse is answered
        assert await pool.run(pool.job(), lambda: "parsed", stays.wait) == "parsed"
        pool.close()

    asyncio.run(scenario())


async def _set_later(event: asyncio.Event) -> None:
    await asyncio.sleep(0.05)
    event.set()


def test_a_multi_image_request_stops_before_its_next_image_once_abandoned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    job, decoded = work.Job(deadline=float("inf"), seconds=5), []
    real = pixels.decode

    def decode(data: bytes, spec: ImageInput, row: int = 0, walked: bool = False) -> Any:
        decoded.append(row)
        job.gone = True  # the client leaves while the first image decodes
        return real(data, spec, row, walked)

    monkeypatch.setattr(pixels, "decode", decode)
    token = work.current.set(job)
    try:
        with pytest.raises(ClientGone, match="not decoding row 1"):
            codec().decode([v2.binary("image", "BYTES", [attack.png()] * 3)], {})
        assert decoded == [0]
        job.gone, job.deadline, decoded[:] = False, 0.0, []
        with pytest.raises(ParseDeadline, match="rows 0 and on were not decoded"):
            codec().decode([v2.binary("image", "BYTES", [attack.png()] * 3)], {})
        assert decoded == []
    finally:
        work.current.reset(token)


class Images:
    """A request of encoded images as the data plane receives one."""

    def __init__(self, *images: bytes) -> None:
        self.images, self.size = list(images), sum(map(len, images))

    def parse(self, decoder: v2.Decoder) -> v2.Parsed:
        return v2.Parsed("r", {}, decoder.decode([v2.binary("image", "BYTES", self.images)],
                                                 {}), None)


def image_plane(**settings: Any) -> tuple[DataPlane, Tier]:
    repository = OneModel()
    repository.resident = Resident(manifest(1), runtime=None, batcher=None,  # type: ignore[arg-type]
                                   codec=codec())
    tier = Tier(repository)
    tier.settings = ServingSettings(**settings)
    return DataPlane.of(tier), tier  # type: ignore[arg-type]


def refused_count(tier: Tier, reason: str) -> float:
    return tier.metrics.registry.get_sample_value(
        "test_request_refused_total", {"model": "sentiment", "reason": reason}) or 0.0


def test_a_refused_request_logs_one_warning_naming_it_and_is_counted_by_reason(
        caplog: pytest.LogCaptureFixture) -> None:
    plane, tier = image_plane()
    bomb = attack.scan_bomb(attack.progressive(64), 40)

    async def send(*images: bytes) -> Any:
        token = request_id.set("rid-bomb")
        try:
            return await plane.infer("sentiment", None, Images(*images))
        finally:
            request_id.reset(token)

    with caplog.at_level(logging.INFO, logger=LOGGER):
        with pytest.raises(InputRefused):
            asyncio.run(send(attack.png(), bomb))
        asyncio.run(send(attack.png()))  # answered at once: no line
    (line,) = [r for r in caplog.records if r.name == LOGGER]
    fields = line.fields  # type: ignore[attr-defined]
    assert line.levelno == logging.WARNING
    assert "request refused (scans): image row 1: more than 32 JPEG scans" in line.getMessage()
    assert fields["model"] == "sentiment" and fields["reason"] == "scans"
    assert 0 <= fields["cpu_ms"] < 1000 and fields["wall_ms"] > 0
    assert refused_count(tier, "scans") == 1 and refused_count(tier, "slow") == 0
    plane.parsing.close()


def test_a_slow_request_logs_a_warning_and_a_fast_one_does_not(
        caplog: pytest.LogCaptureFixture) -> None:
    for slow_s, lines in ((60.0, 0), (1e-9, 1)):  # the same request, either side of the bound
        plane, tier = image_plane(slow_request_s=slow_s)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=LOGGER):
            asyncio.run(plane.infer("sentiment", None, Images(attack.png())))
        found = [r for r in caplog.records if r.name == LOGGER]
        assert len(found) == lines
        assert tier.metrics.registry.get_sample_value(
            "test_request_slow_total", {"model": "sentiment"}) == (lines or None)
        if found:
            assert found[0].getMessage().startswith("slow request: ")
            assert found[0].fields["reason"] == "slow"  # type: ignore[attr-defined]
        plane.parsing.close()


def test_refusal_lines_are_throttled_and_the_next_says_how_many_were_left_out(
        caplog: pytest.LogCaptureFixture) -> None:
    plane, tier = image_plane()
    now = [100.0]
    plane.refusals.clock = lambda: now[0]
    bomb = attack.scan_bomb(attack.progressive(64), 40)

    def refused_lines(count: int) -> list[logging.LogRecord]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=LOGGER):
            for _ in range(count):
                with pytest.raises(InputRefused):
                    asyncio.run(plane.infer("sentiment", None, Images(bomb)))
        return [r for r in caplog.records if r.name == LOGGER]

    assert len(refused_lines(10)) == 10  # ten in a second: each written
    assert refused_lines(15) == []  # five more in the same second than that: counted only
    assert refused_count(tier, "scans") == 25
    now[0] += 1  # a second later
    (line,) = refused_lines(1)
    assert line.fields["suppressed"] == 15  # type: ignore[attr-defined]
    (line,) = refused_lines(1)
    assert "suppressed" not in line.fields  # type: ignore[attr-defined]
    plane.parsing.close()


def binary_request(*images: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Headers and body of a V2 binary request of encoded images."""
    raw = b"".join(len(i).to_bytes(4, "little") + i for i in images)
    header = json.dumps({"inputs": [{"name": "image", "datatype": "BYTES",
                                     "shape": [len(images)],
                                     "parameters": {"binary_data_size": len(raw)}}]}).encode()
    return [(b"inference-header-content-length", str(len(header)).encode())], header + raw


def test_a_rest_client_that_leaves_has_its_queued_parse_abandoned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    walked: list[int] = []
    real = pixels.sizes

    def sizes(images: list[bytes], spec: ImageInput) -> list[tuple[int, int]]:
        walked.append(len(images))
        return real(images, spec)

    monkeypatch.setattr(pixels, "sizes", sizes)
    plane, tier = image_plane(parse_threads=1)
    headers, content = binary_request(attack.png())
    sent: list[dict[str, Any]] = []

    async def scenario() -> None:
        left = asyncio.Event()
        messages = iter([{"type": "http.request", "body": content, "more_body": False}])

        async def receive() -> dict[str, Any]:
            message = next(messages, None)
            if message is None:
                await left.wait()
                return {"type": "http.disconnect"}
            return message

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        blocker = Blocking()
        holding = asyncio.ensure_future(plane.parsing.run(plane.parsing.job(), blocker))
        await asyncio.sleep(0.05)
        scope = {"type": "http", "path": "/v2/models/sentiment/infer", "headers": headers}
        handler: Any = rest.infer_handler(plane, 1 << 20)
        answering = asyncio.ensure_future(handler(scope, receive, send))
        await asyncio.sleep(0.05)
        left.set()  # the client goes while its request waits for the parse thread
        await answering
        blocker.release.set()
        await holding
        await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert sent[0]["status"] == 499 and walked == []  # its image was never looked at
    assert refused_count(tier, "gone") == 1 and plane.parsing.held == 0
    plane.parsing.close()


def test_a_jobs_cpu_is_read_from_its_thread_while_it_runs_and_kept_once_done() -> None:
    job, spinning, stop = work.Job(deadline=float("inf"), seconds=5), threading.Event(), [False]

    def spin() -> None:
        job.started(threading.get_ident())
        spinning.set()
        while not stop[0]:
            pass
        job.finished()

    thread = threading.Thread(target=spin)
    thread.start()
    spinning.wait(5)
    time_spent, waited = 0.0, 0
    while time_spent < 0.05 and waited < 1000:  # this thread sleeps: only the job's is read
        threading.Event().wait(0.01)
        time_spent, waited = job.cpu(), waited + 1
    assert job.cpu_s is None and time_spent >= 0.05
    stop[0] = True
    thread.join()
    assert job.cpu_s is not None and job.cpu() == job.cpu_s >= time_spent
