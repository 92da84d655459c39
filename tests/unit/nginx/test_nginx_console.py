"""The entry nginx and the fleet console: with ``--console HOST:PORT`` a real nginx passes
/console/ to a real ``tiered console`` (which asks for the credential itself); without it there
is no /console/ at all; an address that is not an IP and a port is refused before it reaches
nginx.conf."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import httpx
import pytest

from harness import fleet_state
from harness.processes import free_port, start_console
from nginx.entry import Entry, config
from nginx.fleet import Fleet
from nginx.process import Nginx, temp_dir, write_atomically
from nginx.upstreams import upstreams

from .test_nginx_guard_render import NGINX


def test_no_console_location_unless_given(tmp_path: Path) -> None:
    assert "/console/" not in config(tmp_path, "127.0.0.1:8080", 10, 10, "1m", tmp_path)
    given = config(tmp_path, "127.0.0.1:8080", 10, 10, "1m", tmp_path,
                   Entry(console="127.0.0.1:8090"))
    assert "location /console/ {" in given and "proxy_pass http://127.0.0.1:8090;" in given


@pytest.mark.parametrize("address", ["127.0.0.1", "console:8090", "127.0.0.1:8090; include x",
                                     "127.0.0.1:8090/x", ""])
def test_a_console_address_that_is_not_ip_and_port_is_refused(tmp_path: Path,
                                                               address: str) -> None:
    with pytest.raises(ValueError, match="console address"):
        config(tmp_path, "127.0.0.1:8080", 10, 10, "1m", tmp_path, Entry(console=address))


@pytest.mark.skipif(NGINX is None, reason="needs the nginx binary")
def test_nginx_passes_console_to_it_and_the_credential_is_still_asked(tmp_path: Path) -> None:
    assert NGINX is not None
    fleet_state.build(tmp_path / "registry", 25)
    console = start_console(tmp_path / "registry", tmp_path, tmp_path / "secret")
    secret = (tmp_path / "secret").read_text().strip()
    (tmp_path / "tmp").mkdir()
    temp = temp_dir(tmp_path)
    listen = f"127.0.0.1:{free_port()}"
    nginx = Nginx("entry", tmp_path, NGINX)
    write_atomically(nginx.conf, config(tmp_path, listen, 100, 100, "1m", temp,
                                        Entry(console=f"127.0.0.1:{console.port}")))
    write_atomically(nginx.upstreams_conf, upstreams(Fleet()))
    try:
        assert nginx.test_config() is None
        nginx.start()
        for _ in range(100):
            try:
                if httpx.get(f"http://{listen}/nginx/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        anonymous = httpx.get(f"http://{listen}/console/", timeout=10)
        assert anonymous.status_code == 401 and "www-authenticate" in anonymous.headers
        page = httpx.get(f"http://{listen}/console/", auth=("operator", secret), timeout=10)
        assert page.status_code == 200 and '<span class="halted">halted</span>' in page.text
        listed = httpx.get(f"http://{listen}/console/nodes?state=disconnected",
                           auth=("operator", secret), timeout=10)
        assert "edge-03" in listed.text
        assert httpx.post(f"http://{listen}/console/", auth=("operator", secret),
                          timeout=10).status_code == 405
        assert httpx.get(f"http://{listen}/consolex", timeout=10).status_code == 404
    finally:
        nginx.stop()
        console.stop()
        if temp != tmp_path / "tmp":
            shutil.rmtree(temp, ignore_errors=True)
