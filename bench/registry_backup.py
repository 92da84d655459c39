"""Registry backup and restore at scale: a registry of a million audit records and 2 GB of blobs
is backed up while a writer appends audit records every ~20 ms (the "publish blocked" figure),
then restored and verified, each step timed.

    .venv/bin/python -m bench.registry_backup [--rows 1000000] [--blob-mb 2000] [--blobs 20]
        [--work DIR] [--markdown docs/bench/registry_backup.md]

Defaults take about 2 minutes and ~7 GB of disk on a 2-core machine; everything is generated
under a temporary folder (in --work) and deleted at the end. Quick: --rows 50000 --blob-mb 100.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from pathlib import Path

from rich.table import Table

from bench.harness import console
from bench.kit import cpu, load_average, usable_cores
from bench.markdown import Shown
from registry.ha import backup
from registry.settings import RegistrySettings
from registry.store import chain
from registry.store.clock import now
from registry.store.db import connect, transaction
from registry.trust import anchor

BATCH = 100_000
WRITE_EVERY_S = 0.02
CHUNK = 4 << 20


def build_chain(settings: RegistrySettings, rows: int) -> float:
    """``rows`` audit records with correct hashes, inserted directly in large transactions,
    then the chain's head signed (as ``registry audit --anchor``)."""
    started = time.perf_counter()
    db = connect(settings.database)
    prev, at = chain.GENESIS, now()
    for first in range(1, rows + 1, BATCH):
        batch = []
        for seq in range(first, min(first + BATCH, rows + 1)):
            fields = (seq, at, "bench@host", "note", f"model-{seq % 50}", seq % 7 + 1, None,
                      f'{{"i":{seq},"text":"ü"}}', prev)
            prev = chain.row_hash((*fields, ""))
            batch.append((*fields, prev))
        with transaction(db) as conn:
            conn.executemany("INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", batch)
    anchor.for_settings(settings).create(db)
    db.conn.close()
    return time.perf_counter() - started


def build_blobs(settings: RegistrySettings, count: int, total_mb: int) -> tuple[float, int]:
    """``count`` random files of ``total_mb`` MB together, stored as blobs and registered."""
    started = time.perf_counter()
    size = total_mb * 1_000_000 // count
    db = connect(settings.database)
    tmp = settings.blobs / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        part = tmp / f"gen-{i}"
        digest = hashlib.sha256()
        with part.open("wb") as f:
            left = size
            while left:
                chunk = os.urandom(min(CHUNK, left))
                digest.update(chunk)
                f.write(chunk)
                left -= len(chunk)
        sha = digest.hexdigest()
        target = settings.blobs / "sha256" / sha[:2] / sha
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(part, target)
        with transaction(db) as conn:
            conn.execute("INSERT INTO blobs VALUES (?, ?, ?)", (sha, size, now()))
    db.conn.close()
    return time.perf_counter() - started, size * count


def writer(database: str, stop: Event, out: Connection) -> None:
    """Append one audit record per ~20 ms, each in its own BEGIN IMMEDIATE transaction (what a
    publish's write is), and send back (start, seconds) of each until ``stop``."""
    db = connect(Path(database))
    times = []
    while not stop.is_set():
        started = time.monotonic()
        with transaction(db) as conn:
            chain.append(conn, actor="writer@bench", action="note", payload={"w": 1})
        times.append((started, time.monotonic() - started))
        time.sleep(WRITE_EVERY_S)
    out.send(times)


def summary(times: list[tuple[float, float]]) -> tuple[int, float, float, float]:
    took = sorted(t for _, t in times) or [0.0]
    p99 = took[min(len(took) - 1, int(len(took) * 0.99))]
    return len(times), statistics.median(took) * 1e3, p99 * 1e3, took[-1] * 1e3


