"""A node's Sync stream as its series and log show it: whether it is open
(``{prefix}_sync_connected``), and how open streams were cut from the registry's side or the
link (``{prefix}_sync_stream_cuts_total{reason}``), a GOAWAY for pinging too often with its
cause: the two ends' keepalive policies differ (``serving.protocol.keepalive``).

gRPC reports the GOAWAY a server sends a client that pings too often (``ENHANCE_YOUR_CALM``,
``too_many_pings``) as UNAVAILABLE "Too many pings"; other ends (a registry stopping:
"Cancelling all calls", a broken connection) are UNAVAILABLE with details that do not say
whether a GOAWAY came first, so they share one reason.
"""

from __future__ import annotations

import logging

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

log = logging.getLogger("sync.node.subscriber")  # the subscriber's lines, in its logger
CUTS = ("too_many_pings", "unavailable")
"""The only label values of ``*_sync_stream_cuts_total``."""


def cut_reason(exc: BaseException) -> str | None:
    """Why an open stream ended with ``exc`` (None: not from the registry's side or the
    link)."""
    if not isinstance(exc, grpc.aio.AioRpcError) or exc.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    details = (exc.details() or "").lower()
    return ("too_many_pings" if "too many pings" in details or "too_many_pings" in details
            else "unavailable")


class StreamSeries:
    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        self.connected = Gauge(f"{prefix}_sync_connected", "1 while the Sync stream to the "
                               "registry is open", registry=registry)
        self.cuts = Counter(f"{prefix}_sync_stream_cuts", "Open Sync streams cut from the "
                            "registry's side, by reason: too_many_pings (a GOAWAY: this node "
                            "pings more often than the registry permits), unavailable (the "
                            "registry stopped, or the connection broke)", ["reason"],
                            registry=registry)
        for reason in CUTS:
            self.cuts.labels(reason)

    def ended(self, target: str, exc: Exception, opened: bool) -> None:
        """Log why the stream (``opened``) or the attempt to open it failed; count a cut."""
        said = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
        reason = cut_reason(exc) if opened else None
        if reason is None:
            log.warning("registry %s: %s", target, said)
            return
        self.cuts.labels(reason).inc()
        hint = (" (the registry permits fewer keepalive pings than this node sends: their "
                "keepalive policies differ)" if reason == "too_many_pings" else "")
        log.warning("registry %s cut the Sync stream: %s%s", target, said, hint)
