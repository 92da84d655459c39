"""The repository tells its listeners when a version becomes a model's default and when one is
dropped (the edge's threshold policy follows calibrations this way, not by comparing versions
per request)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import numpy as np

from serving.config.settings import ServingSettings
from serving.inputs.base import Feeds
from serving.release.manifest import Manifest, Preprocessing
from serving.runtime.repository import Repository, VersionLoader
from serving.telemetry.metrics import Metrics
from tests.unit.serving.test_store import manifest


class Store:
    """A store whose versions verify without files (raw tensors, no probe)."""

    def __init__(self, root: Path) -> None:
        self.root, self.current_version = root, 1

    def current(self, model: str) -> int | None:
        return self.current_version

    def verify(self, model: str, version: int, tier: str) -> Manifest:
        return msgspec.structs.replace(manifest(version), preprocessing=Preprocessing(None, 8))

    def version_dir(self, model: str, version: int) -> Path:
        return self.root / model / str(version)

    def set_current(self, model: str, version: int) -> None:
        self.current_version = version


class Zeros:
    description = "zeros"

    def predict(self, batch: Feeds) -> np.ndarray:
        return np.zeros((len(batch["input_ids"]), 2), np.float32)


class Heard:
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def activated(self, manifest: Manifest) -> None:
        self.events.append(("activated", manifest.version))

    def dropped(self, manifest: Manifest) -> None:
        self.events.append(("dropped", manifest.version))


def test_listeners_hear_each_activation_and_each_drop(tmp_path: Path) -> None:
    store = Store(tmp_path)
    loading = VersionLoader(store, "edge", lambda m, f: Zeros(),  # type: ignore[arg-type]
                            ServingSettings(max_batch_size=2), Metrics("t"))
    repository = Repository(loading, keep=1)
    heard = Heard()
    repository.listen(heard)

    async def scenario() -> None:
        assert await repository.activate("sentiment")
        assert not await repository.activate("sentiment")  # nothing new: nothing told
        assert await repository.activate("sentiment", 2)
        await repository.stop()

    asyncio.run(scenario())
    assert heard.events == [("activated", 1), ("activated", 2), ("dropped", 1)]
