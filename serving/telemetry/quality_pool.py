"""Every worker's traffic in worker 0's quality reports (``--workers N``).

Only worker 0 talks to the registry (``serving/transport/workers.py``), so the others hand it their
quality windows through the supervisor's private folder: each of them, every ``SHIP_S``
seconds, adds what it saw since to its one file there (``<index>.json``); worker 0, before
each report, takes every such file in and deletes it. A file holds at most one window per
model version (counts, histograms and at most ``MAX_LATENCIES`` latencies), so it stays
bounded however long worker 0 goes without reporting. A lock file per worker keeps a write
and a take from interleaving.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from serving.telemetry.quality import QualityWindow

log = logging.getLogger(__name__)
SHIP_S = 1.0


class QualityPool:
    def __init__(self, folder: Path, index: int) -> None:
        self.folder, self.index = folder, index
        folder.mkdir(mode=0o700, exist_ok=True)

    def put(self, quality: QualityWindow) -> None:
        """Worker ``index``: add what ``quality`` saw since the last put to its file."""
        mine = quality.export()
        if not mine:
            return
        path = self.folder / f"{self.index}.json"
        with self._locked(self.index):
            merged = QualityWindow()
            if path.exists():
                merged.absorb(_read(path))
            merged.absorb(mine)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(merged.export()))
            os.replace(tmp, path)

    def take(self, quality: QualityWindow) -> None:
        """Worker 0: every other worker's windows into ``quality``; their files emptied."""
        for path in sorted(self.folder.glob("*.json")):
            if not path.stem.isdigit() or int(path.stem) == self.index:
                continue
            with self._locked(int(path.stem)):
                try:
                    windows = _read(path)
                    path.unlink()
                except (OSError, ValueError) as exc:
                    log.warning("skipped worker %s's quality windows: %s", path.stem, exc)
                    continue
            try:
                quality.absorb(windows)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("skipped worker %s's quality windows: %s", path.stem, exc)

    def shipper(self, quality: QualityWindow) -> Shipper:
        return Shipper(self, quality)

    @contextlib.contextmanager
    def _locked(self, index: int) -> Iterator[None]:
        with open(self.folder / f"{index}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


class Shipper:
    """A worker's background put every ``SHIP_S`` seconds, from start to stop (a transport of
    the process, ``serving/process.py``); one last put on stop."""

    def __init__(self, pool: QualityPool, quality: QualityWindow) -> None:
        self.pool, self.quality = pool, quality
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SHIP_S)
            try:
                await asyncio.to_thread(self.pool.put, self.quality)
            except OSError as exc:  # the folder went away (the supervisor is stopping)
                log.warning("could not hand quality windows to worker 0: %s", exc)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        with contextlib.suppress(OSError):
            self.pool.put(self.quality)


def _read(path: Path) -> list[dict[str, object]]:
    data = json.loads(path.read_text())
    if not isinstance(data, list):
        raise ValueError("not a list of windows")
    return data
