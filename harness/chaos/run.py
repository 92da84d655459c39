"""One chaos session: a fresh stack (Consul, registry serve, a center, two edges, nginx) with a
release published, the recording made through nginx, the replay with faults and kills, then the
registry checked; its tables. Used by ``python -m bench.chaos`` and ``tests/chaos``."""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from harness.chaos import record
from harness.chaos.replay import Chaos, Kill, Plan, Tally, replay
from harness.processes import BIN, free_port
from harness.stores import publish
from registry.store.db import connect, integrity_check
from tiered.stack import Stack


@dataclass
class Outcome:
    tally: Tally
    kills: list[Kill]
    recorded: int
    published_version: int | None
    publish_error: str | None
    integrity: str
    audit_verified: bool
    audit_output: str
    fleet_versions: set[int]
    restarts: dict[str, int]


def session(root: Path, release: Path, next_release: Path, model: str, requests: int,
            plan: Plan, nginx_flags: tuple[str, ...] = ()) -> Outcome:
    """Run it all under ``root``; ``release`` is published first, ``next_release`` during the
    run (the publish the registry is killed in)."""
    home = root / "registry"
    publish(home, release, model)
    stack = Stack(root, home, secrets.token_hex(16), http_port=free_port(),
                  consul_port=free_port(), nginx_flags=nginx_flags)
    try:
        stack.up(timeout=180)
        stack.supervise()
        recording = record.record(stack.url, model, requests, root / "recording.jsonl")
        chaos = Chaos(stack, plan, len(recording), model, next_release)
        tally = replay(stack.url, record.load(root / "recording.jsonl"), plan, chaos,
                       recorded_version=1)
        chaos.join()
        versions = chaos.fleet_versions()
        audit = subprocess.run([str(BIN / "registry"), "--home", str(home), "audit",
                                "--verify"], capture_output=True, text=True,
                               env={"PATH": str(BIN), "HOME": str(home)})
        db = connect(home / "registry.sqlite3")
        try:
            integrity = integrity_check(db)
        finally:
            db.conn.close()
        return Outcome(tally, chaos.kills, len(recording), chaos.published_version,
                       chaos.publish_error, integrity, audit.returncode == 0,
                       (audit.stdout + audit.stderr).strip()[-300:], versions,
                       {c.name: c.restarts for c in stack.children.values() if c.restarts})
    finally:
        stack.stop()


def tables(outcome: Outcome) -> list[Table]:
    t = outcome.tally
    summary = Table(title=f"Chaos replay: {t.sent} recorded requests in {t.seconds:.1f} s "
                          f"({outcome.recorded} recorded through nginx)")
    for column in ("", "count", "must be"):
        summary.add_column(column, justify="right" if column else "left")
    rows = [
        ("requests sent", t.sent, ""),
        ("connections dropped mid-request", t.dropped, "no answer expected"),
        ("corrupted bodies sent", t.corrupted, ""),
        ("well-formed requests sent", t.well_formed, ""),
        ("answered 2xx", t.ok, f"= well-formed ({t.well_formed})"),
        ("answered 4xx", t.client_errors, f"= corrupted ({t.corrupted})"),
        ("  of which corrupted", t.corrupted_4xx, ""),
        ("5xx to well-formed requests", t.server_errors, "0"),
        ("5xx to corrupted requests", t.corrupted_5xx, "0"),
        ("well-formed with no HTTP answer", t.transport_errors, "0"),
        ("retried once (connection closed before an answer)", t.retried, ""),
        ("degraded answers (center unreachable)", t.degraded, "> 0 while the center is down"),
        ("same labels as recorded (v1 on edge and center, not degraded)",
         f"{t.same_as_recorded}/{t.comparable}", ""),
    ]
    for row in rows:
        summary.add_row(*map(str, row))
    kills = Table(title="Kills (SIGKILL) and recovery: restarted, ready, passing in Consul")
    for column in ("kill", "target", "at request", "recovered after", "detail"):
        kills.add_column(column)
    for k in outcome.kills:
        kills.add_row(k.kind, k.target, str(k.at_request),
                      f"{k.recovered_s:.2f} s" if k.recovered_s is not None else "NOT BACK",
                      k.detail)
    state = Table(title="Afterwards")
    state.add_column("check")
    state.add_column("result")
    state.add_row("registry integrity_check", outcome.integrity)
    state.add_row("registry audit --verify", "passes" if outcome.audit_verified
                  else f"FAILS: {outcome.audit_output}")
    state.add_row("release published during the run",
                  f"v{outcome.published_version}" if outcome.published_version
                  else f"FAILED: {outcome.publish_error}")
    state.add_row("versions the fleet serves", ", ".join(f"v{v}" for v in
                                                        sorted(outcome.fleet_versions)))
    state.add_row("restarts by the supervisor", ", ".join(
        f"{n} x{c}" for n, c in sorted(outcome.restarts.items())))
    result = [summary, kills, state]
    if t.errors:
        errors = Table(title="Errors seen by the replay client")
        errors.add_column("error")
        errors.add_column("count", justify="right")
        for error, count in t.errors.most_common():
            errors.add_row(error, str(count))
        result.append(errors)
    return result
