"""The node side of model sync, run by ``edge`` and ``center`` when a registry is configured.

One Sync stream to the registry: hello (what the store holds, what is served), then releases
pushed by the registry, which ``sync.node.converge`` checks and applies (acks go back up the
stream), retires (``sync.node.retiring``), escalation budgets for the edge's controller, and
quality reports sent every interval (``sync.node.reports``). A lost stream is re-opened with
exponential backoff and jitter; meanwhile the node serves its store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import grpc
from prometheus_client import CollectorRegistry

from serving import tasks
from serving.config.settings import ServingSettings
from serving.fleet.node import Node
from serving.protocol.budget import Budget
from serving.protocol.keepalive import KEEPALIVE, Keepalive
from serving.release.manifest import is_valid_name
from serving.release.trust import NodeTrust
from serving.runtime.repository import Repository
from serving.telemetry.metrics import Metrics
from serving.telemetry.quality import QualityWindow
from sync.gen import sync_pb2 as pb
from sync.gen import sync_pb2_grpc as pb_grpc
from sync.node import retiring
from sync.node.converge import Converger, platform_message
from sync.node.download import Downloader
from sync.node.reports import send_reports
from sync.node.stream import StreamSeries
from sync.node.transfer import DownloadMetrics
from sync.node.trusted import TrustFollower
from sync.node.witness_store import Witnesses
from sync.wire import auth
from sync.wire.backoff import Backoff
from sync.wire.errors import TransferError
from sync.wire.rate import rate

log = logging.getLogger(__name__)
# TUF targets list every release: up to trust.CONFIG's 8 MiB, and the rest
MAX_RECEIVE = ("grpc.max_receive_message_length", 12 << 20)


def client_options(keepalive: Keepalive = KEEPALIVE) -> list[tuple[str, int]]:
    """A node's channel to the registry: the fleet's keepalive, room for the TUF targets."""
    return [*keepalive.client(), MAX_RECEIVE]


class Subscriber:
    """The stream: its channel (moved when discovery moves the registry), hello, what arrives
    (releases to ``Converger``, budgets to ``on_budget``) and the one writer of what goes up."""

    def __init__(self, settings: ServingSettings, repository: Repository,
                 quality: QualityWindow, registry: CollectorRegistry, prefix: str,
                 target: Callable[[], str | None],
                 on_budget: Callable[[str, Budget], None] | None = None,
                 keepalive: Keepalive = KEEPALIVE) -> None:
        """``target`` names the registry (host:port) to use now: the static setting, or what
        Consul lists; None while there is none. ``on_budget``: where escalation budgets go
        (the edge's controller). ``keepalive``: the channel's pings (tests shorten them)."""
        self.on_budget, self.options = on_budget, client_options(keepalive)
        self.settings, self.repository, self.quality = settings, repository, quality
        self.store, self.tier, self.target = repository.store, repository.tier, target
        token = settings.registry_token.get_secret_value() if settings.registry_token else None
        self.metadata = auth.metadata(token)
        self.channel: grpc.aio.Channel | None = None
        self.stub: pb_grpc.SyncStub | None = None
        self._channel_target: str | None = None
        self.downloads = Downloader(self._stub, self.metadata, self.store,
                                    DownloadMetrics(prefix, registry), rate(settings.sync_mbit_s))
        self.stream = StreamSeries(registry, prefix)
        self.releases = Converger(settings, repository, self.downloads, self._send)
        self._call: grpc.aio.StreamStreamCall | None = None
        self._send_lock = asyncio.Lock()
        verifier = self.store.verifier
        self.trust = (TrustFollower(verifier, self._send, registry, prefix)
                      if isinstance(verifier, NodeTrust) else None)
        directives = self.releases.directives  # witnesses verify as directives do
        self.witnesses = Witnesses(self.store.root, directives.verifier if directives else None)

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
                self.stream.ended(target, exc, opened=self._call is not None)
            except Exception:  # never stop syncing for good: log it and reconnect
                log.exception("sync session with %s failed", target)
            finally:
                self._call = None
                self.stream.connected.set(0)
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
        self.channel = auth.channel(target, self.settings.registry_ca, self.options)
        self.stub, self._channel_target = pb_grpc.SyncStub(self.channel), target
        if previous is not None:
            await previous.close()

    async def _session(self, backoff: Backoff) -> None:
        await self.releases.forget()
        call = self._stub().Sync(metadata=self.metadata)
        await call.write(pb.NodeMessage(hello=self._hello()))
        welcome = await call.read()
        if welcome is grpc.aio.EOF:
            return
        self._call = call
        self.stream.connected.set(1)
        backoff.reset()
        log.info("subscribed to registry %s", self._channel_target)
        reporter = asyncio.create_task(send_reports(
            self.repository, self.quality, self._send, welcome.welcome.report_interval_s or 10.0))
        watcher = asyncio.create_task(self.trust.watch() if self.trust is not None
                                      else asyncio.sleep(0))
        try:
            while (message := await call.read()) is not grpc.aio.EOF:
                kind = message.WhichOneof("kind")
                if kind == "release":
                    await self.releases.desire(message.release)
                elif kind == "budget":
                    self._budget(message.budget)
                elif kind == "trust" and self.trust is not None:
                    await self.trust.update(message.trust)
                elif kind == "witness":
                    await asyncio.to_thread(self.witnesses.offer, message.witness)
                elif kind == "retire":
                    await retiring.obey(self.releases, message.retire)
        finally:
            await tasks.stop(reporter, watcher)

    def _hello(self) -> pb.Hello:
        s = self.settings
        trusted = self.trust.trust.state().root_version if self.trust is not None else 0
        hello = pb.Hello(node_id=s.node_id, tier=self.tier, region=s.region,
                         held=held(self.repository), root_version=trusted,
                         platform=platform_message(self.repository))
        if (witness := self.witnesses.message()) is not None:
            hello.witness.CopyFrom(witness)
        return hello

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

    async def close(self) -> None:
        await self.releases.stop()
        if self.channel is not None:
            await self.channel.close()


def held(repository: Repository) -> list[pb.Held]:
    """What the hello says the store holds: each model's complete versions, the one served."""
    found, store = [], repository.store
    for folder in sorted(store.root.iterdir()) if store.root.is_dir() else []:
        versions = store.versions(folder.name) if is_valid_name(folder.name) else []
        if versions:
            active = repository.default_version(folder.name) or 0
            found.append(pb.Held(model=folder.name, versions=versions, active=active))
    return found


def subscribe(node: Node, metrics: Metrics,
              on_budget: Callable[[str, Budget], None] | None = None) -> None:
    """Hand ``node`` a subscriber for its repository when it has a registry to follow: the one
    its settings name, or those Consul lists. ``on_budget``: the edge's escalation budgets."""
    if node.settings.registry or node.discovers:
        node.add(Subscriber(node.settings, node.repository, metrics.quality, metrics.registry,
                            metrics.prefix, node.registry_target, on_budget))
