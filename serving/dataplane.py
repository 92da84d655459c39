"""The data plane both tiers serve, whatever the transport: infer, metadata, readiness and the
request accounting. The HTTP app (``serving/transport/rest.py``) and any later transport only
decode a request into a :class:`Request` and encode what comes back.

It sits on the tier's :class:`Service` (the edge's cascade, the center's model) and starts and
stops the model repository: ``start`` serves what the store holds, ``stop`` drains the batchers.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest, multiprocess

from serving.config import environment
from serving.config.settings import ServingSettings
from serving.errors import NotReady, ServingError
from serving.fleet.discovery import OnChange
from serving.inputs import Codec
from serving.inputs.work import Job
from serving.protocol import v2
from serving.runtime import classify
from serving.runtime.parsing import Gone, ParsePool
from serving.runtime.repository import Repository, Resident
from serving.telemetry import tracing
from serving.telemetry.metrics import Metrics
from serving.telemetry.refusals import RefusalLog

VERSION = "0.1.0"
# Requests above this many bytes (or the input kind's own bound: an image is decoded off the
# loop whatever its size) are parsed in a parse thread (``serving.runtime.parsing``), off the
# event loop, so health checks and the other requests keep being answered meanwhile; below it
# the hop costs more.
PARSE_INLINE_BYTES = 64 * 1024
MAX_PARSE_THREADS = 8  # the default's ceiling: decoding is CPU, more threads than cores idle


class Service(Protocol):
    """A tier: what it is called, its models, and how it answers parsed rows."""

    @property
    def name(self) -> str: ...  # server name in the server metadata

    @property
    def platform(self) -> str: ...  # model metadata platform (Triton's names)

    @property
    def repository(self) -> Repository: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def settings(self) -> ServingSettings: ...

    async def infer(self, resident: Resident, parsed: v2.Parsed) -> v2.InferResponse: ...

    def watches(self) -> dict[str, OnChange]: ...  # Consul services to follow, and how

    async def stop(self) -> None: ...


class Request(Protocol):
    """An inference request as a transport received it, parsed only once the model (and so the
    limits) is known."""

    @property
    def size(self) -> int: ...  # bytes received

    def parse(self, decoder: v2.Decoder) -> v2.Parsed: ...


class DataPlane:
    def __init__(self, service: Service, parsing: ParsePool, refusals: RefusalLog) -> None:
        """Built by :meth:`of` (the tier's wiring); ``parsing``: where requests are parsed,
        ``refusals``: where refused and slow ones are told."""
        self.service, self.parsing, self.refusals = service, parsing, refusals
        self.repository = service.repository
        self.metrics = service.metrics
        self._watch: asyncio.Task[None] | None = None  # the store watcher, from start to stop

    @classmethod
    def of(cls, service: Service) -> DataPlane:
        """The data plane of ``service``, its parse pool and refusal log from its settings."""
        s = service.settings
        threads = s.parse_threads or min(MAX_PARSE_THREADS, len(os.sched_getaffinity(0)))
        return cls(service, ParsePool(threads, s.parse_queue, s.parse_deadline_s),
                   RefusalLog(service.metrics, s.slow_request_s))

    async def start(self) -> None:
        """Serve what the store holds (edge autonomy: before any registry is reached)."""
        await self.repository.refresh()
        self._watch = asyncio.create_task(self.repository.watch())

    async def stop(self) -> None:
        """After the transports stopped taking requests: drain the batchers, release the tier."""
        if self._watch is not None:
            self._watch.cancel()
            await asyncio.gather(self._watch, return_exceptions=True)
        await self.service.stop()
        await self.repository.stop()
        self.parsing.close()

    def ready(self) -> list[str]:
        """The models served; :class:`NotReady` while there is none."""
        models = self.repository.models()
        if not models:
            raise NotReady("not ready: no model loaded yet")
        return models

    def notes(self) -> list[str]:
        """Warnings the readiness answer carries (Consul shows them as the check's output)."""
        notes = getattr(self.service, "notes", None)
        return notes() if notes is not None else []

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.service.name, "version": VERSION, "extensions": []}

    def model_metadata(self, model: str, version: str | None = None) -> dict[str, Any]:
        resident = self.repository.get(model, version)
        m = resident.manifest
        return {"name": model, "versions": [str(v) for v in self.repository.versions(model)],
                "platform": self.service.platform, "inputs": resident.codec.metadata(),
                "outputs": classify.outputs_metadata(resident),
                "parameters": {"labels": ",".join(m.labels),
                               "threshold": m.calibration.threshold}}

    def model_ready(self, model: str, version: str | None = None) -> dict[str, Any]:
        resident = self.repository.get(model, version)
        return {"name": model, "version": str(resident.version), "ready": True}

    async def infer(self, model: str, version: str | None, request: Request,
                    gone: Gone | None = None) -> v2.InferResponse:
        """Resolve the model, parse within its limits, let the tier answer; count the outcome.
        ``gone``: completes when the client has gone away (then its parsing is abandoned)."""
        resident = self.repository.get(model, version)
        started = time.perf_counter()
        if tracing.active():
            served = resident.manifest.model(self.repository.tier)
            tracing.set_attributes(**{"tiered.model": model, "tiered.version": resident.version,
                                      "tiered.release_digest": served.sha256,
                                      "tiered.request_bytes": request.size})
        job = self.parsing.job()
        try:
            parsed = await self._parse(request, resident.codec, job, gone)
            result = await self.service.infer(resident, parsed)
        except ServingError as exc:
            self.metrics.request_failure.labels(model, str(resident.version),
                                                type(exc).__name__).inc()
            if exc.reason:
                self.refusals.refused(model, exc.reason, str(exc),
                                      time.perf_counter() - started, job.cpu())
            raise
        seconds = time.perf_counter() - started
        success, duration = self.metrics.answered(model, resident.version)
        success.inc()
        duration.observe(seconds)
        self.metrics.quality.request(model, resident.version, seconds)
        self.refusals.answered(model, seconds, job.cpu())
        return result

    async def _parse(self, request: Request, codec: Codec, job: Job,
                     gone: Gone | None) -> v2.Parsed:
        """The request parsed: on the event loop when small (the hop costs more), else in the
        parse pool, bounded by its queue and the job's deadline."""
        if request.size <= min(PARSE_INLINE_BYTES, codec.inline_bytes):
            cpu = time.thread_time()
            try:
                return request.parse(codec)
            finally:
                job.cpu_s = time.thread_time() - cpu
        return await self.parsing.run(job, lambda: request.parse(codec), gone)

    def exposition(self) -> bytes:
        """The Prometheus text exposition of this process's metrics; with several workers
        (prometheus_client's multiprocess folder set), every worker's, summed."""
        folder = environment.metrics_folder()
        if folder is None:
            return generate_latest(self.metrics.registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, str(folder))
        ProcessCollector(registry=registry)  # the worker that answers: one of them, not a sum
        return generate_latest(registry)
