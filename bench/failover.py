"""What a registry standby costs and buys: a real Consul dev agent and two ``registry serve
--ha`` on 127.0.0.1, measured side by side in one run.

    .venv/bin/python -m bench.failover [--kills 3] [--writes 40] [--blob-mb 1,50]
        [--markdown docs/bench/registry_failover.md]

- **failover**: SIGKILL of the primary → the first write the standby's home accepts (a write
  tried every 20 ms in this process, as ``registry`` commands write: a transaction on the
  SQLite file, fenced by the role and lease); then the old primary is started again, follows,
  and is killed in turn. Per kill: the seconds to the first accepted write.
- **semi-synchronous commit**: the same small audited write (an audit record and a cascade
  policy), committed alone, then committed and waited for until the standby holds it (what a
  command does with ``REGISTRY_SYNC_STANDBYS=1``): p50/p99 of each and the added time.
- **replication lag under a publish**: a publish-sized write (a new blob of N MB, its catalog
  row and its audit record) committed on the primary, and the time until the standby has
  applied it (blob fetched and digest-checked, transaction applied).
"""

from __future__ import annotations

import os
import signal
import statistics
import tempfile
import time
from pathlib import Path

import click

from bench.kit import cpu, machine_line
from registry.ha import changes
from registry.store import chain, role
from registry.store.blobs import BlobStore
from registry.store.db import connect, transaction
from registry.trust import pki
from tiered.children import Child
from tiered.commands import registry_argv
from tiered.processes import free_port
from tiered.stack import Stack

SECRET = "bench-failover-0123456789"
EXTRA: dict[str, str] = {}  # settings every registry of the run gets (REGISTRY_LOCK_TTL_S)


def role_of(home: Path) -> str:
    state = role.read_state(home / "registry.sqlite3")
    return state.role if state else "-"


