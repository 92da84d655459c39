"""Refused calls tallied per peer host, for the aggregate audit records."""

from __future__ import annotations

from sync.limits import OTHERS, Refusals, peer_host

FETCH, SYNC = "/tiered.sync.v1.Sync/Fetch", "/tiered.sync.v1.Sync/Sync"


def test_the_ephemeral_port_is_stripped() -> None:
    assert peer_host("ipv4:10.0.0.5:53412") == "10.0.0.5"
    assert peer_host("ipv6:[::1]:53412") == "::1"
    assert peer_host("ipv6:[2001:db8::7]:1") == "2001:db8::7"
    assert peer_host("unix:/run/x.sock") == "unix:/run/x.sock"
    assert len(peer_host("x" * 1000)) == 128


def test_one_row_per_host_with_count_methods_and_times() -> None:
    refusals = Refusals(limit=1000, interval_s=60)
    said = [refusals.note(FETCH, f"ipv4:10.0.0.5:{port}") for port in range(40000, 40300)]
    said.append(refusals.note(SYNC, "ipv4:10.0.0.5:1"))
    said.append(refusals.note(FETCH, "ipv4:10.0.0.6:1"))
    assert [s for s in said if s] == [f"refused {FETCH} from ipv4:10.0.0.5:40000: missing or "
                                      f"wrong token", f"refused {FETCH} from ipv4:10.0.0.6:1: "
                                      f"missing or wrong token"]
    assert refusals.pending == 302
    rows = {r["peer"]: r for r in refusals.drain()}
    assert set(rows) == {"10.0.0.5", "10.0.0.6"}
    five = rows["10.0.0.5"]
    assert five["count"] == 301 and five["methods"] == {FETCH: 300, SYNC: 1}
    assert five["first"] <= five["last"] and five["over_limit"] == 0
    assert refusals.drain() == [] and refusals.pending == 0  # a new interval


def test_past_the_limit_a_refusal_is_only_counted() -> None:
    refusals = Refusals(limit=10, interval_s=60)
    said = [refusals.note(FETCH, "ipv4:10.0.0.5:1") for _ in range(2000)]
    assert sum(s is not None for s in said) == 2 and "passed 10 refused calls" in str(said[10])
    (row,) = refusals.drain()
    assert row["count"] == 2000 and row["over_limit"] == 1990
    assert row["methods"] == {FETCH: 10}  # the cheap path does not even count methods


def test_many_hosts_share_one_row_past_max_peers() -> None:
    refusals = Refusals(limit=10, interval_s=60, max_peers=100)
    for i in range(5000):
        refusals.note(FETCH, f"ipv4:10.{i // 256}.{i % 256}.1:5")
    rows = refusals.drain()
    assert len(rows) == 101
    assert [r["count"] for r in rows if r["peer"] == OTHERS] == [4900]
