"""The ``registry serve`` entry point: owns the signals, the metrics endpoint and the server."""

from __future__ import annotations

import asyncio
import logging
import signal

import uvloop
from prometheus_client import start_http_server

from registry.settings import RegistrySettings
from serving.logs import configure
from sync.metrics import SyncMetrics
from sync.server import SyncServer

log = logging.getLogger("registry.serve")


async def serve(settings: RegistrySettings) -> None:
    metrics = SyncMetrics()
    http = None
    if settings.metrics_port is not None:
        http, _ = start_http_server(settings.metrics_port, addr=settings.host,
                                    registry=metrics.registry)
    server = SyncServer(settings, metrics)
    port = await server.start()
    tls = "TLS" if settings.tls_cert else "plaintext"
    log.info("registry serving sync on %s:%s (%s)%s", settings.host, port, tls,
             f", metrics on :{http.server_port}" if http else "",
             extra={"fields": {"grpc_port": port, "metrics_port":
                               http.server_port if http else None}})
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    log.info("stopping")
    await server.stop(grace=5)
    if http is not None:
        http.shutdown()


def run(settings: RegistrySettings) -> None:
    configure("registry", "INFO", None, 10 * 1024 * 1024, 3)
    uvloop.run(serve(settings))
