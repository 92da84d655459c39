"""What one stolen edge (the edge role's Consul token) can no longer do to nginx's config:
freeze it with a host name that does not resolve, reach the center or the registry's metrics
through it, or pass for another edge (the per-node TLS name map)."""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path

import click
import pytest

import nginx.fleet as fleet_module
import nginx.render as render_module
from nginx import side
from nginx.entry import Entry, config
from nginx.fleet import KEEP_RESOLVED_S, Fleet, resolved
from nginx.metrics import DROPPED
from nginx.process import Nginx
from nginx.render import reresolve
from nginx.renderer import Renderer, checked
from nginx.upstreams import UNMAPPED_TLS_NAME, edge_tls_name, upstreams
from registry.trust.pki import node_name
from serving.fleet.discovery import Instance

from .test_nginx_render import block


def edge(sid: str, address: str, port: int, region: str = "us", grpc: int | None = None,
         passing: bool = True) -> Instance:
    meta = {"region": region} | ({"grpc_port": str(grpc)} if grpc else {})
    return Instance(sid, address, port, ("edge",), meta, passing)


def tls_map(conf: str) -> dict[str, str]:
    body = re.search(r"map \$upstream_addr \$tiered_edge_tls_name \{\n(.*?)\n\}", conf, re.S)
    assert body is not None
    lines = [line.strip().rstrip(";") for line in body.group(1).splitlines()]
    assert lines[0] == "volatile", "the name must be looked up again for each try"
    return dict(line.rsplit(" ", 1) for line in lines[1:])


def test_only_ip_literals_are_written_host_names_never() -> None:
    """nginx resolves a host name when it loads the config, and one that does not resolve
    fails nginx -t: the renderer writes only addresses it resolved itself."""
    fleet = Fleet(edges=[edge("edge-us-1", "127.0.0.1", 1001),
                         edge("edge-us-9", "nx-host.tiered.invalid", 1009),
                         edge("edge-us-8", "localhost", 1008)],
                  centers=[Instance("center-1", "center.example", 8100)])
    conf, side_conf = upstreams(fleet), side.upstreams(fleet)
    assert block(conf, "tiered_edges_us") == ["server 127.0.0.1:1001 max_fails=0;"]
    assert block(side_conf, "tiered_centers") == ["server 127.0.0.1:9 down;  # none passing"]
    for name in ("nx-host", "localhost", "center.example"):
        assert name not in conf and name not in side_conf


def test_the_renderer_resolves_host_names_itself_and_drops_those_that_do_not() -> None:
    fleet = Fleet(edges=[edge("edge-us-1", "127.0.0.1", 1001),
                         edge("edge-us-9", "nx-host.tiered.invalid", 1009),
                         edge("edge-us-8", "localhost", 1008)])
    found, dropped = asyncio.run(resolved(fleet))
    assert [(i.service_id, i.address) for i in found.edges] == [
        ("edge-us-1", "127.0.0.1"), ("edge-us-8", "127.0.0.1")]
    assert [(d.role, d.service_id, d.reason) for d in dropped] == [
        ("edges", "edge-us-9", "unresolvable")]
    assert "nx-host.tiered.invalid" in dropped[0].detail


def test_the_edge_tls_map_names_the_node_each_address_belongs_to() -> None:
    fleet = Fleet(edges=[edge("edge-us-1", "10.0.0.1", 8000, grpc=8001),
                         edge("edge-eu-1", "::1", 8000, region="eu")], edge_tls=True)
    names = tls_map(upstreams(fleet))
    assert names == {
        "default": UNMAPPED_TLS_NAME,
        r'"~(?:^|, )10\.0\.0\.1:8000$"': "edge-us-1.edge.tiered.invalid",
        r'"~(?:^|, )10\.0\.0\.1:8001$"': "edge-us-1.edge.tiered.invalid",
        r'"~(?:^|, )\[::1\]:8000$"': "edge-eu-1.edge.tiered.invalid"}
    assert edge_tls_name("edge-us-1") == node_name("edge-us-1", "edge")
    for pattern, name in names.items():  # the current peer is the last one tried
        if pattern != "default":
            regex = pattern.strip('"')[1:]
            address = regex.replace("(?:^|, )", "").replace("\\", "").rstrip("$")
            assert re.search(regex, f"10.9.9.9:1, {address}")
            assert not re.search(regex, f"{address}, 10.9.9.9:1"), name
    assert "$tiered_edge_tls_name" not in upstreams(Fleet(edges=fleet.edges))  # plain HTTP


