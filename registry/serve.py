"""The ``registry serve`` entry point: owns the signals, the metrics endpoint and the server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import uvloop
from prometheus_client import start_http_server

from registry.server import SyncServer
from registry.settings import RegistrySettings
from serving.fleet import discovery
from serving.telemetry.logs import configure
from sync.metrics import SyncMetrics

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
    registration = _registration(settings, port)
    registering = asyncio.create_task(registration.run()) if registration else None
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    log.info("stopping")
    if registration is not None and registering is not None:
        registering.cancel()  # first, so it cannot register again
        with contextlib.suppress(asyncio.CancelledError):
            await registering
        await registration.deregister()
        await registration.consul.close()
    await server.stop(grace=5)
    if http is not None:
        http.shutdown()


def _registration(settings: RegistrySettings, port: int) -> discovery.Registration | None:
    if not settings.consul_http_addr:
        return None
    token = settings.consul_http_token
    client = discovery.client(settings.consul_http_addr,
                              token.get_secret_value() if token else None)
    target = f"{settings.advertised}:{port}"
    return discovery.Registration(
        client, discovery.SERVICES["registry"], f"registry-{settings.advertised}-{port}",
        settings.advertised, port,
        discovery.grpc_check(target, tls=settings.tls_cert is not None), tags=["registry"],
        meta=lambda: {"tier": "registry", "metrics_port": str(settings.metrics_port or "")})


def run(settings: RegistrySettings) -> None:
    configure("registry", "INFO", None, 10 * 1024 * 1024, 3)
    uvloop.run(serve(settings))
