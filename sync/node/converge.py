"""What the node does with a release the registry pushed: check it, then, per model, converge
on the newest one wanted.

A release is refused before anything is fetched when its manifest does not check out, its
signature does not verify, or (with a release key) its signed directive for this node is older
than the newest accepted (``sync.wire.directive``: a replayed older release). Otherwise a worker per
model fetches the tier's artifacts (resumable, verified), installs them into the store, loads +
warms + swaps (``Repository.activate``), keeps the active and the previous version on disk and
acks ``ACTIVE``. On failure it acks ``FAILED``, keeps serving what it served, and retries with
backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from serving import tasks
from serving.config.settings import ServingSettings
from serving.release import hardware
from serving.release.manifest import Manifest, NewerSchema, decode
from serving.release.probe import FidelityRefused, Measured
from serving.release.signing import ReleaseCheck, SigningError
from serving.release.store import StoreError, check_release
from serving.release.trust import Director, NodeTrust
from serving.runtime.repository import Repository
from sync.gen import sync_pb2 as pb
from sync.node.download import Downloader
from sync.wire import directive
from sync.wire.backoff import Backoff
from sync.wire.directive import DirectiveError, Directives

log = logging.getLogger(__name__)
Send = Callable[[pb.NodeMessage], Awaitable[None]]  # best effort: dropped while disconnected


@dataclass
class Wanted:
    manifest: Manifest
    changed: asyncio.Event
    raw: bytes = b""  # the manifest exactly as signed
    signature: bytes = b""
    seq: int = 0  # the seq of the release's signed directive (0: none), reported in its acks


def directive_seq(data: bytes) -> int:
    """The seq a release's directive carries (0: none or unreadable). Reported back in acks,
    so the registry learns the highest audit seq its nodes have seen (``registry audit
    --verify`` compares the chain with it)."""
    if not data:
        return 0
    try:
        return directive.parse(data).seq
    except DirectiveError:
        return 0


def platform_message(repository: Repository,
                     platform: hardware.Platform | None = None) -> pb.Platform:
    """This node's hardware (or ``platform``) as the hello and fidelity acks carry it."""
    p = platform or hardware.here(repository.runtime())
    return pb.Platform(cpu=p.cpu, machine=p.machine, features=p.features, runtime=p.runtime)


def node_directives(settings: ServingSettings, store_root: Path,
                    verifier: ReleaseCheck | None) -> Directives | None:
    """The node's directive checks: with a release key only (without one nothing is verified
    at all), floored at ``settings.directive_floor`` (its bundle's). With TUF trust, a
    directive is verified with root's timestamp keys (the registry's online key)."""
    if verifier is None:
        return None
    checker = Director(verifier) if isinstance(verifier, NodeTrust) else verifier
    return Directives(store_root, settings.node_id, checker, floor=settings.directive_floor)


class Converger:
    """Per model, one worker applying the newest wanted release; acks go out through ``send``."""

    def __init__(self, settings: ServingSettings, repository: Repository,
                 downloads: Downloader, send: Send) -> None:
        self.settings, self.repository, self.downloads, self.send = (settings, repository,
                                                                     downloads, send)
        self.store, self.tier = repository.store, repository.tier
        self._wanted: dict[str, Wanted] = {}
        # with a release key, pushed releases also need a signed directive no older than the
        # newest accepted (downgrade protection); without one nothing is verified at all
        self.directives = node_directives(settings, self.store.root, self.store.verifier)
        self._workers: dict[str, asyncio.Task[None]] = {}

    async def forget(self) -> None:
        """A new stream: the registry answers the hello with every release the node must
        change to, and sends nothing for a model whose desired version the node already
        serves. So what an earlier stream asked for and is still in flight is void: it may be
        a version rolled back while the registry was away, which must not be swapped in."""
        await self.stop()
        self._wanted.clear()

    async def stop(self) -> None:
        """Cancel every worker and wait for it to end."""
        await tasks.stop(*self._workers.values())
        self._workers.clear()

    async def drop(self, model: str) -> None:
        """Stop converging on ``model`` (it was retired): its worker cancelled, what it was
        to install forgotten."""
        await tasks.stop(self._workers.pop(model, None))
        self._wanted.pop(model, None)

    async def desire(self, release: pb.Release) -> None:
        if hashlib.sha256(release.manifest).hexdigest() != release.manifest_sha256:
            log.error("release %s v%s: manifest does not match its sha256; ignored",
                      release.model, release.version)
            return
        try:
            manifest = decode(release.manifest)
        except NewerSchema as exc:  # signed or not, the reason is ours: say it, serve on
            log.error("refused %s version %s: %s", release.model, release.version, exc)
            await self.send(pb.NodeMessage(ack=pb.Ack(
                model=release.model[:128], version=release.version, state=pb.REFUSED,
                reason=str(exc))))
            return
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
        wanted.seq = directive_seq(release.directive)
        wanted.changed.set()
        worker = self._workers.get(manifest.name)
        if worker is None or worker.done():
            self._workers[manifest.name] = asyncio.create_task(self._converge(manifest.name))

    def _refusal(self, release: pb.Release, manifest: Manifest) -> str | None:
        """Why this release must not be installed at all (None: it may be)."""
        try:
            check_release(manifest)
            trust = self.store.verifier
            if isinstance(trust, NodeTrust) and trust.established:
                trust.check_release(manifest, release.manifest)
            elif self.store.verifier is not None:
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
        wanted = self._wanted.get(manifest.name)
        if wanted is not None and wanted.manifest is manifest:  # the directive it acted on
            ack.directive_seq = wanted.seq
        if fidelity is not None:
            ack.fidelity, ack.fidelity_rows = fidelity.agreement, fidelity.rows
            ack.platform.CopyFrom(platform_message(self.repository, platform))
        await self.send(pb.NodeMessage(ack=ack))
