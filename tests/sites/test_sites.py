"""Three sites on separate hosts (network namespaces, their own addresses), clients at both edge
sites sending through their site's entry and retrying a failure once, through partitions 1-5
and the registry group's faults (6a-6c: its primary's host killed, the two registry hosts cut
from each other, the primary cut from Consul; ``harness/sites.py`` drives them).
``make sites-test`` (root, ~5 min; not in ``make test``).

The tests share one fleet and run in file order: each partition starts from where the previous
one left it. What must hold throughout: no request fails after its one retry.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.sites import CHUNK, Event, Run, running, table, wait
from tiered import netns
from tiered.site_map import CORE

pytestmark = [pytest.mark.sites, pytest.mark.integration, pytest.mark.slow]
PREFIX = "10.78"  # not 10.77: `make sites` may be running beside the test


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, tiny_release: Path,
        tiny_release_b: Path) -> Iterator[Run]:
    why = netns.available()
    if why:
        pytest.fail(f"the sites test needs network namespaces: {why}")
    with running(tmp_path_factory.mktemp("sites"), tiny_release, tiny_release_b,
                 PREFIX) as fleet:
        yield fleet
        if fleet.events:
            from rich.console import Console

            Console(width=160).print(table(fleet))


def no_failures(event: Event) -> None:
    assert event.answers, f"no request was answered during {event.name}"
    assert not event.failed, [(a.site, a.status, a.error) for a in event.failed[:5]]


def test_every_site_answers_from_its_own_edges_and_the_region_hint_still_steers(
        run: Run) -> None:
    for site in run.sites.edge_sites:
        with httpx.Client(timeout=10) as http:
            nodes = {node(http.post(f"{run.sites.entry(site)}/v2/models/tiny/infer",
                                    content=body(n))) for n in range(8)}
            other = next(s for s in run.sites.edge_sites if s != site)
            hinted = {node(http.post(f"{run.sites.entry(site)}/v2/models/tiny/infer",
                                     content=body(n), headers={"X-Tiered-Region": other}))
                      for n in range(4)}
        assert nodes <= set(run.sites.edges(site)) and nodes, nodes
        assert hinted <= set(run.sites.edges(other)) and hinted, hinted


def test_every_link_between_sites_is_authenticated_and_secrets_stay_off_argv(run: Run) -> None:
    """Sync over TLS with node tokens, escalation over HTTPS, gossip encrypted, ACLs on; no
    token or key on any child's command line (``ps`` shows argv to anyone)."""
    sites = run.sites
    secrets = [sites.token, sites.gossip_key, *sites.consul_tokens.values()]
    for child in sites.children.values():
        argv = Path(f"/proc/{child.pid}/cmdline").read_bytes().decode()
        assert not any(s in argv for s in secrets), child.name
    for name in ("gossip.json", "acl.json", "acl-client.json", "management.token"):
        assert os.stat(sites.root / "consul" / name).st_mode & 0o077 == 0, name
    # anonymous Consul calls see nothing (default deny), a reader sees the fleet
    anonymous = httpx.get(f"http://{sites.consul}/v1/health/service/tiered-edge", timeout=3)
    assert anonymous.status_code == 200 and anonymous.json() == []
    keyring = httpx.get(f"http://{sites.consul}/v1/operator/keyring", timeout=3,
                        headers={"X-Consul-Token": sites.consul_tokens["management"]}).json()
    assert keyring and all(sites.gossip_key in ring["Keys"] for ring in keyring)
    # the center answers HTTPS only, with a certificate the fleet CA signed
    with pytest.raises(httpx.HTTPError):
        httpx.get(sites.node_url("center-1").replace("https", "http") + "/v2/health/ready",
                  timeout=3)
    assert httpx.get(f"{sites.node_url('center-1')}/v2/health/ready", timeout=3,
                     verify=run.ca).status_code == 200
    with pytest.raises(httpx.HTTPError):  # the system's CAs do not know it
        httpx.get(f"{sites.node_url('center-1')}/v2/health/ready", timeout=3)
    # every node synced over TLS: the registry registered itself for TLS only
    assert sites.registry_extra and (sites.tls / "registry.pem").is_file()


