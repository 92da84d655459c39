"""One click command per tier, its flags generated from the tier's settings (env mirrored)."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

import click
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from serving.config import environment
from serving.config.flags import options
from serving.process import Process
from serving.release.signing import SigningError
from serving.telemetry import tracing
from serving.telemetry.logs import configure
from serving.telemetry.quality_pool import QualityPool
from serving.transport import ports, workers
from serving.transport.httpserver import BoundedConfig, GatheringHttpToolsProtocol
from serving.transport.listener import BoundedServer, Channel, ListeningSocket, Source
from serving.transport.rest import create_app
from serving.transport.rpc import GrpcTransport

log = logging.getLogger(__name__)


def tier_command(name: str, settings_cls: type[BaseSettings],
                 wire: Callable[[Any], Process]) -> click.Command:
    """The tier's command: settings from flags and environment, then ``wire`` builds the
    process (service, data plane, node) that the HTTP app serves under uvicorn, with the gRPC
    transport on ``grpc_port`` beside it."""

    def run(**flags: Any) -> None:
        overrides = {key: value for key, value in flags.items() if value is not None}
        try:
            settings = settings_cls(**overrides)
        except ValidationError as exc:
            raise click.UsageError(f"invalid settings: {exc}") from exc
        s: Any = settings
        configure(name, s.log_level, s.log_file, s.log_max_bytes, s.log_backups)
        worker = environment.worker_index()
        caps = ports.caps(ports.raise_nofile(), s.max_connections, s.grpc_max_connections)
        if s.workers > 1 and worker is None:  # the supervisor: N copies of this command
            raise SystemExit(workers.supervise(_listen(s.host, s.port), s.workers, s.threads))
        if worker is not None:
            settings = s = settings.model_copy(update={
                "threads": workers.threads_per_worker(s.threads, s.workers)})
        try:
            process = wire(settings)
        except SigningError as exc:
            raise click.UsageError(str(exc)) from exc
        if worker:  # not the first worker: serve HTTP only; worker 0 is the node
            process.node.primary = False
        elif s.grpc_port:
            process.transports.append(GrpcTransport(process.plane, s, caps.grpc))
        _pool_quality(process, worker)
        app = create_app(process.plane, process)
        tracing.configure(f"tiered-{name}", s.node_id)  # OTEL_* variables; off when unset
        # uvicorn owns SIGINT/SIGTERM: it stops accepting, drains in-flight requests (up to the
        # grace period), then runs the lifespan shutdown that drains the batchers.
        # Each connection is bounded by the protocol (serving/transport/httpserver.py): header
        # and body timeouts, keep-alive, and the process's connection cap under its open files
        # limit (serving/transport/ports.py), counted from the accept, before TLS
        # (serving/transport/listener.py).
        bounds = ports.HttpBounds(s.header_timeout_s, s.body_timeout_s, caps.http)
        log.info("connections: at most %d HTTP, %d gRPC (open files limit %d); header timeout "
                 "%g s, body %g s, keep-alive %g s", caps.http, caps.grpc, caps.nofile,
                 s.header_timeout_s, s.body_timeout_s, s.keep_alive_timeout_s)
        config = BoundedConfig(app, bounds, host=s.host, port=s.port, loop="uvloop",
                               http=GatheringHttpToolsProtocol,
                               log_config=None, access_log=False,
                               timeout_keep_alive=s.keep_alive_timeout_s,
                               timeout_graceful_shutdown=10, ssl_certfile=s.tls_cert,
                               ssl_keyfile=s.tls_key)
        # one process listens itself; one of several workers takes what the supervisor accepted
        channel = environment.channel_fd()
        source: Source = ListeningSocket(_listen(s.host, s.port)) if channel is None else \
            Channel(socket.socket(fileno=channel))
        try:
            BoundedServer(config, source).run()
        finally:
            tracing.shutdown()  # the spans still batched go out

    command = click.Command(name, callback=run, help=f"Run the {name} tier (Open Inference "
                            f"Protocol V2 over HTTP and gRPC).",
                            context_settings={"help_option_names": ["-h", "--help"]})
    return options(settings_cls)(command)


def _pool_quality(process: Process, worker: int | None) -> None:
    """With several workers, worker 0's quality reports count every worker's traffic."""
    folder = environment.shared_folder()
    if worker is None or folder is None:
        return
    pool = QualityPool(folder / "quality", worker)
    quality = process.plane.metrics.quality
    if worker:
        process.transports.append(pool.shipper(quality))
    else:
        quality.inflows.append(pool.take)


def _listen(host: str, port: int) -> socket.socket:
    try:
        return workers.listen(host, port)
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: "
                                   f"{exc.strerror or exc}") from exc
