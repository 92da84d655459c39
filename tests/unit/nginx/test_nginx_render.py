"""The upstreams nginx gets from Consul's view of the fleet."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nginx import side
from nginx.entry import Entry, config
from nginx.fleet import Fleet
from nginx.upstreams import upstreams
from serving.fleet.discovery import Instance


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
    assert block(upstreams(Fleet()), "tiered_edges") == [
        "server 127.0.0.1:9 down;  # none passing"]
    for name in ("tiered_centers", "tiered_registry_metrics"):  # the side nginx's
        assert block(side.upstreams(Fleet()), name) == [
            "server 127.0.0.1:9 down;  # none passing"]


def test_a_failing_registry_is_not_scraped() -> None:
    registry = Instance("registry-1", "127.0.0.1", 50051, (), {"metrics_port": "9300"}, False)
    assert block(side.upstreams(Fleet(registries=[registry])), "tiered_registry_metrics") == [
        "server 127.0.0.1:9 down;  # none passing"]


INJECTION = ('eu" tiered_edges;\n}\nserver { listen 8080 default_server; location /leak/ '
             '{ alias /etc/; } }\nmap $x $y {\n "a')


def hostile_instances() -> list[Instance]:
    """Instances made directly (not through discovery.instance): the renderer's own checks."""
    bad_addresses = ["127.0.0.1\nserver 10.0.0.1:80", "a}b", "127.0.0.1;", "127.0.0.1 backup",
                     "'quoted'", '"quoted"', "$host", "fe80::1%eth0;x", "x" * 300,
                     ".".join(["a" * 60] * 5), "édge", "01.2.3.4"]
    found = [Instance(f"bad-{n}", a, 1003, (), {"region": "eu"})
             for n, a in enumerate(bad_addresses)]
    found += [Instance(f"bad-port-{p}", "127.0.0.1", p, (), {"region": "eu"})  # type: ignore[arg-type]
              for p in (0, 70000, -1, "80; x", True)]
    found += [Instance(f"bad-region-{n}", "127.0.0.1", 1004, (), {"region": r})
              for n, r in enumerate([INJECTION, 'eu"', "eu us", "$r", "EU", "r" * 33, "eü",
                                     "eu;", "eu{"])]
    found += [Instance("bad-failing", "a;b", 1005, (), {"region": "us"}, passing=False)]
    return found


def test_hostile_instances_are_not_rendered_and_change_nothing() -> None:
    """Whatever reached the Fleet: the text is the text without the hostile instances."""
    good = Fleet(edges=[edge(1001, "eu"), edge(1002, "us", passing=False)],
                 centers=[Instance("center-1", "10.1.2.3", 8100)],
                 registries=[Instance("registry-1", "::1", 50051, (), {"metrics_port": "9300"})])
    metrics = [Instance(f"bad-metrics-{n}", "127.0.0.1", 50052, (), {"metrics_port": m})
               for n, m in enumerate(["9300; x", "99999", "٩٣٠٠", "0", "9300\n"])]
    hostile = Fleet(edges=[*good.edges, *hostile_instances()],
                    centers=[*hostile_instances(), *good.centers],
                    registries=[*good.registries, *hostile_instances(), *metrics])
    conf, side_conf = upstreams(hostile), side.upstreams(hostile)
    assert conf == upstreams(good) and side_conf == side.upstreams(good)
    assert block(side_conf, "tiered_centers") == ["server 10.1.2.3:8100 max_fails=0;"]
    assert block(side_conf, "tiered_registry_metrics") == ["server [::1]:9300;"]
    for trace in ("leak", "alias", "default_server", "$", "'", "bad-", "10.0.0.1"):
        assert trace not in conf.replace("$http_x_tiered_region $tiered_edge_pool", "").replace(
                "$http_x_tiered_region $tiered_edge_grpc_pool", ""), trace
        assert trace not in side_conf, trace
    assert re.findall(r'"([^"]*)" tiered_edges_(?!grpc_)', conf) == ["eu", "us"]


def test_a_region_with_a_hyphen_gets_a_pool_of_its_own() -> None:
    conf = upstreams(Fleet(edges=[edge(1001, "eu-west-1"), edge(1002, "eu")]))
    assert '    "eu-west-1" tiered_edges_eu_west_1;' in conf
    assert block(conf, "tiered_edges_eu_west_1")[0] == "server 127.0.0.1:1001 max_fails=0;"


