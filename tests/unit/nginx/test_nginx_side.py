"""The entry nginx and the side nginx: the entry's config depends on the edges alone, so a
center or registry coming, going or moving reloads only the side (a reload closes the idle
keep-alive connections clients hold to the nginx reloaded)."""

from __future__ import annotations

import asyncio
import os
import pwd
import re
import shutil
import subprocess
from pathlib import Path

import click
import pytest

from nginx import side
from nginx.entry import Entry, config
from nginx.fleet import Fleet
from nginx.process import Nginx
from nginx.render import serve, wire
from nginx.renderer import Renderer
from nginx.upstreams import upstreams
from serving.fleet.discovery import Instance

from .test_nginx_guard_render import NGINX, checking_renderer
from .test_nginx_render import block

EDGES = [Instance("edge-us-1", "127.0.0.1", 8201, ("edge",), {"region": "us"})]


def center(port: int, address: str = "10.1.2.3") -> Instance:
    return Instance("center-1", address, port, ("center",), {"region": "center"})


def registry(metrics_port: int) -> Instance:
    return Instance("registry-1", "10.1.2.9", 50051, (), {"metrics_port": str(metrics_port)})


def test_the_entry_config_never_depends_on_the_centers_or_the_registry(tmp_path: Path) -> None:
    before = Fleet(edges=EDGES, centers=[center(8100)], registries=[registry(9300)])
    moved = Fleet(edges=EDGES, centers=[center(8111, "10.1.2.4")], registries=[])
    assert upstreams(before) == upstreams(moved) == upstreams(Fleet(edges=EDGES))
    exposed = Entry(expose_center=True, expose_registry_metrics=True,
                    side_socket=tmp_path / "side.sock")
    entry = config(tmp_path, "127.0.0.1:8080", 10, 10, "1m", tmp_path, exposed)
    for text in (upstreams(before), entry):
        for trace in ("10.1.2.", "8100", "8111", "9300", "tiered_centers", "proxy_ssl"):
            assert trace not in text, trace
    assert block(side.upstreams(before), "tiered_centers") == ["server 10.1.2.3:8100 max_fails=0;"]
    assert block(side.upstreams(before), "tiered_registry_metrics") == ["server 10.1.2.9:9300;"]
    assert block(side.upstreams(moved), "tiered_centers") == ["server 10.1.2.4:8111 max_fails=0;"]
    assert "8201" not in side.upstreams(before)  # and the side never names an edge


def test_the_entry_passes_the_center_and_the_metrics_to_the_side_socket(tmp_path: Path) -> None:
    sock = tmp_path / "side.sock"
    exposed = Entry(expose_center=True, expose_registry_metrics=True, side_socket=sock)
    entry = config(tmp_path, "127.0.0.1:8080", 10, 10, "1m", tmp_path, exposed)
    upstream = entry[entry.index("upstream tiered_side {"):].split("}")[0].splitlines()[1:]
    assert [line.strip() for line in upstream if line.strip()] == [
        f"server unix:{sock.resolve()};", "keepalive 16;"]
    for location in ("location /center/v2/ {", "location = /registry/metrics {"):
        body = entry[entry.index(location):].split("}")[0]
        assert "proxy_pass http://tiered_side;" in body, location
        # a request that failed on a keep-alive connection a side reload closed is sent again
        assert "proxy_next_upstream error non_idempotent;" in body, location
        assert "limit_req zone=" in body, location
    served = side.config(tmp_path / "side", tmp_path, "1m", exposed)
    assert f"listen unix:{sock.resolve()};" in served
    assert re.search(r"location /center/v2/ \{[^}]*proxy_pass http://tiered_centers/v2/;", served)
    assert "proxy_pass http://tiered_registry_metrics/metrics;" in served
    with pytest.raises(ValueError, match="socket"):
        config(tmp_path, "127.0.0.1:8080", 10, 10, "1m", tmp_path, Entry(expose_center=True))
    closed = config(tmp_path, "127.0.0.1:8080", 10, 10, "1m", tmp_path, Entry())
    assert "tiered_side" not in closed and "unix:" not in closed