def run(args: argparse.Namespace, work: Path, show: Shown) -> None:
    settings = RegistrySettings(home=work / "home", actor="bench@host")
    chain_s = build_chain(settings, args.rows)
    blobs_s, blob_bytes = build_blobs(settings, args.blobs, args.blob_mb)
    db_bytes = settings.database.stat().st_size
    console.log(f"built {args.rows:,} audit records in {chain_s:.1f} s, {args.blobs} blobs "
                f"({blob_bytes / 1e9:.2f} GB) in {blobs_s:.1f} s; database {db_bytes / 1e6:.0f} MB")

    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=writer, args=(str(settings.database), stop, send))
    proc.start()
    time.sleep(args.idle_s)  # writes before the backup: the idle figure
    backup_start = time.monotonic()
    made = backup.backup(settings, work / "backup")
    backup_end = time.monotonic()
    time.sleep(0.5)
    stop.set()
    times: list[tuple[float, float]] = receive.recv()
    proc.join()
    def overlapping(start: float, end: float) -> list[tuple[float, float]]:
        return [t for t in times if t[0] < end and t[0] + t[1] > start]

    idle = [t for t in times if t[0] + t[1] < backup_start]
    during = overlapping(backup_start, backup_end)
    in_snapshot = overlapping(backup_start, backup_start + made.timings["database"])
    rows_in_backup = made.manifest["counts"]["audit"]

    started = time.perf_counter()
    restored = backup.restore(settings, work / "backup", work / "restored")
    restore_s = time.perf_counter() - started
    t = restored.timings

    facts = Table(title="Machine and sizes", show_header=False)
    facts.add_column("")
    facts.add_column("")
    for key, value in [
            ("cpu", cpu()), ("cores", usable_cores()), ("load average", load_average()),
            ("audit records", f"{rows_in_backup:,} in the backup"),
            ("database", f"{db_bytes / 1e6:.0f} MB"),
            ("blobs", f"{args.blobs} × {blob_bytes / args.blobs / 1e6:.0f} MB = "
                      f"{blob_bytes / 1e9:.2f} GB (random)"),
            ("disk", "one virtual disk for source, backup and restore (/tmp)")]:
        facts.add_row(key, value)
    show(facts)

    steps = Table(title="Backup (online, while a writer appends every 20 ms)")
    for col in ("step", "seconds"):
        steps.add_column(col, justify="right" if col == "seconds" else "left")
    steps.add_row("database: online backup API (one read transaction)",
                  f"{made.timings['database']:.2f}")
    steps.add_row("database: sha256", f"{made.timings['database_sha']:.2f}")
    steps.add_row("blobs: copy + sha256 (thread pool)", f"{made.timings['blobs']:.2f}")
    steps.add_row("total", f"{made.timings['total']:.2f}")
    show(steps)

    blocked = Table(title="The writer (BEGIN IMMEDIATE + audit append + COMMIT, synchronous=FULL)")
    for col in ("when", "writes", "median ms", "p99 ms", "max ms"):
        blocked.add_column(col, justify="left" if col == "when" else "right")
    for name, part in [("before the backup (idle)", idle),
                       ("during the database snapshot", in_snapshot),
                       ("during the whole backup", during)]:
        n, med, p99, top = summary(part)
        blocked.add_row(name, str(n), f"{med:.1f}", f"{p99:.1f}", f"{top:.1f}")
    show(blocked)

    rest = Table(title="Restore + verify into a new home")
    for col in ("step", "seconds", "per million audit rows"):
        rest.add_column(col, justify="left" if col == "step" else "right")
    per = 1e6 / max(rows_in_backup, 1)
    names = [("database_copy_sha", "database copy + sha256"),
             ("integrity_check", "PRAGMA integrity_check"),
             ("chain_verify", "audit chain verify"),
             ("head_check", "signed head check"),
             ("blob_verify", "blobs copy + sha256 (thread pool)")]
    for key, name in names:
        rest.add_row(name, f"{t[key]:.2f}", f"{t[key] * per:.2f}")
    db_part = sum(t[k] for k, _ in names[:4])
    rest.add_row("restore + verify without blobs", f"{db_part:.2f}", f"{db_part * per:.2f}")
    rest.add_row("total (with blobs, renames, fsyncs)", f"{restore_s:.2f}",
                 f"{restore_s * per:.2f}")
    show(rest)
    n, _, _, top = summary(during)
    show(f"Backup: {made.timings['total']:.1f} s for {blob_bytes / 1e9:.2f} GB of blobs and a "
         f"{db_bytes / 1e6:.0f} MB database; the concurrent writer's longest write during it "
         f"took {top:.1f} ms ({n} writes). Restore + verify of the database and its chain: "
         f"{db_part * per:.2f} s per million audit records; with the blobs {restore_s:.1f} s.")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--rows", type=int, default=1_000_000, help="audit records")
    parser.add_argument("--blob-mb", type=int, default=2000, help="MB of blobs in all")
    parser.add_argument("--blobs", type=int, default=20, help="how many blobs")
    parser.add_argument("--idle-s", type=float, default=2.0,
                        help="seconds the writer runs before the backup starts")
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the temporary data (default: the system's temp)")
    parser.add_argument("--markdown", type=Path, default=None,
                        help="also write the tables as a markdown fragment")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.blob_mb < 1 or args.blobs < 1:
        parser.error("--rows, --blob-mb and --blobs must be at least 1")
    show = Shown(console)
    with tempfile.TemporaryDirectory(prefix="registry-backup-", dir=args.work) as work:
        run(args, Path(work), show)
    if args.markdown:
        show.write(args.markdown, "Registry backup and restore (`python -m bench.registry_backup`)")
        console.log(f"wrote {args.markdown}")


if __name__ == "__main__":
    main()
