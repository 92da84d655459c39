"""The center tier in-process: every row is answered by its model, with its version."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from center.service import CenterService
from center.settings import CenterSettings
from serving import v2
from serving.repository import Resident
from tests.unit.serving.test_store import manifest


class Logits:
    async def submit(self, rows: list[np.ndarray]) -> np.ndarray:
        return np.asarray([[0.0, 3.0] if r[0] % 2 else [3.0, 0.0] for r in rows], np.float32)


def test_every_row_is_the_centers_answer_with_its_version(tmp_path: Path) -> None:
    service = CenterService(CenterSettings(store=tmp_path, device="cpu"))
    resident = Resident(manifest(4), runtime=None, batcher=Logits(),  # type: ignore[arg-type]
                        tokenizer=None)
    rows = [np.asarray([i + 1, 7], dtype=np.int64) for i in range(3)]
    answer = asyncio.run(service.infer(resident, v2.Parsed("c", {}, None, rows,
                                                           ["label", "tier"])))
    assert [o.name for o in answer.outputs] == ["label", "tier"]
    assert answer.outputs[0].data == ["pos", "neg", "pos"]
    assert answer.outputs[1].data == ["center"] * 3
    assert answer.parameters == {"center_version": 4} and answer.model_version == "4"