def primary_of(stack: Stack, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [n for n, h in stack.registry_homes().items()
                 if role_of(h) == "primary"]
        if len(found) == 1:
            return found[0]
        time.sleep(0.05)
    raise RuntimeError("no primary")


def small_write(home: Path, n: int) -> None:
    db = connect(home / "registry.sqlite3")
    try:
        with transaction(db) as conn:
            chain.append(conn, actor="bench", action="cascade-policy", model="bench",
                         payload={"n": n})
            conn.execute("INSERT INTO models VALUES ('bench', 'now') ON CONFLICT DO NOTHING")
            conn.execute("INSERT INTO cascade_policies (model, mode, capacity_rows_s, split, "
                         "updated_at) VALUES ('bench', 'static', ?, 'traffic', 'now') ON "
                         "CONFLICT (model) DO UPDATE SET capacity_rows_s = excluded."
                         "capacity_rows_s", (float(n + 1),))
    finally:
        db.conn.close()


def first_accepted(home: Path) -> float:
    """Seconds until a write to ``home`` is accepted (tried every 20 ms)."""
    started = time.monotonic()
    n = 0
    while time.monotonic() - started < 120:
        try:
            small_write(home, n)
            return time.monotonic() - started
        except Exception:
            n += 1
            time.sleep(0.02)
    raise RuntimeError("no write accepted in 120 s")


def wait_caught_up(stack: Stack, timeout: float = 120) -> None:
    homes = list(stack.registry_homes().values())
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        positions = set()
        for home in homes:
            db = connect(home / "registry.sqlite3")
            positions.add(changes.position(db.conn))
            db.conn.close()
        if len(positions) == 1:
            return
        time.sleep(0.05)
    raise RuntimeError("the standby never caught up")


def kill(stack: Stack, name: str) -> Child:
    child = stack.children[name]
    os.kill(child.pid, signal.SIGKILL)
    child.process.wait(10)
    return child


def failovers(stack: Stack, kills: int) -> list[float]:
    seconds = []
    for _ in range(kills):
        wait_caught_up(stack)
        primary = primary_of(stack)
        standby = next(n for n in stack.registry_homes() if n != primary)
        old = kill(stack, primary)
        seconds.append(first_accepted(stack.registry_homes()[standby]))
        home = stack.registry_homes()[old.name]
        stack.spawn(old.name, old.argv, old.port, "registry",
                    env={**EXTRA, "REGISTRY_HOME": str(home)})
        deadline = time.monotonic() + 60
        while role_of(home) != "standby" and time.monotonic() < deadline:
            time.sleep(0.1)
    return seconds


def semi_sync(stack: Stack, writes: int) -> tuple[list[float], list[float]]:
    wait_caught_up(stack)
    home = stack.registry_homes()[primary_of(stack)]
    alone, waited = [], []
    for i in range(writes):
        started = time.perf_counter()
        small_write(home, 1000 + i)
        alone.append(time.perf_counter() - started)
        started = time.perf_counter()
        small_write(home, 5000 + i)
        db = connect(home / "registry.sqlite3")
        try:
            held = changes.wait_replicated(db, changes.position(db.conn), 1, 10)
        finally:
            db.conn.close()
        if held is None:
            raise RuntimeError("the standby did not ack within 10 s")
        waited.append(time.perf_counter() - started)
    return alone, waited


def lag(stack: Stack, megabytes: int, work: Path) -> float:
    wait_caught_up(stack)
    primary = primary_of(stack)
    homes = stack.registry_homes()
    standby = next(h for n, h in homes.items() if n != primary)
    blob = work / f"blob-{megabytes}"
    blob.write_bytes(os.urandom(megabytes << 20))
    db = connect(homes[primary] / "registry.sqlite3")
    sha, size = BlobStore(homes[primary] / "blobs").put(blob)
    with transaction(db) as conn:
        chain.append(conn, actor="bench", action="publish", sha256=sha)
        conn.execute("INSERT INTO blobs VALUES (?, ?, 'now')", (sha, size))
        at = changes.position(conn)
    committed = time.monotonic()
    db.conn.close()
    standby_db = connect(standby / "registry.sqlite3")
    try:
        while changes.position(standby_db.conn) < at:
            if time.monotonic() - committed > 300:
                raise RuntimeError("no replication in 300 s")
            time.sleep(0.005)
    finally:
        standby_db.conn.close()
    return time.monotonic() - committed


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@click.command()
@click.option("--kills", default=3, show_default=True, help="Primaries killed, one by one.")
@click.option("--writes", default=40, show_default=True, help="Writes per semi-sync mode.")
@click.option("--blob-mb", default="1,50", show_default=True,
              help="Publish sizes (MB) for the replication lag.")
@click.option("--lock-ttl", default=3.0, show_default=True, help="REGISTRY_LOCK_TTL_S.")
@click.option("--markdown", type=click.Path(path_type=Path), default=None,
              help="Also write the table as a markdown fragment.")
def main(kills: int, writes: int, blob_mb: str, lock_ttl: float,
         markdown: Path | None) -> None:
    """Failover time, semi-synchronous commit cost, replication lag: one primary, one
    standby, a Consul dev agent, 127.0.0.1."""
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as folder:
        work = Path(folder)
        stack = Stack(work, work / "registry", SECRET, http_port=free_port(),
                      consul_port=free_port(), standbys=1, consul_acl=False, provision=False)
        try:
            pki.fleet(stack.tls, ["127.0.0.1", "localhost"])
            stack.start_consul()
            EXTRA["REGISTRY_LOCK_TTL_S"] = str(lock_ttl)
            for name, home in stack.registry_homes().items():
                port = free_port()
                stack.spawn(name, registry_argv(home, port, free_port()), port, "registry",
                            env={**EXTRA, "REGISTRY_HOME": str(home)})
            small_write(stack.registry_homes()[primary_of(stack)], 0)
            taken = failovers(stack, kills)
            alone, waited = semi_sync(stack, writes)
            lags = {int(mb): lag(stack, int(mb), work) for mb in blob_mb.split(",")}
        finally:
            stack.stop()
    added = (pct(waited, .5) - pct(alone, .5)) * 1e3
    lines = [f"registry failover: a Consul dev agent, 2 x registry serve --ha "
             f"(REGISTRY_LOCK_TTL_S={lock_ttl:g}), 127.0.0.1", f"CPU: {cpu()}", machine_line(),
             "", "| measure | figure |", "|---|---|",
             f"| SIGKILL of the primary -> first write accepted by the standby, per kill (s) "
             f"| {', '.join(f'{s:.2f}' for s in taken)} |",
             f"| ... median / max (s) | {statistics.median(taken):.2f} / {max(taken):.2f} |",
             f"| small write, committed alone: p50 / p99 (ms) | {pct(alone, .5) * 1e3:.1f} / "
             f"{pct(alone, .99) * 1e3:.1f} |",
             f"| same write + wait for the standby (semi-sync): p50 / p99 (ms) | "
             f"{pct(waited, .5) * 1e3:.1f} / {pct(waited, .99) * 1e3:.1f} |",
             f"| added by semi-sync: p50 (ms) | {added:.1f} |"]
    lines += [f"| replication lag of a {mb} MB publish (commit -> applied on the standby, "
              f"s) | {seconds:.2f} |" for mb, seconds in lags.items()]

    text = "\n".join(lines)
    print(text)
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(f"## Registry failover (`python -m bench.failover`)\n\n{text}\n")
        print(f"wrote {markdown}")

if __name__ == "__main__":
    main()
