"""The upstreams nginx gets from Consul's view of the fleet."""

from __future__ import annotations

import re

from nginx.render import Fleet, upstreams
from serving.discovery import Instance


def edge(port: int, region: str, passing: bool = True) -> Instance:
    return Instance(f"edge-{region}-{port}", "127.0.0.1", port, ("edge",),
                    {"region": region}, passing)


def block(conf: str, name: str) -> list[str]:
    body = re.search(r"upstream " + name + r" \{\n(.*?)\n\}", conf, re.S)
    assert body is not None, name
    return [line.strip() for line in body.group(1).splitlines()
            if line.strip().startswith("server")]


def test_failing_instances_are_a_last_resort_and_nginx_marks_nothing_down() -> None:
    """An edge Consul still lists as failing may be back already (nginx reloads lag): it is
    tried after every passing edge instead of never."""
    conf = upstreams(Fleet(edges=[edge(1001, "eu"), edge(1002, "us", passing=False)]))
    assert block(conf, "tiered_edges") == ["server 127.0.0.1:1001 max_fails=0;",
                                           "server 127.0.0.1:1002 max_fails=0 backup;"]
    assert block(conf, "tiered_edges_eu") == ["server 127.0.0.1:1001 max_fails=0;",
                                              "server 127.0.0.1:1002 max_fails=0 backup;"]
    # the us edge is failing: nothing local passes, the eu edge first, then the us edge
    assert block(conf, "tiered_edges_us") == ["server 127.0.0.1:9 down;  # none passing",
                                              "server 127.0.0.1:1001 max_fails=0 backup;",
                                              "server 127.0.0.1:1002 max_fails=0 backup;"]


def test_an_empty_fleet_renders_a_server_that_is_down() -> None:
    conf = upstreams(Fleet())
    assert block(conf, "tiered_edges") == ["server 127.0.0.1:9 down;  # none passing"]
    assert block(conf, "tiered_registry_metrics") == ["server 127.0.0.1:9 down;  # none passing"]


def test_a_failing_registry_is_not_scraped() -> None:
    registry = Instance("registry-1", "127.0.0.1", 50051, (), {"metrics_port": "9300"}, False)
    assert block(upstreams(Fleet(registries=[registry])), "tiered_registry_metrics") == [
        "server 127.0.0.1:9 down;  # none passing"]