def test_grpc_pools_hold_the_edges_grpc_ports_and_skip_edges_without_one() -> None:
    with_grpc = Instance("edge-eu-1001", "127.0.0.1", 1001, ("edge",),
                         {"region": "eu", "grpc_port": "2001"})
    hostile = Instance("edge-us-1002", "127.0.0.1", 1002, ("edge",),
                       {"region": "us", "grpc_port": "2002;}"})
    conf = upstreams(Fleet(edges=[with_grpc, edge(1003, "us"), hostile]))
    assert block(conf, "tiered_edges_grpc") == ["server 127.0.0.1:2001 max_fails=0;"]
    assert block(conf, "tiered_edges_grpc_us") == ["server 127.0.0.1:9 down;  # none passing",
                                                   "server 127.0.0.1:2001 max_fails=0 backup;"]
    assert block(conf, "tiered_edges") == ["server 127.0.0.1:1001 max_fails=0;",
                                           "server 127.0.0.1:1003 max_fails=0;"]
    assert "2002" not in conf and "1002" not in conf
    assert "map $http_x_tiered_region $tiered_edge_grpc_pool" in conf


def map_default(conf: str, suffix: str = "") -> str:
    found = re.search(r"map \$http_x_tiered_region \$tiered_edge" + suffix
                      + r"_pool \{\n\s+default (\S+);", conf)
    assert found is not None
    return found.group(1)


def test_a_sites_entry_sends_unhinted_requests_to_its_own_edges_first() -> None:
    """A site's nginx (``--region eu``): no hint means the site's own edges; the other
    regions' hints still reach theirs (X-Tiered-Region keeps working)."""
    fleet = Fleet(edges=[edge(1001, "eu"), edge(1002, "eu"), edge(2001, "us")], region="eu")
    conf = upstreams(fleet)
    assert map_default(conf) == "tiered_edges_eu" and map_default(conf, "_grpc") == \
        "tiered_edges_grpc_eu"
    assert block(conf, "tiered_edges_eu") == ["server 127.0.0.1:1001 max_fails=0;",
                                              "server 127.0.0.1:1002 max_fails=0;",
                                              "server 127.0.0.1:2001 max_fails=0 backup;"]
    assert '"us" tiered_edges_us;' in conf
    assert map_default(upstreams(Fleet(edges=fleet.edges))) == "tiered_edges"  # one host


def test_a_sites_entry_fails_over_to_the_nearest_region_with_a_passing_edge_only() -> None:
    edges = [edge(1001, "eu", passing=False), edge(2001, "us"), edge(3001, "ap")]
    nearest_ap = block(upstreams(Fleet(edges=edges, region="eu", fallback=("ap", "us"))),
                       "tiered_edges_eu")
    assert nearest_ap == ["server 127.0.0.1:9 down;  # none passing",
                          "server 127.0.0.1:3001 max_fails=0 backup;",
                          "server 127.0.0.1:1001 max_fails=0 backup;"]
    # without an order, by name: ap before us, but ap's edges all fail: us, never the dead ap
    edges[2] = edge(3001, "ap", passing=False)
    conf = upstreams(Fleet(edges=edges, region="eu"))
    assert block(conf, "tiered_edges_eu") == ["server 127.0.0.1:9 down;  # none passing",
                                              "server 127.0.0.1:2001 max_fails=0 backup;",
                                              "server 127.0.0.1:1001 max_fails=0 backup;"]


def test_a_sites_entry_with_no_edges_yet_still_renders_its_pool() -> None:
    conf = upstreams(Fleet(region="eu"))
    assert map_default(conf) == "tiered_edges_eu"
    assert block(conf, "tiered_edges_eu") == ["server 127.0.0.1:9 down;  # none passing"]


def test_the_center_route_checks_the_center_certificate_when_given_a_ca(tmp_path: Path) -> None:
    """The side nginx reaches the centers, so it is the one that checks them; the entry
    only passes /center/v2/ to the side."""
    from registry.trust.pki import role_name

    ca = tmp_path / "ca.pem"
    ca.write_text("-")
    plain = side.config(tmp_path, tmp_path, "1m", Entry(expose_center=True))
    assert "proxy_pass http://tiered_centers/v2/;" in plain and "proxy_ssl" not in plain
    exposed = Entry(center_ca=ca, expose_center=True, side_socket=tmp_path / "side.sock")
    tls = side.config(tmp_path, tmp_path, "1m", exposed)
    assert "proxy_pass https://tiered_centers/v2/;" in tls
    assert f"proxy_ssl_trusted_certificate {ca.resolve()};" in tls
    assert "proxy_ssl_verify on;" in tls and f"proxy_ssl_name {role_name('center')};" in tls
    entry = config(tmp_path, "127.0.0.1:8080", 10, 10, "1m", tmp_path, exposed)
    assert "proxy_ssl" not in entry and "tiered_centers" not in entry
    odd = tmp_path / "ca; include x.pem"
    with pytest.raises(ValueError, match="only letters"):
        side.config(tmp_path, tmp_path, "1m", Entry(center_ca=odd, expose_center=True))