def test_two_catalog_entries_for_one_address_render_neither() -> None:
    """The stolen edge re-registers its own address as edge-us-1 (or edge-us-1's address as
    itself): nginx cannot know which node it reaches there, so neither is rendered."""
    real = edge("edge-us-1", "10.0.0.1", 8000, grpc=8001)
    claim = edge("edge-stolen", "10.0.0.1", 8001)  # edge-us-1's gRPC port, as its HTTP port
    other = edge("edge-us-2", "10.0.0.2", 8000)
    conf = upstreams(Fleet(edges=[real, claim, other], edge_tls=True))
    assert block(conf, "tiered_edges_us") == ["server 10.0.0.2:8000 max_fails=0;"]
    assert "10.0.0.1" not in conf
    # plain HTTP names nothing: as before, both entries are one address
    assert block(upstreams(Fleet(edges=[real, claim, other])), "tiered_edges_us") == [
        "server 10.0.0.1:8000 max_fails=0;", "server 10.0.0.1:8001 max_fails=0;",
        "server 10.0.0.2:8000 max_fails=0;"]


def test_an_edge_whose_id_cannot_name_a_certificate_is_not_rendered_over_tls() -> None:
    conf = upstreams(Fleet(edges=[edge("Edge_US_1", "10.0.0.1", 8000),
                                  edge("edge-us-2", "10.0.0.2", 8000)], edge_tls=True))
    assert block(conf, "tiered_edges_us") == ["server 10.0.0.2:8000 max_fails=0;"]


def test_the_center_and_the_registry_metrics_are_off_unless_asked_for(tmp_path: Path) -> None:
    default = config(tmp_path, "127.0.0.1:8080", 10, 10, "1m", tmp_path)
    assert "location /center/v2/" not in default and "/registry/metrics" not in default
    assert "the center under" not in default
    exposed = Entry(expose_center=True, expose_registry_metrics=True, center_rate=7,
                    center_burst=14, side_socket=tmp_path / "side.sock")
    on = config(tmp_path, "127.0.0.1:8080", 10, 10, "1m", tmp_path, exposed)
    center = on[on.index("location /center/v2/"):]
    assert "limit_req zone=center_per_client burst=14 nodelay;" in center.split("}")[0]
    assert "zone=center_per_client:10m rate=7r/s;" in on
    metrics = on[on.index("location = /registry/metrics"):]
    assert "limit_req zone=metrics_per_client burst=2 nodelay;" in metrics.split("}")[0]
    assert "limit_req zone=metrics_all burst=4 nodelay;" in metrics.split("}")[0]
    # the limits are the entry's: the side behind it (a unix socket) sees no client address
    assert "limit_req" not in side.config(tmp_path, tmp_path, "1m", exposed)


def test_over_tls_the_entry_checks_each_edges_own_name(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-")
    plain = config(tmp_path, "127.0.0.1:8080", 10, 10, "1m", tmp_path,
                   Entry(grpc_listen="127.0.0.1:8081"))
    assert "proxy_pass http://$tiered_edge_pool;" in plain and "ssl" not in plain
    assert "grpc_pass grpc://$tiered_edge_grpc_pool;" in plain
    tls = config(tmp_path, "127.0.0.1:8080", 10, 10, "1m", tmp_path,
                 Entry(grpc_listen="127.0.0.1:8081", edge_ca=ca))
    for directive in ("proxy", "grpc"):
        for line in (f"{directive}_ssl_trusted_certificate {ca.resolve()};",
                     f"{directive}_ssl_verify on;", f"{directive}_ssl_server_name on;",
                     f"{directive}_ssl_name $tiered_edge_tls_name;",
                     f"{directive}_ssl_session_reuse on;"):
            assert line in tls, line
    assert "proxy_pass https://$tiered_edge_pool;" in tls
    assert "grpc_pass grpcs://$tiered_edge_grpc_pool;" in tls


def test_the_grpc_entry_passes_only_inference_and_health(tmp_path: Path) -> None:
    conf = config(tmp_path, "127.0.0.1:8080", 10, 10, "2m", tmp_path,
                  Entry(grpc_listen="127.0.0.1:8081"))
    grpc = conf[conf.index("listen 127.0.0.1:8081 http2;"):]
    routed = re.findall(r"location (\S+) \{[^}]*grpc_pass", grpc)
    assert routed == ["/inference.GRPCInferenceService/", "/grpc.health.v1.Health/"]
    rest = grpc[grpc.index("location / {"):].split("}")[0]
    assert "add_header grpc-status 12 always;" in rest and "return 200" in rest
    assert "error_page 413 = @grpc_too_large;" in grpc
    too_large = grpc[grpc.index("location @grpc_too_large"):].split("}")[0]
    assert "grpc-status 8 always" in too_large and "2m" in too_large


NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").is_file()
                                  else None)