def test_prometheus_on_the_center_site_scrapes_every_node_of_every_site(run: Run) -> None:
    """Targets come from the monitoring host's Consul agent: every edge of every site, the
    center and both registries, each up, under its own node and region."""
    sites = run.sites
    nodes = {n: ("edge", s) for s in sites.edge_sites for n in sites.edges(s)}
    nodes["center-1"] = ("center", CORE)

    def scraped() -> list[dict[str, Any]]:
        return list(httpx.get(f"{sites.prometheus_url}/api/v1/targets", timeout=5)
                    .json()["data"]["activeTargets"])

    def all_up() -> bool:
        found = scraped()
        return (len(found) == len(nodes) + len(sites.registry_homes()) + 2
                and all(t["health"] == "up" for t in found))

    wait(all_up, 90, "every node of every site scraped, up")
    found = {t["labels"].get("node", t["labels"]["job"]): t for t in scraped()}
    for node, (job, site) in nodes.items():
        labels = found[node]["labels"]
        assert (labels["job"], labels["region"], labels["tier"]) == (job, site, job), labels
        address = sites.placement[node].address  # scraped on its own host, over TLS
        assert found[node]["scrapeUrl"].startswith(f"https://{address}:"), found[node]
    registries = sorted(t["scrapeUrl"] for t in found.values()
                        if t["labels"]["job"] == "registry")
    assert registries == sorted(f"http://{sites.host(n).address}:9300/metrics"
                                for n in sites.registry_homes())
    assert {"prometheus", "alertmanager"} <= found.keys()
    # outside every host the faults below hit: it sees them happen
    assert sites.placement["prometheus"].name == "monitoring"
    assert sites.placement["prometheus"].site == CORE
    assert run.sites.state()["alertmanager"] == sites.alertmanager_url


def test_start_traffic(run: Run) -> None:
    from harness.sites import Traffic

    run.traffic = Traffic({s: run.sites.entry(s) for s in run.sites.edge_sites}).start()


def test_1_an_edge_site_cut_from_the_center_site_answers_degraded_then_escalates_again(
        run: Run) -> None:
    event = run.site_from_center()
    no_failures(event)
    assert event.facts["degraded_during"] > 0  # rows that could not escalate, marked
    assert event.recovery_s is not None  # escalation resumed by itself after the heal


def test_2_cut_from_the_registry_during_a_rollout_keeps_serving_then_resumes_the_download(
        run: Run) -> None:
    event = run.registry_during_rollout()
    no_failures(event)
    facts = event.facts
    before, target = facts["version_before"], facts["target"]
    assert facts["versions_during"] == [before] * run.sites.edges_per_site  # kept its version
    assert run.all_serve(target, "eu") and run.all_serve(target, "us")
    assert facts["resumed"] >= 1  # the broken stream resumed from its offset ...
    # ... re-receiving at most a chunk per artifact, not the whole release again
    assert facts["received"] <= facts["artifact_bytes"] + 3 * CHUNK


def test_2b_small_releases_cross_a_thin_link_by_the_chunks_they_changed(run: Run) -> None:
    event = run.small_changes_on_a_thin_link()
    no_failures(event)
    changes = event.facts["changes"]
    whole, chunked = changes["head only, whole"], changes["head only, chunked"]
    # a head-only change: the whole edge model before chunks, a few chunks now
    assert chunked["received"] <= 0.05 * chunked["full"], changes
    assert chunked["received"] * 5 < whole["received"], changes
    assert chunked["seconds"] < whole["seconds"], changes
    # a recalibration changes only the probe (the model files were copied locally before
    # chunks too): never more bytes by chunks than whole
    calibrated = changes["recalibrated, chunked"]
    assert calibrated["received"] <= 0.05 * calibrated["full"], changes
    assert calibrated["received"] <= changes["recalibrated, whole"]["received"] + 1024, changes
    assert run.all_serve(event.facts["target"], "us")


def test_3_an_edge_site_cut_from_the_consul_servers_serves_from_its_last_lists(
        run: Run) -> None:
    event = run.site_from_consul()
    no_failures(event)
    assert event.facts["catalog_during"] is not None  # its agent really lost the servers
    assert event.recovery_s is not None
    escalated = [a for a in event.answers if a.site == "eu" and "center" in a.tiers]
    assert escalated  # the center, reachable, still got the unsure rows


