"""Models resident in a serving process, loaded from the model store.

A new version is loaded and warmed in a worker thread while the current one keeps serving; then
one reference is swapped and versions beyond ``keep`` are drained and dropped. Requests may pin
a resident version (``/versions/{v}``); the rest go to the default, the store's CURRENT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from serving import inputs
from serving.config.settings import ServingSettings
from serving.errors import ModelNotFound, NotReady
from serving.inputs.base import Bounds, Codec, Feeds
from serving.inputs.drift import InputDrift
from serving.release import hardware, probe
from serving.release.manifest import Manifest, is_valid_name
from serving.release.store import ModelStore, StoreError, Tier
from serving.runtime import memory
from serving.runtime.batcher import Batcher, Finish
from serving.telemetry.metrics import Metrics

log = logging.getLogger(__name__)


class Runtime(Protocol):
    description: str

    def predict(self, feeds: Feeds) -> np.ndarray: ...


Loader = Callable[[Manifest, Path], Runtime]
# the tier's per-batch finish for a model version (serving.runtime.batcher.Finish):
# logits -> answers
Finisher = Callable[[Manifest], Finish]


class VersionListener(Protocol):
    """Told when a version becomes a model's default and when one is dropped (e.g. the edge's
    threshold policy, whose controller follows the default's calibration)."""

    def activated(self, manifest: Manifest) -> None: ...

    def dropped(self, manifest: Manifest) -> None: ...


@dataclass
class Resident:
    manifest: Manifest
    runtime: Runtime
    batcher: Batcher
    codec: Codec  # what clients send and how it becomes the model's inputs (serving.inputs)
    fidelity: probe.Measured | None = None  # on this node's hardware; None: release has no probe
    drift: InputDrift | None = None  # rows against the release's input reference; None: none

    @property
    def version(self) -> int:
        return self.manifest.version


def warm_up(runtime: Runtime, codec: Codec, max_batch_size: int) -> None:
    """Run the shapes serving will see first, so the first request pays no lazy set-up."""
    for rows in (1, min(8, max_batch_size), max_batch_size):
        runtime.predict(codec.collate(codec.sample(rows, seed=rows)))


def bounds(settings: ServingSettings) -> Bounds:
    return Bounds(max_rows=settings.max_request_rows, max_text_bytes=settings.max_text_bytes)


class VersionLoader:
    """Makes one store version resident: verified against its manifest, loaded by the tier's
    ``loader``, warmed up, its fidelity checked on this hardware, with its input kind's codec
    and its batcher (started when the repository swaps it in)."""

    def __init__(self, store: ModelStore, tier: Tier, loader: Loader, settings: ServingSettings,
                 metrics: Metrics, finisher: Finisher | None = None) -> None:
        """``finisher``: what each model call's logits become in the batcher's worker thread
        (default: left as they are)."""
        self.store, self.tier, self.loader, self.finisher = store, tier, loader, finisher
        self.settings, self.metrics = settings, metrics

    def load(self, model: str, version: int) -> Resident:
        manifest = self.store.verify(model, version, self.tier)
        folder = self.store.version_dir(model, version)
        codec = inputs.for_manifest(manifest, folder, bounds(self.settings))
        runtime = self.loader(manifest, folder)
        warm_up(runtime, codec, self.settings.max_batch_size)
        fidelity = self._check_fidelity(manifest, folder, runtime)
        s = self.settings
        batcher = Batcher(runtime.predict, codec.collate, codec.cost,
                          max_batch_size=s.max_batch_size, max_delay_ms=s.max_batch_delay_ms,
                          max_queue_rows=s.max_queue_rows,
                          observe=self.metrics.observer(model, version),
                          finish=self.finisher(manifest) if self.finisher else None)
        return Resident(manifest, runtime, batcher, codec, fidelity,
                        InputDrift.of(codec, manifest))

    def floor(self, manifest: Manifest) -> float:
        """The node's own floor when set, else the release's."""
        own = self.settings.min_fidelity
        return manifest.fidelity.minimum if own is None else own

    def _check_fidelity(self, manifest: Manifest, folder: Path,
                        runtime: Runtime) -> probe.Measured | None:
        """Run the release probe on this hardware; refuse the version below the floor."""
        if manifest.probe is None:
            log.warning("%s version %s carries no probe: its fidelity on this node is not "
                        "checked", manifest.name, manifest.version)
            return None
        measured = probe.measure(runtime.predict, probe.load(folder / manifest.probe.file,
                                                             manifest.inputs), self.tier)
        floor = self.floor(manifest)
        self.metrics.fidelity.labels(manifest.name, str(manifest.version)).set(
            measured.agreement)
        platform = hardware.here(runtime.description)
        if measured.agreement < floor:
            raise probe.FidelityRefused(measured, floor, platform)
        log.info("%s version %s: fidelity %.1f%% on %d probe rows (floor %.1f%%) on %s",
                 manifest.name, manifest.version, 100 * measured.agreement, measured.rows,
                 100 * floor, platform.describe())
        return measured