def checking_renderer(tmp_path: Path, with_side: bool = False) -> Renderer:
    """A renderer (nginx not run) whose nginx.conf files pass ``nginx -t`` with this nginx:
    the entry's, and with ``with_side`` the side's (the center and the metrics exposed)."""
    assert NGINX is not None
    (tmp_path / "tmp").mkdir()
    entry, side_nginx = Nginx("entry", tmp_path, NGINX), None
    exposed = Entry(expose_center=with_side, expose_registry_metrics=with_side,
                    side_socket=tmp_path / "side.sock")
    entry.conf.write_text(config(tmp_path, "127.0.0.1:1", 10, 10, "1m", tmp_path, exposed))
    if with_side:
        side_nginx = Nginx("side", tmp_path / "side", NGINX)
        side_nginx.prefix.mkdir()
        side_nginx.conf.write_text(side.config(side_nginx.prefix, tmp_path, "1m", exposed))
    return Renderer(entry, side_nginx, exposed.side_roles)


@pytest.mark.skipif(NGINX is None, reason="needs the nginx binary (nginx -t)")
def test_a_candidate_that_fails_nginx_t_never_replaces_the_working_file(
        tmp_path: Path) -> None:
    """Whatever the reason a candidate fails nginx -t (here: a rendering that writes a host
    name for one entry, as the renderer did before), the entries it fails by are left out,
    said in the log and the metric, and the file nginx runs with always passes nginx -t."""
    renderer = checking_renderer(tmp_path)
    entry = renderer.entry
    good = Fleet(edges=[edge("edge-us-1", "127.0.0.1", 1001)])
    entry.upstreams_conf.write_text(upstreams(good))

    def naive(fleet: Fleet) -> str:  # host names pasted in, as before this change
        text = upstreams(fleet)
        named = [i for i in fleet.edges if i.service_id == "edge-us-9"]
        return text.replace("keepalive 16;\n}", "server nx-host.tiered.invalid:1009;\n"
                            "    keepalive 16;\n}", 1) if named else text

    bad = Fleet(edges=[*good.edges, edge("edge-us-9", "127.0.0.1", 1009),
                       edge("edge-us-2", "127.0.0.1", 1002)])
    assert entry.nginx_check(naive(bad)) is not None  # the candidate does fail
    text, dropped = checked(entry, bad, naive)
    assert text is not None and entry.nginx_check(text) is None
    assert [(d.service_id, d.reason) for d in dropped] == [("edge-us-9", "fails_nginx_check")]
    assert "127.0.0.1:1002" in text and "nx-host" not in text

    # the whole render: resolving, checking, swapping; the metric says what was left out
    renderer.fleet = Fleet(edges=[*good.edges, edge("edge-us-9", "nx-host.tiered.invalid",
                                                      1009)])
    asyncio.run(renderer.render())
    assert "nx-host" not in entry.upstreams_conf.read_text()
    assert entry.test_config() is None
    assert DROPPED.labels("edges", "unresolvable")._value.get() == 1


