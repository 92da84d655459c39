"""Decoys and deregistrations by a holder of the edge role's Consul token must not empty the
entry nginx (``--edge-ca``): the renderer renders an edge once its address has proven, in a
TLS handshake checked against the fleet CA, the node its entry names; a decoy at a real
edge's address is dropped, never the edge; an edge that left the catalog and still answers as
itself is held; a catalog change alone never goes from some edges to none. The edges here
are small HTTPS servers with real certificates from a test CA."""

from __future__ import annotations

import asyncio
import http.server
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.processes import free_port
from nginx.entry import Entry, config
from nginx.fleet import Fleet
from nginx.guard import EdgeGuard, one_per_address
from nginx.metrics import DROPPED, HELD
from nginx.probe import Prober, ProbeVerdict, client_context
from nginx.process import Nginx
from nginx.render import reverify
from nginx.renderer import Renderer
from nginx.upstreams import upstreams
from registry.trust import pki
from serving.fleet.discovery import Instance
from tests.faults import JsonHandler

from .test_nginx_guard_render import NGINX, edge
from .test_nginx_render import block


class Ready(JsonHandler):
    def do_GET(self) -> None:  # the stdlib's name
        self.reply(200, {"ready": True})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def tls(tmp_path: Path) -> Path:
    folder = tmp_path / "tls"
    pki.ca(folder)
    return folder


def cert(tls: Path, node_id: str) -> tuple[Path, Path]:
    pem, key = pki.node(tls, node_id, "edge", "us", hosts=("127.0.0.1",))
    (tls / f"{node_id}.pem").write_bytes(pem)
    (tls / f"{node_id}.key").write_bytes(key)
    return tls / f"{node_id}.pem", tls / f"{node_id}.key"