def test_without_an_exposed_route_there_is_no_side_and_no_watch_for_it(tmp_path: Path) -> None:
    assert Entry().side_roles == ()
    assert Renderer(Nginx("entry", tmp_path, "nginx")).roles == ("edges",)
    only_center = Entry(expose_center=True).side_roles
    assert only_center == ("centers",)
    renderer = Renderer(Nginx("entry", tmp_path, "nginx"), Nginx("side", tmp_path, "nginx"),
                        only_center)
    assert renderer.roles == ("edges", "centers")


@pytest.mark.skipif(NGINX is None, reason="needs the nginx binary (nginx -t)")
def test_a_center_or_registry_change_renders_and_reloads_the_side_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    renderer = checking_renderer(tmp_path, with_side=True)
    assert renderer.side is not None
    reloads: list[str] = []
    monkeypatch.setattr(Nginx, "reload", lambda nginx: reloads.append(nginx.name) or True)

    async def change(role: str, instances: list[Instance]) -> None:  # as a Watch calls it
        result = renderer.follow(role)(instances)
        assert result is not None
        await result

    async def scenario() -> None:
        await change("edges", EDGES)
        assert reloads == ["entry"]
        entry_text = renderer.entry.upstreams_conf.read_text()
        for role, instances in [("centers", [center(8100)]), ("registries", [registry(9300)]),
                                ("centers", [center(8111)]),  # moved
                                ("centers", [center(8111)]),  # no change: no reload
                                ("registries", [])]:
            await change(role, instances)
        assert renderer.entry.upstreams_conf.read_text() == entry_text
        assert reloads == ["entry", "side", "side", "side", "side"]
        await change("edges", [*EDGES, Instance("edge-eu-1", "127.0.0.1", 8202, ("edge",),
                                                {"region": "eu"})])
        assert reloads[-1] == "entry" and reloads.count("side") == 4

    asyncio.run(scenario())
    assert renderer.side is not None
    assert "10.1.2.3:8111" in renderer.side.upstreams_conf.read_text()


@pytest.mark.skipif(NGINX is None, reason="needs the nginx binary (nginx -t)")
def test_the_configs_the_command_writes_pass_nginx_t(tmp_path: Path) -> None:
    """What ``python -m nginx.render --expose-center --expose-registry-metrics`` writes: both
    configs pass nginx -t, and the side's socket is in a folder only nginx's workers reach."""
    assert NGINX is not None
    folders: list[Path] = []
    try:
        renderer = wire(tmp_path / "nginx", NGINX,
                        Entry(grpc_listen="127.0.0.1:1", expose_center=True,
                              expose_registry_metrics=True), folders, listen="127.0.0.1:1",
                        rate=10, burst=10, max_body="1m", region=None, fallback=())
        assert renderer.side is not None and renderer.side.prefix == tmp_path / "nginx" / "side"
        for nginx in renderer.nginxes:
            assert nginx.test_config() is None, nginx.name
        sock = re.search(r"listen unix:(\S+);", renderer.side.conf.read_text())
        assert sock is not None
        home = Path(sock.group(1)).parent
        assert home in folders and home.stat().st_mode & 0o777 == 0o700
        workers = pwd.getpwnam("nobody").pw_uid if os.geteuid() == 0 else os.geteuid()
        assert home.stat().st_uid == workers
        assert renderer.roles == ("edges", "centers", "registries")
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def test_either_nginx_exiting_stops_the_renderer_with_an_error(tmp_path: Path) -> None:
    """The renderer exits non-zero when the entry or the side nginx exits: its supervisor
    restarts both (the entry without its side would answer /center/v2/ with 503 for good)."""
    for gone in ("entry", "side"):
        renderer = Renderer(Nginx("entry", tmp_path, "nginx"), Nginx("side", tmp_path, "nginx"))
        for nginx in renderer.nginxes:  # stand-ins for the two nginx processes
            nginx.child = subprocess.Popen(["sleep", "30"] if nginx.name != gone else ["false"])
        try:
            with pytest.raises(click.ClickException, match=f"the {gone} nginx exited with "
                                                           "status 1"):
                asyncio.run(asyncio.wait_for(serve(renderer, None, None), 10))
        finally:
            for nginx in renderer.nginxes:
                assert nginx.child is not None
                nginx.child.kill()
                nginx.child.wait()