def test_4_a_sites_edges_all_down_fails_its_entry_over_to_the_nearest_sites_edges(
        run: Run) -> None:
    event = run.site_down()
    no_failures(event)
    assert event.facts["answered_by_during"], "nothing answered eu's clients"
    assert set(event.facts["answered_by_during"]) <= set(run.sites.edges("us"))
    assert event.recovery_s is not None  # and back on its own edges once they return


def test_5a_killing_the_consul_leader_elects_another_and_nothing_serving_notices(
        run: Run) -> None:
    event = run.consul_leader()
    no_failures(event)
    assert event.facts["elected"] != event.facts["killed"]
    assert event.recovery_s is not None  # the killed server rejoined as a voter


def test_5b_killing_the_center_host_degrades_escalation_only(run: Run) -> None:
    event = run.center_host()
    no_failures(event)
    assert event.facts["degraded_during"] > 0
    assert event.recovery_s is not None


def test_6a_killing_the_primary_registry_s_host_the_standby_takes_over(run: Run) -> None:
    event = run.registry_host()
    no_failures(event)
    facts = event.facts
    print(f"registry failover: {facts['killed']}'s host killed, {facts['primary']} primary "
          f"after {event.failover_s:.1f} s, first write accepted after "
          f"{facts['first_write_s']} s; its publish on every node in {facts['rollout_s']} s")
    assert event.failover_s is not None and event.failover_s < 30  # loose: shared CI
    assert facts["audit_rc"] == {n: 0 for n in run.sites.registry_homes()}, facts
    assert facts["roles"] == {facts["primary"]: "primary", facts["killed"]: "standby"}


def test_6b_registry_hosts_cut_from_each_other_no_failover_async_publish(run: Run) -> None:
    event = run.registries_partitioned()
    no_failures(event)
    facts = event.facts
    primary = facts["primary"]
    assert facts["roles_during"][primary] == "primary"  # it kept the lock
    assert set(facts["roles_during"].values()) == {"primary", "standby"}
    assert facts["publish_rc"] == 0 and facts["publish_warning"], facts
    assert event.recovery_s is not None  # the standby caught up after the heal


def test_6c_the_primary_registry_cut_from_consul_is_fenced_and_no_split_brain(
        run: Run) -> None:
    event = run.primary_from_consul()
    no_failures(event)
    facts = event.facts
    print(f"registry cut from Consul: {facts['old']} refusing writes after "
          f"{facts['fenced_s']} s, {facts['new']} accepting after {event.failover_s:.1f} s "
          f"({facts['tries']} writes tried)")
    assert facts["old_codes"] and 6 in facts["old_codes"], facts  # refused: not primary
    assert facts["old_accepted_after_new"] == [], facts  # no split brain
    assert event.failover_s is not None and event.failover_s < 60
    assert facts["roles"] == {facts["new"]: "primary", facts["old"]: "standby"}
    assert facts["chains_equal"]


def test_after_everything_every_node_is_on_the_last_release_and_the_audit_holds(
        run: Run) -> None:
    assert run.traffic is not None
    run.traffic.stop()
    done = run.converged()
    assert set(done["versions"].values()) == {done["latest"]}, done["versions"]
    states = {(r["node"], r["version"], r["state"]) for r in done["status"]}
    assert {n for n, v, s in states if v == done["latest"] and s == "ACTIVE"} >= set(
        run.nodes()), states
    assert done["audit_rc"] == 0, done["audit"]
    assert not [a for a in run.traffic.answers if a.status != 200]


def test_escalation_crosses_a_slow_site_link(run: Run) -> None:
    """Escalation through a link with 20 ms added each way: every row still answered by the
    center, at least a round trip (40 ms) slower than the direct link."""
    latency = run.escalation_latency(requests=20)
    direct, slow = latency["direct"], latency["+20 ms each way"]
    assert slow["p50_ms"] >= direct["p50_ms"] + 30, latency


def node(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["parameters"]["node_id"])


def body(n: int) -> str:
    return json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                                   "data": [f"review number {n}"]}]})