@contextmanager
def node(tls: Path | None, node_id: str, port: int = 0) -> Iterator[int]:
    """An HTTPS server with ``node_id``'s own certificate (plain HTTP without ``tls``) on
    ``port`` (0: a free one), in a thread; yields its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Ready)
    if tls is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(*cert(tls, node_id))
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def guard(tls: Path, clock: Callable[[], float] = time.monotonic, **holds: float) -> EdgeGuard:
    return EdgeGuard(Prober(client_context(tls / "ca.pem"), clock=clock), **holds)


def screen(g: EdgeGuard, edges: list[Instance]) -> tuple[list[str], dict[str, str]]:
    """The service ids rendered, and the reason each one left out was."""
    kept, dropped = asyncio.run(g.screen(edges))
    return [i.service_id for i in kept], {d.service_id: d.reason for d in dropped}


def test_a_handshake_proves_only_the_node_the_certificate_names(tls: Path) -> None:
    with node(tls, "edge-us-1") as real, node(None, "plain") as plain:
        prober = Prober(client_context(tls / "ca.pem"))
        keys = [("edge-us-1", "127.0.0.1", real), ("decoy-1", "127.0.0.1", real),
                ("edge-us-1", "127.0.0.1", free_port()), ("edge-us-2", "127.0.0.1", plain)]
        assert asyncio.run(prober.check(keys)) == dict(zip(keys, [
            ProbeVerdict.PROVEN, ProbeVerdict.WRONG, ProbeVerdict.SILENT, ProbeVerdict.WRONG],
            strict=True))
        # bounded: past max_probes, the rest wait (the refreshes and the forced first)
        bounded = Prober(client_context(tls / "ca.pem"), max_probes=1)
        assert asyncio.run(bounded.check(keys, forced=[keys[1]])) == {keys[1]: ProbeVerdict.WRONG}
        assert asyncio.run(bounded.check(keys)) == {keys[0]: ProbeVerdict.PROVEN,
                                                    keys[1]: ProbeVerdict.WRONG}


def test_a_decoy_at_each_real_edges_address_is_dropped_never_the_edge(tls: Path) -> None:
    """The finding: one decoy per real edge at that edge's own address under a new id; the
    renderer dropped every address two entries claim, and nginx had no edge left."""
    with node(tls, "edge-us-1") as one, node(tls, "edge-us-2") as two:
        real = [edge("edge-us-1", "127.0.0.1", one), edge("edge-us-2", "127.0.0.1", two)]
        decoys = [edge("decoy-1", "127.0.0.1", one), edge("decoy-2", "127.0.0.1", two, grpc=one)]
        g = guard(tls)
        assert screen(g, real) == (["edge-us-1", "edge-us-2"], {})
        assert screen(g, [*real, *decoys]) == (
            ["edge-us-1", "edge-us-2"], {"decoy-1": "wrong_identity", "decoy-2": "wrong_identity"})
        kept, _ = asyncio.run(g.screen([*decoys, *real]))
        conf = upstreams(Fleet(edges=kept, edge_tls=True))
        assert block(conf, "tiered_edges_us") == [f"server 127.0.0.1:{one} max_fails=0;",
                                                  f"server 127.0.0.1:{two} max_fails=0;"]
        assert "decoy" not in conf


def test_an_entry_counts_only_once_its_address_proved_its_node(tls: Path) -> None:
    """Nothing answering yet: not rendered (unverified); answering as another node (the entry
    of edge-us-2 moved to edge-us-1's address): not rendered (wrong_identity); a gRPC port
    that has not proven the node is left out, the HTTP one rendered."""
    with node(tls, "edge-us-1") as one:
        silent = free_port()
        entries = [edge("edge-us-1", "127.0.0.1", one, grpc=silent),
                   edge("edge-us-2", "127.0.0.1", free_port()),
                   edge("edge-us-3", "127.0.0.1", one)]
        g = guard(tls)
        kept, dropped = asyncio.run(g.screen(entries))
        assert [i.service_id for i in kept] == ["edge-us-1"] and kept[0].grpc_port is None
        assert {d.service_id: d.reason for d in dropped} == {"edge-us-2": "unverified",
                                                              "edge-us-3": "wrong_identity"}


def test_n_to_zero_on_the_catalogs_word_is_refused_n_to_n_minus_1_when_verified(
        tls: Path) -> None:
    clock = Clock()
    g = guard(tls, clock, hold_s=60.0, silent_hold_s=10.0)
    with node(tls, "edge-us-1") as one:
        e1 = edge("edge-us-1", "127.0.0.1", one)
        with node(tls, "edge-us-2") as two:
            e2 = edge("edge-us-2", "127.0.0.1", two)
            assert screen(g, [e1, e2])[0] == ["edge-us-1", "edge-us-2"]
            clock.now += 1
            # edge-us-2 deregistered while it answers as itself: held, and said so
            assert screen(g, [e1])[0] == ["edge-us-1", "edge-us-2"]
            assert HELD.labels("departed")._value.get() == 1
        # edge-us-2 stopped: a backup only (tried if no other answers), then after
        # silent_hold_s it goes (N -> N-1, verified)
        clock.now += 6
        kept, _ = asyncio.run(g.screen([e1]))
        assert [(i.service_id, i.passing) for i in kept] == [("edge-us-1", True),
                                                             ("edge-us-2", False)]
        clock.now += 5
        assert screen(g, [e1])[0] == ["edge-us-1"]
        assert HELD.labels("departed")._value.get() == 0
        # every entry deregistered while the last edge answers: held, then kept as the last
        clock.now += 1
        assert screen(g, [])[0] == ["edge-us-1"]
        clock.now += 61
        assert screen(g, [])[0] == ["edge-us-1"]
        assert HELD.labels("last")._value.get() == 1
        # a decoy registered meanwhile does not replace it
        assert screen(g, [edge("decoy-1", "127.0.0.1", one)]) == (
            ["edge-us-1"], {"decoy-1": "wrong_identity"})
    clock.now += 11
    assert screen(g, [])[0] == []  # it no longer answers: none left, verified
    assert HELD.labels("last")._value.get() == 0


def test_a_deregistration_and_its_re_registration_change_nothing_nginx_is_given(
        tls: Path) -> None:
    """One round of the deregistration loop: the edge leaves the catalog (held), comes back
    failing (Consul starts a new entry's checks critical). Each step used to change the file
    (the order of held and listed edges, the edge demoted to a backup), and each change is a
    reload that closes clients' idle keep-alive connections. A check that fails with no
    departure still demotes it at once, and the grace ends REJOIN_S after it last passed."""
    clock = Clock()
    g = guard(tls, clock)

    def conf(edges: list[Instance]) -> str:
        return upstreams(Fleet(edges=asyncio.run(g.screen(edges))[0], edge_tls=True))

    with node(tls, "edge-us-1") as one, node(tls, "edge-us-2") as two:
        e1, e2 = edge("edge-us-1", "127.0.0.1", one), edge("edge-us-2", "127.0.0.1", two)
        failing = edge("edge-us-1", "127.0.0.1", one, passing=False)
        steady = conf([e1, e2])
        for edges in ([e2], [failing, e2], [e2], [failing, e2]):
            clock.now += 1
            assert conf(edges) == steady
        clock.now += 30
        assert f"127.0.0.1:{one} max_fails=0 backup;" in conf([failing, e2])
        assert conf([e1, e2]) == steady
        clock.now += 1
        assert f"127.0.0.1:{one} max_fails=0 backup;" in conf([failing, e2])


def test_an_address_two_proofs_claim_goes_to_the_latest() -> None:
    a, b = edge("edge-us-1", "10.0.0.1", 8000), edge("edge-us-2", "10.0.0.1", 8000)
    chosen, losers = one_per_address([a, b], {("edge-us-1", "10.0.0.1", 8000): 5.0,
                                              ("edge-us-2", "10.0.0.1", 8000): 9.0})
    assert chosen == [b] and [i.service_id for i, _ in losers] == ["edge-us-1"]


def tls_renderer(tmp_path: Path, tls: Path, g: EdgeGuard) -> Renderer:
    assert NGINX is not None
    (tmp_path / "tmp").mkdir()
    entry = Nginx("entry", tmp_path, NGINX)
    entry.conf.write_text(config(tmp_path, "127.0.0.1:1", 10, 10, "1m", tmp_path,
                                 Entry(edge_ca=tls / "ca.pem")))
    return Renderer(entry, edge_tls=True, guard=g)


@pytest.mark.skipif(NGINX is None, reason="needs the nginx binary (nginx -t)")
def test_the_renderer_renders_a_new_edge_once_it_answers_with_no_catalog_change(
        tmp_path: Path, tls: Path) -> None:
    """An edge is listed before it listens (a start, a restart on a new port): it is rendered
    as soon as its handshake proves it, not at the catalog's next change; the decoys stay out
    and the metric says why."""
    renderer = tls_renderer(tmp_path, tls, guard(tls))
    port = free_port()
    renderer.fleet.edges = [edge("edge-us-1", "127.0.0.1", port),
                            edge("decoy-1", "127.0.0.1", port)]
    upstreams_conf = renderer.entry.upstreams_conf

    async def scenario() -> tuple[str, str]:
        await renderer.render()
        before = upstreams_conf.read_text()
        task = asyncio.create_task(reverify(renderer, every=0.05))
        with node(tls, "edge-us-1", port):
            for _ in range(100):
                await asyncio.sleep(0.05)
                if f"127.0.0.1:{port}" in upstreams_conf.read_text():
                    break
        task.cancel()
        return before, upstreams_conf.read_text()

    before, after = asyncio.run(scenario())
    assert f"127.0.0.1:{port}" not in before
    assert block(after, "tiered_edges_us") == [f"server 127.0.0.1:{port} max_fails=0;"]
    assert "edge-us-1.edge.tiered.invalid" in after and "decoy" not in after
    assert renderer.entry.test_config() is None
    assert DROPPED.labels("edges", "wrong_identity")._value.get() == 1
