"""The node side of model sync, run by ``edge`` and ``center`` when a registry is configured.

One Sync stream to the registry: hello (what the store holds, what is served), then releases
pushed by the registry. Per model, a worker converges on the newest desired release: fetch the
tier's artifacts (resumable, verified), install them into the store, load + warm + swap
(``Repository.activate``), keep the active and the previous version on disk, ack ``ACTIVE``.
On failure it acks ``FAILED``, keeps serving what it served, and retries with backoff. With a
release key, a release also needs a signed directive for this node no older than the newest it
accepted (``sync.directive``): a replayed older release is refused before anything is fetched.
A lost stream is re-opened with exponential backoff and jitter; meanwhile the node serves its
store.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from prometheus_client import CollectorRegistry, Gauge

from serving.config.settings import ServingSettings
from serving.errors import FidelityRefused
from serving.fleet.node import Node
from serving.protocol.budget import Budget
from serving.release import hardware
from serving.release.manifest import Manifest, decode, is_valid_name
from serving.release.probe import Measured
from serving.release.signing import SigningError
from serving.release.store import StoreError, check_release
from serving.runtime.repository import Repository
from serving.telemetry.metrics import Metrics
from serving.telemetry.quality import QualityWindow
from sync import auth, directive
from sync.directive import DirectiveError, Directives
from sync.download import Downloader, DownloadMetrics, TransferError
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
CLIENT_OPTIONS = [("grpc.keepalive_time_ms", 10_000), ("grpc.keepalive_timeout_ms", 5_000),
                  ("grpc.keepalive_permit_without_calls", 1)]


class Backoff:
    """Exponential backoff with full jitter: a fleet that lost the registry does not come back
    in lockstep."""

    def __init__(self, maximum: float, base: float = 0.5) -> None:
        self.maximum, self.base, self.failures = maximum, base, 0

    def next(self) -> float:
        delay = random.uniform(0, min(self.maximum, self.base * 2 ** self.failures))
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


@dataclass
class Wanted:
    manifest: Manifest
    changed: asyncio.Event
    raw: bytes = b""  # the manifest exactly as signed
    signature: bytes = b""


class Subscriber:
    def __init__(self, settings: ServingSettings, repository: Repository,
                 quality: QualityWindow, registry: CollectorRegistry, prefix: str,
                 target: Callable[[], str | None],
                 on_budget: Callable[[str, Budget], None] | None = None) -> None:
        """``target`` names the registry (host:port) to use now: the static setting, or what
        Consul lists; None while there is none. ``on_budget``: where escalation budgets go
        (the edge's controller)."""
        self.on_budget = on_budget
        self.settings, self.repository, self.quality = settings, repository, quality
        self.store, self.tier, self.target = repository.store, repository.tier, target
        token = settings.registry_token.get_secret_value() if settings.registry_token else None
        self.metadata = auth.metadata(token)
        self.channel: grpc.aio.Channel | None = None
        self.stub: pb_grpc.SyncStub | None = None
        self._channel_target: str | None = None
        self.downloads = Downloader(self._stub, self.metadata, self.store,
                                    DownloadMetrics(prefix, registry))
        self.connected = Gauge(f"{prefix}_sync_connected", "1 while the Sync stream to the "
                               "registry is open", registry=registry)
        self._wanted: dict[str, Wanted] = {}
        # with a release key, pushed releases also need a signed directive no older than the
        # newest accepted (downgrade protection); without one nothing is verified at all
        self.directives = (Directives(self.store.root, settings.node_id, self.store.verifier)
                           if self.store.verifier is not None else None)
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._call: grpc.aio.StreamStreamCall | None = None
        self._send_lock = asyncio.Lock()

    async def run(self) -> None:
        """Stay subscribed until cancelled."""
        await asyncio.to_thread(self.downloads.sweep)
        backoff = Backoff(self.settings.sync_backoff_max_s)
        if self.settings.registry is None and self.settings.registry_ca is None:
            # anyone who can register in Consul could name a registry: the token goes only to
            # a configured address, or to one that proves itself with the fleet CA
            log.error("not syncing: the registry would come from Consul, and without a CA to "
                      "check it (registry_ca) the token could go to an impostor; set "
                      "*_REGISTRY_CA (the fleet CA, `registry tls`) or *_REGISTRY")
            return
        while True:
            target = self.target()
            if target is None:  # Consul lists no passing registry (yet)
                await asyncio.sleep(backoff.next())
                continue
            await self._use(target)
            try:
                await self._session(backoff)
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, OSError) as exc:
                detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
                log.warning("registry %s: %s", target, detail)
            except Exception:  # never stop syncing for good: log it and reconnect
                log.exception("sync session with %s failed", target)
            finally:
                self._call = None
                self.connected.set(0)
            await asyncio.sleep(backoff.next())

    def _stub(self) -> pb_grpc.SyncStub:
        if self.stub is None:
            raise TransferError("no registry to fetch from yet")
        return self.stub

    async def _use(self, target: str) -> None:
        """Point the channel at ``target`` (a new one when discovery moved the registry)."""
        if target == self._channel_target:
            return
        previous = self.channel
        self.channel = auth.channel(target, self.settings.registry_ca, CLIENT_OPTIONS)
        self.stub, self._channel_target = pb_grpc.SyncStub(self.channel), target
        if previous is not None:
            await previous.close()

    async def _session(self, backoff: Backoff) -> None:
        await self._forget_wanted()
        call = self._stub().Sync(metadata=self.metadata)
        await call.write(pb.NodeMessage(hello=self._hello()))
        welcome = await call.read()
        if welcome is grpc.aio.EOF:
            return
        self._call = call
        self.connected.set(1)
        backoff.reset()
        log.info("subscribed to registry %s", self._channel_target)
        reporter = asyncio.create_task(self._report(welcome.welcome.report_interval_s or 10.0))
        try:
            while (message := await call.read()) is not grpc.aio.EOF:
                kind = message.WhichOneof("kind")
                if kind == "release":
                    await self._desire(message.release)
                elif kind == "budget":
                    self._budget(message.budget)
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter

    async def _forget_wanted(self) -> None:
        """A new stream: the registry answers the hello with every release the node must
        change to, and sends nothing for a model whose desired version the node already
        serves. So what an earlier stream asked for and is still in flight is void: it may be
        a version rolled back while the registry was away, which must not be swapped in."""
        workers = list(self._workers.values())
        for worker in workers:
            worker.cancel()
        for worker in workers:
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        self._workers.clear()
        self._wanted.clear()

    def _hello(self) -> pb.Hello:
        held = []
        root = self.store.root
        for folder in sorted(root.iterdir()) if root.is_dir() else []:
            versions = self.store.versions(folder.name) if is_valid_name(folder.name) else []
            if versions:
                active = self.repository.default_version(folder.name) or 0
                held.append(pb.Held(model=folder.name, versions=versions, active=active))
        s = self.settings
        return pb.Hello(node_id=s.node_id, tier=self.tier, region=s.region, held=held,
                        platform=self._platform())

    def _platform(self, platform: hardware.Platform | None = None) -> pb.Platform:
        p = platform or hardware.here(self.repository.runtime())
        return pb.Platform(cpu=p.cpu, machine=p.machine, features=p.features, runtime=p.runtime)

    def _budget(self, message: pb.Budget) -> None:
        if self.on_budget is None:
            return
        if not is_valid_name(message.model):
            log.warning("ignoring a budget for an invalid model name")
            return
        try:
            budget = Budget.checked(message.controlled, message.rows_per_s,
                                    message.capacity_rows_s, message.share)
        except ValueError as exc:
            log.warning("ignoring the budget for %s: %s", message.model, exc)
            return
        log.info("escalation budget for %s: %s", message.model,
                 f"{budget.rows_per_s:.1f} rows/s ({budget.share:.0%} of "
                 f"{budget.capacity_rows_s:.1f})" if budget.controlled else "none (calibrated "
                 "threshold)")
        self.on_budget(message.model, budget)

    async def _desire(self, release: pb.Release) -> None:
        if hashlib.sha256(release.manifest).hexdigest() != release.manifest_sha256:
            log.error("release %s v%s: manifest does not match its sha256; ignored",
                      release.model, release.version)
            return
        try:
            manifest = decode(release.manifest)
        except ValueError as exc:
            log.error("release %s v%s: unreadable manifest (%s); ignored", release.model,
                      release.version, exc)
            return
        if (manifest.name, manifest.version) != (release.model, release.version):
            log.error("release %s v%s carries the manifest of %s v%s; ignored", release.model,
                      release.version, manifest.name, manifest.version)
            return
        refusal = self._refusal(release, manifest)
        if refusal is not None:  # before anything is downloaded; what is served stays
            log.error("refused %s version %s: %s", manifest.name, manifest.version, refusal)
            await self._ack(manifest, pb.REFUSED, refusal)
            return
        if self.directives is not None:  # checked above: from now on nothing older passes
            await asyncio.to_thread(self.directives.accept, directive.parse(release.directive))
        wanted = self._wanted.get(manifest.name)
        if wanted is None:
            wanted = self._wanted[manifest.name] = Wanted(manifest, asyncio.Event())
        wanted.manifest, wanted.raw, wanted.signature = (manifest, release.manifest,
                                                         release.signature)
        wanted.changed.set()
        worker = self._workers.get(manifest.name)
        if worker is None or worker.done():
            self._workers[manifest.name] = asyncio.create_task(self._converge(manifest.name))

    def _refusal(self, release: pb.Release, manifest: Manifest) -> str | None:
        """Why this release must not be installed at all (None: it may be)."""
        try:
            check_release(manifest)
            if self.store.verifier is not None:
                self.store.verifier.check(release.manifest, release.signature,
                                          release.signing_key_id)
            if self.directives is not None:
                self.directives.check(release.directive, release.directive_signature,
                                      manifest.name, manifest.version, release.manifest_sha256)
        except (StoreError, SigningError, DirectiveError) as exc:
            return str(exc)
        return None

    async def _converge(self, model: str) -> None:
        """Apply the newest wanted release of ``model``; retry failures with backoff."""
        wanted = self._wanted[model]
        backoff = Backoff(self.settings.sync_backoff_max_s, base=1.0)
        while True:
            wanted.changed.clear()
            manifest = wanted.manifest
            try:
                await self._apply(manifest, wanted.raw, wanted.signature)
            except asyncio.CancelledError:
                raise
            except FidelityRefused as exc:  # this hardware gives the same figure next time
                log.error("refused %s version %s: %s", model, manifest.version, exc)
                await self._ack(manifest, pb.REFUSED, str(exc), exc.measured,
                                exc.platform)
                if not wanted.changed.is_set():
                    return
                continue
            except Exception as exc:  # any failure: report it, keep serving, try again later
                log.error("%s version %s failed: %s", model, manifest.version, exc)
                await self._ack(manifest, pb.FAILED, f"{type(exc).__name__}: {exc}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wanted.changed.wait(), backoff.next())
                continue
            if not wanted.changed.is_set():
                return

    async def _apply(self, manifest: Manifest, raw: bytes, signature: bytes) -> None:
        model, version = manifest.name, manifest.version
        previous = self.repository.default_version(model)
        if previous != version:
            if not await asyncio.to_thread(self.store.complete, manifest, self.tier, raw,
                                           signature or None):
                await self._ack(manifest, pb.DOWNLOADING)
                for artifact in manifest.artifacts(self.tier):
                    await self.downloads.get(artifact)
                await asyncio.to_thread(self.store.install, manifest, self.tier,
                                        self.downloads.take, False, raw, signature or None)
            if self._wanted[model].manifest is not manifest:
                return  # superseded while downloading (e.g. a rollback): never swap it in
            await self.repository.activate(model, version)
        keep = {version} | ({previous} if previous else set())
        removed = await asyncio.to_thread(self.store.prune, model, keep)
        if removed:
            log.info("removed %s versions %s from the store", model, removed)
        await self._ack(manifest, pb.ACTIVE, "", self.repository.fidelity(model, version))

    async def _ack(self, manifest: Manifest, state: pb.AckState, reason: str = "",
                   fidelity: Measured | None = None,
                   platform: hardware.Platform | None = None) -> None:
        ack = pb.Ack(model=manifest.name, version=manifest.version, state=state,
                     reason=reason[:1000])
        if fidelity is not None:
            ack.fidelity, ack.fidelity_rows = fidelity.agreement, fidelity.rows
            ack.platform.CopyFrom(self._platform(platform))
        await self._send(pb.NodeMessage(ack=ack))

    async def _send(self, message: pb.NodeMessage) -> None:
        """Best effort: while disconnected the message is dropped; the next hello tells the
        registry what the node holds and serves."""
        call = self._call
        if call is None:
            return
        async with self._send_lock:
            with contextlib.suppress(grpc.aio.AioRpcError, grpc.aio.UsageError,
                                     asyncio.InvalidStateError):
                await call.write(message)

    async def _report(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            served = [(m, v) for m in self.repository.models()
                      if (v := self.repository.default_version(m)) is not None]
            for report in self.quality.drain(served):
                message = _report_message(report)
                measured = self.repository.fidelity(message.model, message.version)
                message.fidelity = measured.agreement if measured else 0.0
                await self._send(pb.NodeMessage(report=message))

    async def close(self) -> None:
        for worker in self._workers.values():
            worker.cancel()
        for worker in self._workers.values():
            with contextlib.suppress(asyncio.CancelledError):
                await worker
        if self.channel is not None:
            await self.channel.close()


def _report_message(report: dict[str, object]) -> pb.QualityReport:
    message = pb.QualityReport()
    for key, value in report.items():
        if key in ("confidence", "tokens"):
            getattr(message, key).extend(pb.Bucket(**b) for b in value)  # type: ignore[attr-defined]
        else:
            setattr(message, key, value)
    return message


def subscribe(node: Node, metrics: Metrics,
              on_budget: Callable[[str, Budget], None] | None = None) -> None:
    """Hand ``node`` a subscriber for its repository when it has a registry to follow: the one
    its settings name, or those Consul lists. ``on_budget``: the edge's escalation budgets."""
    if node.settings.registry or node.discovers:
        node.add(Subscriber(node.settings, node.repository, metrics.quality, metrics.registry,
                            metrics.prefix, node.registry_target, on_budget))
