"""Refused calls tallied per peer host, for the one aggregate audit record per interval."""

from __future__ import annotations

from registry.server.limits import OTHERS, TOP, Refusals, peer_host

FETCH, SYNC = "/tiered.sync.v1.Sync/Fetch", "/tiered.sync.v1.Sync/Sync"


def test_the_ephemeral_port_is_stripped() -> None:
    assert peer_host("ipv4:10.0.0.5:53412") == "10.0.0.5"
    assert peer_host("ipv6:[::1]:53412") == "::1"
    assert peer_host("ipv6:[2001:db8::7]:1") == "2001:db8::7"
    assert peer_host("unix:/run/x.sock") == "unix:/run/x.sock"
    assert len(peer_host("x" * 1000)) == 128


def test_one_record_per_interval_with_each_host_count_methods_and_times() -> None:
    refusals = Refusals(limit=1000, interval_s=60)
    said = [refusals.note(FETCH, f"ipv4:10.0.0.5:{port}") for port in range(40000, 40300)]
    said.append(refusals.note(SYNC, "ipv4:10.0.0.5:1"))
    said.append(refusals.note(FETCH, "ipv4:10.0.0.6:1"))
    assert [s for s in said if s] == [f"refused {FETCH} from ipv4:10.0.0.5:40000: missing or "
                                      f"wrong token", f"refused {FETCH} from ipv4:10.0.0.6:1: "
                                      f"missing or wrong token"]
    assert refusals.pending == 302
    (row,) = refusals.drain()
    assert row["count"] == 302 and row["hosts"] == 2 and not row["hosts_estimated"]
    assert row["methods"] == {FETCH: 301, SYNC: 1} and row["others"] == 0
    assert row["first"] <= row["last"] and row["over_limit"] == 0 and row["interval_s"] == 60
    five, six = row["top"]  # by count
    assert five == {"peer": "10.0.0.5", "count": 301, "methods": {FETCH: 300, SYNC: 1},
                    "over_limit": 0}
    assert six["peer"] == "10.0.0.6" and six["count"] == 1
    assert refusals.drain() == [] and refusals.pending == 0  # a new interval


def test_past_the_limit_a_refusal_is_only_counted() -> None:
    refusals = Refusals(limit=10, interval_s=60)
    said = [refusals.note(FETCH, "ipv4:10.0.0.5:1") for _ in range(2000)]
    assert sum(s is not None for s in said) == 2 and "passed 10 refused calls" in str(said[10])
    (row,) = refusals.drain()
    assert row["count"] == 2000 and row["over_limit"] == 1990
    assert row["top"][0]["methods"] == {FETCH: 10}  # the cheap path does not count methods


def test_refusals_from_1500_loopback_addresses_make_one_record() -> None:
    """The attack: 1,500 source addresses (127.x.y.z) used to write 1,500 fsynced records."""
    refusals = Refusals(limit=100, interval_s=60)
    hosts = [f"127.{i // 250}.{i % 250}.{1 + i % 7}" for i in range(1500)]
    for n, host in enumerate(hosts):
        for _ in range(1 + (n == 7) * 50):  # one host much busier than the rest
            refusals.note(FETCH, f"ipv4:{host}:40000")
    (row,) = refusals.drain()
    assert row["hosts"] == 1500 and not row["hosts_estimated"]
    assert row["count"] == 1550 and len(row["top"]) == TOP == 20
    assert row["top"][0] == {"peer": hosts[7], "count": 51, "methods": {FETCH: 51},
                             "over_limit": 0}
    assert row["others"] == 1550 - sum(t["count"] for t in row["top"]) == 1480


def test_past_max_peers_hosts_share_one_tally_and_are_estimated() -> None:
    refusals = Refusals(limit=10, interval_s=60, max_peers=100)
    for i in range(5000):
        refusals.note(FETCH, f"ipv4:10.{i // 256}.{i % 256}.1:5")
    assert len(refusals._tallies) == 101  # memory: max_peers tallies and the shared one
    (row,) = refusals.drain()
    assert row["count"] == 5000 and row["hosts_estimated"]
    assert 4500 < row["hosts"] < 5500  # linear counting over 64 Ki bits
    assert row["top"][0]["peer"] == OTHERS and row["top"][0]["count"] == 4900
