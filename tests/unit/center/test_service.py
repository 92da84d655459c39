"""The center tier in-process: every row is answered by its model, with its version."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from center.build import build_service
from center.settings import CenterSettings
from serving.protocol import v2
from serving.runtime.repository import Resident
from tests.codecs import decoded, text_codec
from tests.unit.serving.test_store import manifest


class Logits:
    async def submit(self, rows: list[np.ndarray]) -> np.ndarray:
        return np.asarray([[0.0, 3.0] if r[0] % 2 else [3.0, 0.0] for r in rows], np.float32)


def test_every_row_is_the_centers_answer_with_its_version(tmp_path: Path) -> None:
    service = build_service(CenterSettings(store=tmp_path, device="cpu"))
    resident = Resident(manifest(4), runtime=None, batcher=Logits(),  # type: ignore[arg-type]
                        codec=text_codec())
    rows = [np.asarray([i + 1, 7], dtype=np.int64) for i in range(3)]
    answer = asyncio.run(service.infer(resident, v2.Parsed("c", {}, decoded(rows),
                                                           ["label", "tier"])))
    assert [o.name for o in answer.outputs] == ["label", "tier"]
    assert answer.outputs[0].data == ["pos", "neg", "pos"]
    assert answer.outputs[1].data == ["center"] * 3
    assert answer.parameters == {"center_version": 4} and answer.model_version == "4"


def test_capacity_is_measured_from_batches_at_the_latency_target_or_set(tmp_path: Path) -> None:
    from serving.runtime.batcher import BatchStats

    service = build_service(CenterSettings(store=tmp_path, device="cpu", max_batch_size=32,
                                           latency_target_ms=500, capacity_headroom=0.8))
    assert service.capacity("sentiment", 4) is None  # nothing computed yet
    assert service.report("sentiment", 4) == {}
    observe = service.metrics.observer("sentiment", 4)
    for rows in (1, 2, 4, 8) * 10:  # 10 ms per call + 20 ms per row
        observe(BatchStats(rows, rows, 0.0, 0.01 + 0.02 * rows))
    # the largest batch within 250 ms is 12 rows (250 ms): 48 rows/s, x 0.8
    assert service.capacity("sentiment", 4) == pytest.approx(0.8 * 12 / 0.25, rel=0.01)
    assert service.report("sentiment", 4)["capacity_rows_s"] == pytest.approx(38.4, rel=0.01)
    fixed = build_service(CenterSettings(store=tmp_path, device="cpu", capacity_rows_s=120))
    assert fixed.capacity("sentiment", 4) == 120
