"""Hosts as network namespaces (what ``tiered sites`` and the sites test build on): each host
has its own address, a cut drops packets both ways until healed, a host whose cable is out
answers nothing, and closing leaves no namespace or link behind. Root only; a few seconds."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest

from tiered import netns

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(netns.available() is not None,
                                 reason=f"network namespaces: {netns.available()}")]


@pytest.fixture
def net() -> Iterator[netns.Network]:
    network = netns.Network("10.79").create()
    try:
        yield network
    finally:
        network.close()
    assert network.id not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                            text=True).stdout
    assert network.id not in subprocess.run(["ip", "link"], capture_output=True,
                                            text=True).stdout


def reach(src: netns.Host, url: str) -> bool:
    """Whether ``src`` gets an HTTP answer from ``url`` within 2 s."""
    code = (f"import urllib.request as u\ntry:\n u.urlopen({url!r}, timeout=2)\n"
            f"except OSError:\n raise SystemExit(1)")
    return subprocess.run(src.argv(sys.executable, "-c", code), capture_output=True).returncode == 0


def test_hosts_talk_over_their_own_addresses_until_cut(net: netns.Network) -> None:
    center = net.add("core", "center")
    edge, neighbour = net.add("eu", "edge"), net.add("eu", "neighbour")
    assert center.address == "10.79.1.10" and edge.address == "10.79.2.10"
    assert net.subnet("eu") == "10.79.2.0/24"
    server = subprocess.Popen(center.argv(sys.executable, "-m", "http.server", "8000",
                                          "--bind", center.address),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://{center.address}:8000/"
    try:
        deadline = time.monotonic() + 20
        while not reach(edge, url) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert reach(edge, url) and reach(neighbour, url)
        assert httpx.get(url, timeout=2).status_code == 200  # from the root namespace too
        # loopback inside a host is its own: the center is not on the edge's 127.0.0.1
        assert not reach(edge, "http://127.0.0.1:8000/")

        net.cut([edge], [net.subnet("core")])
        assert not reach(edge, url)  # silence, not a refusal: the 2 s timeout
        assert reach(neighbour, url)  # only the cut host
        assert httpx.get(url, timeout=2).status_code == 200
        net.heal([edge])
        assert reach(edge, url)

        net.link(center, up=False)  # the center's cable out
        assert not reach(edge, url)
        net.link(center, up=True)
        assert reach(edge, url)
    finally:
        server.kill()
        server.wait()


def test_a_prefix_in_use_or_not_private_is_refused() -> None:
    with pytest.raises(ValueError, match="not a private network"):
        netns.Network("8.8")
    with pytest.raises(ValueError, match="two numbers"):
        netns.Network("10.1; reboot")
    with netns.Network("10.79"), pytest.raises(RuntimeError, match="already used"):
        netns.Network("10.79").create()