class Repository:
    """Which versions are resident and which is each model's default.

    Why one class: the resident versions, the defaults, the failed versions and the lock are
    one state that activation, eviction, refresh and lookup all read and change together;
    loading a version (``VersionLoader``) is the part that stands apart."""

    def __init__(self, loading: VersionLoader, keep: int = 2) -> None:
        """``keep``: the newest versions per model that stay resident (the default always
        does)."""
        self.loading, self.keep = loading, keep
        self.store, self.tier, self.settings = loading.store, loading.tier, loading.settings
        self._resident: dict[str, dict[int, Resident]] = {}
        self._default: dict[str, int] = {}
        self._failed: dict[str, tuple[tuple[int, ...], str]] = {}  # model -> (stamp, reason)
        self._retired: set[str] = set()  # taken off this node by the registry (404 says so)
        self._lock = asyncio.Lock()
        self._listeners: list[VersionListener] = []

    def listen(self, listener: VersionListener) -> None:
        """Tell ``listener`` about every activation and drop from now on."""
        self._listeners.append(listener)

    def models(self) -> list[str]:
        return sorted(self._default)

    def versions(self, model: str) -> list[int]:
        return sorted(self._resident.get(model, {}))

    def get(self, model: str, version: str | None = None) -> Resident:
        if model not in self._resident:
            if model in self._retired:
                raise ModelNotFound(f"model {model!r} was retired by the registry: unknown here")
            if model in self._failed:
                raise NotReady(f"model {model!r} is not served: {self._failed[model][1]}")
            if is_valid_name(model) and self.store.current(model) is not None:
                raise NotReady(f"model {model!r} is still loading")
            raise ModelNotFound(f"unknown model {model!r}")
        if version is None:
            return self._resident[model][self._default[model]]
        # ASCII digits only: str.isdigit() also accepts '²' (int() refuses it) and '١'
        if not (version.isascii() and version.isdigit()) or \
                int(version) not in self._resident[model]:
            raise ModelNotFound(f"model {model!r} has no version {version!r} loaded "
                                f"(loaded: {self.versions(model)})")
        return self._resident[model][int(version)]

    async def refresh(self) -> None:
        """Load the store's CURRENT version of every model that is not yet the default.

        A version that failed (bad signature, files not matching the manifest, ...) is logged
        once and not tried again until its folder or CURRENT changes."""
        if not self.store.root.is_dir():
            return
        for folder in sorted(self.store.root.iterdir()):
            if not (folder.is_dir() and is_valid_name(folder.name)):
                continue
            model = folder.name
            stamp = self._stamp(model)
            if model in self._failed and self._failed[model][0] == stamp:
                continue
            try:
                await self.activate(model)
                self._failed.pop(model, None)
            except (StoreError, OSError, ValueError, RuntimeError) as exc:
                log.error("cannot load %s: %s", model, exc)
                self._failed[model] = (stamp, str(exc))

    def _stamp(self, model: str) -> tuple[int, ...]:
        """Changes when CURRENT or the files of the version it names are replaced."""
        stamp: list[int] = []
        try:
            current = self.store.current(model)
        except (StoreError, OSError):
            return (-1,)
        if current is None:
            return (0,)
        folder = self.store.version_dir(model, current)
        for path in (self.store.model_dir(model) / "CURRENT", folder, *(
                folder.iterdir() if folder.is_dir() else [])):
            with contextlib.suppress(OSError):
                info = path.stat()
                stamp += [info.st_mtime_ns, info.st_size, info.st_ino]
        return (current, *stamp)

    async def activate(self, model: str, version: int | None = None) -> bool:
        """Make ``version`` (default: the store's CURRENT) the default; True if it changed.

        With an explicit version the store's CURRENT is moved to it only once it is loaded,
        warmed and swapped in: a version that fails to load never becomes CURRENT.
        """
        if version is None and self._default.get(model) == self.store.current(model):
            return False
        async with self._lock:
            # re-read under the lock: another activation may have moved CURRENT meanwhile
            target = self.store.current(model) if version is None else version
            if target is None or self._default.get(model) == target:
                return False
            resident = self._resident.get(model, {}).get(target)
            if resident is None:
                resident = await asyncio.to_thread(self.loading.load, model, target)
                resident.batcher.start()
            self._resident.setdefault(model, {})[target] = resident
            previous = self._default.get(model)
            self._default[model] = target
            self._failed.pop(model, None)
            self._retired.discard(model)
            for listener in self._listeners:
                listener.activated(resident.manifest)
            if version is not None:
                await asyncio.to_thread(self.store.set_current, model, target)
            log.info("serving %s version %s (%s)", model, target, resident.runtime.description,
                     extra={"fields": {"model": model, "version": target,
                                       "previous": previous}})
            await self._evict(model)
            return True

    async def retire(self, model: str) -> list[int]:
        """Take ``model`` off this node (the registry's signed retire): no new request reaches
        it, its store folder goes (no CURRENT: a restart loads nothing of it), then each
        resident version's batcher drains what is queued and the version is dropped. Every
        other model serves on. Returns the versions that were resident."""
        async with self._lock:  # after any activation in flight, none can start under it
            versions = self._resident.pop(model, {})
            self._default.pop(model, None)
            self._failed.pop(model, None)
            self._retired.add(model)
            await asyncio.to_thread(self.store.remove, model)
        for resident in versions.values():
            await resident.batcher.stop()  # drains what is queued first
            for listener in self._listeners:
                listener.dropped(resident.manifest)
        if versions:
            await asyncio.to_thread(memory.trim)
        return sorted(versions)

    def default_version(self, model: str) -> int | None:
        return self._default.get(model)

    def fidelity(self, model: str, version: int) -> probe.Measured | None:
        """What the probe measured here for a resident version (None: not resident, or its
        release has no probe)."""
        resident = self._resident.get(model, {}).get(version)
        return resident.fidelity if resident else None

    def runtime(self) -> str:
        """The model runtime serving here (e.g. ``onnxruntime 1.32.0 CPU``); empty before the
        first model is loaded."""
        for versions in self._resident.values():
            for resident in versions.values():
                return resident.runtime.description
        return ""

    async def _evict(self, model: str) -> None:
        versions = self._resident[model]
        keep = {self._default[model], *sorted(versions, reverse=True)[:self.keep]}
        dropped = [v for v in versions if v not in keep]
        for version in dropped:
            resident = versions.pop(version)
            await resident.batcher.stop()  # drains what is queued first
            log.info("dropped %s version %s", model, version)
            for listener in self._listeners:
                listener.dropped(resident.manifest)
        if dropped:  # the dropped copies are unreferenced now: return their memory (see memory)
            await asyncio.to_thread(memory.trim)

    async def watch(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.settings.poll_interval_s)

    async def stop(self) -> None:
        for versions in self._resident.values():
            for resident in versions.values():
                await resident.batcher.stop()
        self._resident.clear()
        self._default.clear()
