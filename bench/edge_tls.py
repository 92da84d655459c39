"""What TLS from nginx to the edges costs: one edge (tiny release) behind the renderer's nginx,
once over plain HTTP and once with ``--edge-ca`` (TLS, the edge's own certificate checked for
its node name, session reuse, keep-alive), the same bounded wrk load on 127.0.0.1 each time.

    .venv/bin/python -m bench.edge_tls [--seconds 5] [--concurrency 8]

Prints req/s, p50 and p99 for both and the TLS/plain ratios. The edge keeps every row
(``threshold`` 0: no center). nginx's config is the renderer's own (``nginx.entry.config``
and ``upstreams``), written for a fleet of this one edge; Consul is not needed for this.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
import httpx

from bench.kit import cpu, machine_line, write_bodies
from bench.loadgen import Run, run_wrk
from harness.processes import BIN, TierProcess, free_port, start_tier
from harness.stores import fill_stores
from nginx.entry import Entry, config
from nginx.fleet import Fleet
from nginx.process import Nginx, write_atomically
from nginx.upstreams import upstreams
from registry.trust import pki
from serving.fleet.discovery import Instance

NODE = "edge-bench-1"
TEXTS = ["a tedious slog", "fine film", "a quiet, lovely, patient piece of work",
         "I want those two hours back", "the cast is wonderful"]


@contextmanager
def edge(work: Path, tls: Path | None) -> Iterator[TierProcess]:
    env = {"PATH": str(BIN)}
    if tls is not None:
        cert, key = pki.node(tls, NODE, "edge", "bench", hosts=("127.0.0.1",))
        (tls / "edge.pem").write_bytes(cert)
        (tls / "edge.key").write_bytes(key)
        env |= {"EDGE_TLS_CERT": str(tls / "edge.pem"), "EDGE_TLS_KEY": str(tls / "edge.key")}
    server = start_tier("edge", work / "edge", work, "--cache-size", "0", "--region", "bench",
                        timeout=120, env=env, ca=tls / "ca.pem" if tls else None, node_id=NODE)
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def entry(work: Path, port: int, edge_ca: Path | None) -> Iterator[str]:
    prefix = work / ("nginx-tls" if edge_ca else "nginx-plain")
    (prefix / "tmp").mkdir(parents=True, exist_ok=True)
    listen = f"127.0.0.1:{free_port()}"
    nginx = Nginx("entry", prefix, shutil.which("nginx") or "/usr/sbin/nginx")
    write_atomically(nginx.conf, config(prefix, listen, 100000, 100000, "1m", None,
                                        Entry(edge_ca=edge_ca)))
    fleet = Fleet(edges=[Instance(NODE, "127.0.0.1", port, ("edge",), {"region": "bench"})],
                  edge_tls=edge_ca is not None)
    write_atomically(nginx.upstreams_conf, upstreams(fleet))
    nginx.start()
    try:
        url = f"http://{listen}"
        for _ in range(100):
            try:
                if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
        else:
            raise RuntimeError("nginx never routed to the edge")
        yield url
    finally:
        nginx.stop()


def measure(work: Path, tls: Path | None, bodies: Path, concurrency: int,
            seconds: float) -> Run:
    with edge(work, tls) as server, entry(work, server.port,
                                          tls / "ca.pem" if tls else None) as url:
        run_wrk("wrk", f"{url}/v2/models/tiny/infer", bodies, concurrency, 1)  # warm up
        return run_wrk("wrk", f"{url}/v2/models/tiny/infer", bodies, concurrency, seconds)


@click.command()
@click.option("--seconds", default=5.0, show_default=True, help="Load per mode.")
@click.option("--concurrency", default=8, show_default=True, help="wrk connections.")
def main(seconds: float, concurrency: int) -> None:
    """nginx -> edge over plain HTTP vs TLS (--edge-ca): req/s and p99, same load."""
    from examples.sentiment.tiny import build_tiny_release  # torch: only when run

    with tempfile.TemporaryDirectory(prefix="bench-edge-tls-") as folder:
        work = Path(folder)
        fill_stores(work, build_tiny_release(work / "release"))
        bodies = write_bodies(TEXTS, work / "bodies.txt", threshold=0)
        tls = work / "tls"
        pki.ca(tls)
        plain = measure(work, None, bodies, concurrency, seconds)
        secure = measure(work, tls, bodies, concurrency, seconds)
    print(f"nginx -> one edge (tiny release, --cache-size 0), wrk -c{concurrency} "
          f"{seconds:g} s per mode, 127.0.0.1")
    print(f"CPU: {cpu()}")
    print(machine_line())
    print("| mode | req/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|")
    for name, run in (("plain HTTP", plain), ("TLS (--edge-ca)", secure)):
        print(f"| {name} | {run.rps:.0f} | {run.latency.percentile_ms(50):.2f} | "
              f"{run.latency.percentile_ms(99):.2f} | {run.errors} |")
    print(f"TLS/plain: req/s x{secure.rps / plain.rps:.3f}, p99 "
          f"x{secure.latency.percentile_ms(99) / plain.latency.percentile_ms(99):.3f}")


if __name__ == "__main__":
    main()
