"""The node's side of the TUF metadata on the stream: verify each push, report the result, and
say so when the trusted timestamp expires while the stream is quiet (``serving.release.trust``
does the verifying)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry, Gauge

from serving.errors import SigningError
from serving.release.trust import NodeTrust, State
from sync.gen import sync_pb2 as pb

log = logging.getLogger(__name__)
Send = Callable[[pb.NodeMessage], Awaitable[None]]
CHECK_S = 1.0  # how often the expiry is looked at between pushes


class TrustFollower:
    def __init__(self, trust: NodeTrust, send: Send, registry: CollectorRegistry,
                 prefix: str) -> None:
        self.trust, self.send = trust, send
        self._said: State | None = None
        Gauge(f"{prefix}_trust_stale", "1 while the newest TUF timestamp that verified has "
              "expired (a frozen or replayed registry): nothing new is installed",
              registry=registry).set_function(lambda: float(trust.state().stale))
        Gauge(f"{prefix}_trust_expires_timestamp_seconds", "Unix time the newest TUF "
              "timestamp that verified expires", registry=registry).set_function(
                  lambda: trust.state().expires)
        Gauge(f"{prefix}_trust_root_version", "Version of the TUF root this node trusts",
              registry=registry).set_function(lambda: float(trust.state().root_version))

    async def update(self, message: pb.Trust) -> None:
        """Verify pushed metadata (python-tuf, off the event loop) and say how it went."""
        try:
            state = await asyncio.to_thread(self.trust.update, list(message.roots),
                                            message.timestamp, message.snapshot,
                                            message.targets)
            log.debug("release metadata: root %d, timestamp %d", state.root_version,
                      state.timestamp_version)
        except SigningError as exc:
            log.error("%s; keeping the release metadata trusted before", exc)
        await self.say(force=True)

    async def say(self, force: bool = False) -> None:
        """Tell the registry the state when it changed (or ``force``)."""
        state = self.trust.state()
        said = self._said
        if not force and said is not None and (said.stale, said.error) == (state.stale,
                                                                             state.error):
            return
        if state.stale and (said is None or not said.stale):
            log.error("release metadata is stale since %s: no fresh TUF timestamp from the "
                      "registry (frozen or replayed?); serving what is installed",
                      state.as_dict()["stale_since"])
        self._said = state
        await self.send(pb.NodeMessage(trust=pb.TrustState(
            root_version=state.root_version, timestamp_version=state.timestamp_version,
            expires=state.expires, stale=state.stale, error=state.error[:500])))

    async def watch(self) -> None:
        """Say so when the trusted timestamp expires while the stream is quiet."""
        while True:
            await asyncio.sleep(CHECK_S)
            await self.say()