@pytest.mark.skipif(NGINX is None, reason="needs the nginx binary (nginx -t)")
def test_a_name_that_resolves_later_or_moves_is_rendered_without_a_catalog_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On Docker Swarm an edge is listed as its service name, which resolves only once its
    task is healthy (possibly after Consul's check passed and the catalog settled) and to a
    new address when the task moves to another node: the renderer resolves the names again
    on its own and renders what they now answer, with no change in the catalog."""
    renderer = checking_renderer(tmp_path)
    renderer.fleet = Fleet(edges=[edge("edge-eu-1", "edge-eu-1", 8200)])
    answers: dict[str, str | Exception] = {"edge-eu-1": OSError("Name or service not known")}

    async def dns(name: str) -> str | Exception:  # Docker's DNS, as the task comes and moves
        return answers[name]

    monkeypatch.setattr(fleet_module, "_resolve", dns)
    upstreams_conf = renderer.entry.upstreams_conf

    async def scenario() -> list[str]:
        seen = []
        await renderer.render()  # the catalog's one change: the edge passing, not resolvable
        seen.append(upstreams_conf.read_text())
        task = asyncio.create_task(reresolve(renderer, every=0.05))
        answers["edge-eu-1"] = "10.210.0.7"  # healthy: in Docker's DNS now
        await asyncio.sleep(0.3)
        seen.append(upstreams_conf.read_text())
        answers["edge-eu-1"] = "10.210.0.19"  # rescheduled on another node
        await asyncio.sleep(0.3)
        seen.append(upstreams_conf.read_text())
        task.cancel()
        return seen

    before, healthy, moved = asyncio.run(scenario())
    assert "10.210.0." not in before
    assert "server 10.210.0.7:8200" in healthy
    assert "server 10.210.0.19:8200" in moved and "10.210.0.7:" not in moved
    assert renderer.dropped == {}


def test_a_name_failing_to_resolve_for_a_moment_keeps_its_last_address_for_a_while(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A resolver too slow once on a busy host must not take a passing edge out of every
    pool (the swarm test saw a site's entry with no server left); past KEEP_RESOLVED_S the
    name is dropped as before."""
    answers: dict[str, str | Exception] = {"edge-us-1": "10.210.0.9"}

    async def dns(name: str) -> str | Exception:
        return answers[name]

    monkeypatch.setattr(fleet_module, "_resolve", dns)
    fleet = Fleet(edges=[edge("edge-us-1", "edge-us-1", 8200)])
    known: dict[str, tuple[str, float]] = {}
    found, dropped = asyncio.run(resolved(fleet, known))
    assert [i.address for i in found.edges] == ["10.210.0.9"] and not dropped
    answers["edge-us-1"] = TimeoutError("no answer within 1.0 s")
    found, dropped = asyncio.run(resolved(fleet, known))
    assert [i.address for i in found.edges] == ["10.210.0.9"] and not dropped
    known["edge-us-1"] = ("10.210.0.9", known["edge-us-1"][1] - KEEP_RESOLVED_S - 1)
    found, dropped = asyncio.run(resolved(fleet, known))
    assert found.edges == [] and [d.reason for d in dropped] == ["unresolvable"]
    # without a memory of answers (the function alone), a failure drops the entry at once
    answers["edge-us-1"] = "10.210.0.9"
    asyncio.run(resolved(fleet, {}))
    answers["edge-us-1"] = TimeoutError("no answer within 1.0 s")
    assert asyncio.run(resolved(fleet))[0].edges == []


@pytest.mark.skipif(NGINX is None, reason="needs the nginx binary (nginx -t)")
def test_a_catalog_change_while_names_resolve_is_rendered_not_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three watches share one fleet. When the centers' list changes (a new name) while the
    edges' render is still resolving names, that render must finish with the fleet it started
    from, and the side's render the change. (Before, the edges' render met a name it had
    not resolved, raised KeyError and ended the edges' watch: the entry kept a stale edge list
    for good, and a site's clients were answered by another site's edges, as the swarm test
    saw.)"""
    renderer = checking_renderer(tmp_path, with_side=True)
    slow = asyncio.Event()

    async def dns(name: str) -> str | Exception:  # Docker's DNS, slow for the edge's name
        if name == "edge-eu-1":
            await slow.wait()
        return {"edge-eu-1": "10.210.0.7", "center-1": "10.210.0.14"}[name]

    monkeypatch.setattr(fleet_module, "_resolve", dns)
    center = Instance("center-1", "center-1", 8100, ("center",), {"region": "center"}, True)

    async def change(role: str, instances: list[Instance]) -> None:  # as a Watch calls it
        result = renderer.follow(role)(instances)
        if result is not None:
            await result

    async def scenario() -> None:
        edges = asyncio.create_task(change("edges", [edge("edge-eu-1", "edge-eu-1", 8200,
                                                          region="eu")]))
        await asyncio.sleep(0.05)  # the edges' render is waiting on the resolver
        centers = asyncio.create_task(change("centers", [center]))
        await asyncio.sleep(0.05)
        slow.set()
        await asyncio.gather(edges, centers)

    asyncio.run(scenario())
    assert renderer.side is not None
    assert "server 10.210.0.7:8200" in renderer.entry.upstreams_conf.read_text()
    assert "server 10.210.0.14:8100" in renderer.side.upstreams_conf.read_text()
    assert renderer.dropped == {}


def test_a_watch_that_ends_stops_the_renderer_with_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A renderer whose watch died would leave nginx on a stale list for good while looking
    alive: it exits non-zero instead, so that Swarm (or systemd, or `tiered up`) restarts it."""
    async def broken(renderer: Renderer, every: float = 0.0) -> None:
        raise KeyError("center-1")

    monkeypatch.setattr(render_module, "reresolve", broken)
    renderer = Renderer(Nginx("entry", tmp_path, "nginx"))
    with pytest.raises(click.ClickException, match="a watch of the fleet ended: KeyError"):
        asyncio.run(asyncio.wait_for(render_module.serve(renderer, "127.0.0.1:1", None), 10))
