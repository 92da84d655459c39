"""Prometheus's targets from Consul: Debian's Prometheus 2.42 has no ``consul_sd_configs``, so
this renderer (the nginx renderer's pattern: consul-template's job, kept small) follows every
Tiered service in Consul with blocking queries and writes one ``file_sd_configs`` file per scrape
job (``edge.json``, ``center.json``, ``registry.json``) atomically, only when its text changes.
Prometheus watches the files and picks a change up without a reload: a node that registers is
scraped within seconds; a node whose checks fail stays listed until Consul reaps it, so its
``up`` is 0 and the node-down alert can fire.

Every value comes from the catalog, which anyone holding a service token writes: only entries
that pass discovery's checks (``serving.fleet.discovery.instance``: id, address, port, meta each
against a strict pattern) become targets, and only as JSON values, never pasted into YAML.

    python -m tiered.monitoring.targets --consul 127.0.0.1:8500 --out var/prometheus/targets
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import click
import uvloop

from nginx.process import write_atomically
from nginx.render import consul_token
from serving.fleet import discovery
from serving.fleet.discovery import Instance
from serving.telemetry.logs import configure

log = logging.getLogger("tiered.targets")
# scrape job -> the Consul services whose instances it scrapes
JOBS = {"edge": ("edge",), "center": ("center",), "registry": ("registry", "registry-standby")}


def targets(service: str, instances: Iterable[Instance]) -> list[dict[str, Any]]:
    """The file_sd entries of ``service``'s instances, sorted by node. Centers and edges serve
    /metrics on their HTTP port; a registry on its ``metrics_port`` meta (none: not scraped)."""
    found = []
    tier = "registry" if service.startswith("registry") else service
    for i in sorted(instances, key=lambda i: i.service_id):
        port = i.metrics_port if tier == "registry" else i.port
        if port is None:
            continue
        found.append({"targets": [discovery.host_port(i.address, port)],
                      "labels": {"node": i.service_id, "region": i.region, "tier": tier,
                                 "service": discovery.SERVICES[service]}})
    return found


class TargetFiles:
    """The last instances of each followed service; each change rewrites its job's file."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.instances: dict[str, list[Instance]] = {}

    def path(self, job: str) -> Path:
        return self.out / f"{job}.json"

    def write_empty(self) -> None:
        """An empty list per job, before the first watch answers (Prometheus reads the files
        at start; a missing one is only a warning, an empty one is no target)."""
        self.out.mkdir(parents=True, exist_ok=True)
        for job in JOBS:
            if not self.path(job).is_file():
                write_atomically(self.path(job), "[]\n")

    def follow(self, service: str) -> discovery.OnChange:
        def changed(found: list[Instance]) -> None:
            self.instances[service] = found
            job = next(j for j, services in JOBS.items() if service in services)
            entries = [e for s in JOBS[job] for e in targets(s, self.instances.get(s, []))]
            if write_atomically(self.path(job), json.dumps(entries, indent=1) + "\n"):
                log.info("prometheus targets: %s: %s", job,
                         [e["labels"]["node"] for e in entries] or "none")
        return changed


async def serve(files: TargetFiles, consul_addr: str, token: str | None) -> None:
    """Follow every service of ``JOBS`` until SIGTERM/SIGINT; a watch that ends stops the
    renderer with an error (its supervisor restarts it)."""
    client = discovery.client(consul_addr, token)
    tasks = [asyncio.create_task(discovery.Watch(client, discovery.SERVICES[s], files.follow(s),
                                                 passing_only=False).run())
             for services in JOBS.values() for s in services]
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    for task in tasks:
        task.add_done_callback(lambda t: stopping.set())
    await stopping.wait()
    failed = [t.exception() for t in tasks if t.done() and not t.cancelled() and t.exception()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await client.close()
    if failed:
        raise SystemExit(f"a Consul watch ended: {failed[0]}")


@click.command()
@click.option("--consul", "consul_addr", envvar="CONSUL_HTTP_ADDR", default="127.0.0.1:8500",
              show_default=True, help="Consul's HTTP address (CONSUL_HTTP_ADDR).")
@click.option("--consul-token-file", type=click.Path(path_type=Path, dir_okay=False),
              envvar="CONSUL_HTTP_TOKEN_FILE", default=None,
              help="File holding the read-only Consul ACL token; the token itself comes only "
                   "from the environment (CONSUL_HTTP_TOKEN), never a flag.")
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="Folder of the file_sd files (edge.json, center.json, registry.json).")
@click.option("--log-level", default="info", show_default=True, help="Log level.")
def main(consul_addr: str, consul_token_file: Path | None, out: Path, log_level: str) -> None:
    """Render Prometheus's scrape targets from Consul's catalog (CONSUL_HTTP_TOKEN: a
    read-only token)."""
    configure("tiered-targets", log_level, None, 0, 0)
    token = consul_token(consul_token_file)
    files = TargetFiles(out)
    files.write_empty()
    uvloop.run(serve(files, consul_addr, token))


if __name__ == "__main__":
    main()
