"""``registry backup DEST`` and ``registry restore SRC``: a consistent copy of a registry home,
and a checked way back from one.

A backup is a folder: ``registry.sqlite3`` (SQLite's online backup API, from one short read
transaction: in WAL mode writers go on meanwhile), every blob the snapshot's ``blobs`` table
lists (rehashed while copied), ``audit-head.json`` (the signed head, read *before* the
snapshot so it never names a record the snapshot lacks: the head only moves forward, after
its commit), ``keys/signing.pub`` (the public key only: the private key is kept apart) and the
manifest ``backup.json``. It is written into a hidden sibling folder and renamed into place
last: a crashed backup never looks complete. Backup is a read: it records nothing in the
audit log.

Restore checks everything before it moves anything into place: the manifest, the database's
size and sha256, each blob's size and sha256, ``PRAGMA integrity_check``, the hash chain, the
signed head (``anchor.check``) and that the chain ends where the manifest says. It builds the
new home in a hidden sibling folder and renames it into place; an existing home is only
replaced with ``force``, and then moved aside (``<home>.replaced-<timestamp>``), never deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlite_utils
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from registry.errors import BackupRefused, IntegrityError, NotFound, RegistryError
from registry.settings import RegistrySettings
from registry.store import chain
from registry.store.clock import now
from registry.store.db import BUSY_TIMEOUT_MS
from registry.trust import anchor, keys
from serving.release.signing import SigningError, key_id

FORMAT = "tiered-registry-backup-v1"
MANIFEST = "backup.json"
DATABASE = "registry.sqlite3"
PUBLIC_KEY = Path("keys") / keys.PUBLIC
CHUNK = 4 << 20
FLUSH_BYTES = 4 * CHUNK  # copies are flushed every 16 MiB, not in one go at the end
WORKERS = max(2, min(4, os.cpu_count() or 2))
CARRIED = ("keys", "tls")  # kept from a replaced home: never in a backup (secrets)


# -- files -------------------------------------------------------------------------------------


def copy_hashed(source: Path, target: Path) -> tuple[str, int]:
    """Copy ``source`` to a new file ``target`` (fsynced), hashing what was read; return the
    sha256 and size of the bytes copied."""
    digest = hashlib.sha256()
    size = 0
    with source.open("rb") as src, target.open("xb") as dst:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            dst.write(chunk)
            size += len(chunk)
            if size % FLUSH_BYTES == 0:  # a little at a time: see ``snapshot``
                dst.flush()
                os.fdatasync(dst.fileno())
        dst.flush()
        os.fsync(dst.fileno())
    return digest.hexdigest(), size


def file_digest(path: Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def fsync_tree(root: Path) -> None:
    """fsync every folder under ``root`` (files are fsynced when written): the renames and
    new names are on disk before the final rename makes the tree visible."""
    for folder, _, _ in os.walk(root):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def fsync_folder(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def staging(final: Path, tag: str) -> Iterator[Path]:
    """A hidden folder beside ``final`` to build into; removed unless the caller renamed it
    away (so an error or a kill leaves nothing that looks complete)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.{tag}-{os.getpid()}-{time.time_ns()}"
    tmp.mkdir()
    try:
        yield tmp
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def blob_relpath(sha256: str) -> Path:
    return Path("blobs") / "sha256" / sha256[:2] / sha256


def copy_blobs(blobs: list[tuple[str, int]], source_root: Path, target_root: Path,
               where: str, progress: Callable[[int], None] | None = None) -> None:
    """Copy each blob (sha256, size) from ``source_root`` to ``target_root`` (both homes or
    backup folders), in a thread pool, checking each copy's size and sha256: the first blob
    missing or not matching raises (``where`` names the side, in the message)."""

    def one(item: tuple[str, int]) -> int:
        sha, size = item
        source, target = source_root / blob_relpath(sha), target_root / blob_relpath(sha)
        if not source.is_file():
            raise NotFound(f"blob {sha} is missing from {where}")
        target.parent.mkdir(parents=True, exist_ok=True)
        got, got_size = copy_hashed(source, target)
        if got_size != size:
            raise IntegrityError(f"blob {sha} in {where} is {got_size} bytes, the "
                                 f"{'manifest' if where.startswith('the backup') else 'database'}"
                                 f" says {size} (truncated or grown)")
        if got != sha:
            raise IntegrityError(f"blob {sha} in {where} is corrupt: its content hashes to "
                                 f"{got}")
        return size

    with ThreadPoolExecutor(WORKERS) as pool:
        for size in pool.map(one, blobs):
            if progress is not None:
                progress(size)


# -- backup ------------------------------------------------------------------------------------


@dataclass
class BackupResult:
    path: Path
    manifest: dict[str, Any]
    timings: dict[str, float] = field(default_factory=dict)


def counts(conn: sqlite3.Connection) -> dict[str, int]:
    def count(table: str) -> int:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    return {"models": count("models"), "versions": count("versions"), "audit": count("audit")}


STEP_PAGES = 2048  # pages copied per backup step (8 MiB at 4 KiB pages)


def snapshot(database: Path, target: Path, pause_s: float = 0.002) -> None:
    """Copy the live database into ``target`` with the online backup API.

    One read transaction on the source pins the snapshot: in WAL mode it never blocks a
    writer (it only keeps a checkpoint from going past it meanwhile), and the backup, stepped
    in ``STEP_PAGES`` pieces, is not restarted by their commits. Each piece is flushed to disk
    before the next (``fdatasync``): written in one go, hundreds of MB of dirty pages made a
    concurrent writer's commit (its fsync) wait for them all (0.3-0.6 s measured at a million
    audit records); in pieces it waits for one piece at most."""
    source = sqlite3.connect(f"file:{database}?mode=ro", uri=True, isolation_level=None,
                             timeout=BUSY_TIMEOUT_MS / 1000)
    with closing(source), closing(sqlite3.connect(target, isolation_level=None)) as dest:
        source.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        dest.execute("PRAGMA cache_size = -2048")  # small: pages go to the file as they come
        source.execute("BEGIN")
        source.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()  # the snapshot
        fd = os.open(target, os.O_RDONLY)
        try:
            def flush(status: int, remaining: int, total: int) -> None:
                os.fdatasync(fd)
                time.sleep(pause_s)

            source.backup(dest, pages=STEP_PAGES, progress=flush)
        finally:
            os.close(fd)
            source.execute("COMMIT")
        # a single self-contained file (restore turns WAL back on when the home is opened)
        dest.execute("PRAGMA journal_mode = DELETE")
    with target.open("rb") as f:
        os.fsync(f.fileno())


class Laps:
    """Each step's time, as the time since the step before it (for the timings a backup or a
    restore reports)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.started = self.mark = clock()
        self.timings: dict[str, float] = {}

    def lap(self, name: str) -> None:
        t = self.clock()
        self.timings[name] = t - self.mark
        self.mark = t

    def total(self) -> None:
        self.timings["total"] = self.clock() - self.started


@dataclass
class Contents:
    """What a backup's database snapshot holds, for its manifest."""

    head: chain.Head | None
    blobs: list[tuple[str, int]]
    counts: dict[str, int]
    tables: list[str]


def backup(settings: RegistrySettings, dest: Path,
           clock: Callable[[], float] = time.perf_counter) -> BackupResult:
    """Write a backup of the registry home ``settings.home`` into the new folder ``dest``."""
    home = settings.home
    check_backup_target(settings, dest)
    with staging(dest, "partial") as tmp:
        laps = Laps(clock)
        # the signed head first: it only moves forward, after its commit, so the snapshot
        # taken next holds every record it names (a head behind the chain still verifies)
        signed = copy_signed_head(home, tmp)
        snapshot(settings.database, tmp / DATABASE)
        laps.lap("database")
        contents = read_contents(tmp / DATABASE)
        check_signed_head_is_in(signed, contents.head, home / anchor.FILE)
        database = file_digest(tmp / DATABASE)
        laps.lap("database_sha")
        copy_blobs(contents.blobs, home, tmp, f"the registry home {home}")
        laps.lap("blobs")
        public = write_public_key(settings, tmp)
        manifest = backup_manifest(home, contents, signed, database, public)
        write_manifest(tmp / MANIFEST, manifest)
        move_backup_into_place(tmp, dest)
        laps.total()
    return BackupResult(dest, manifest, laps.timings)


def check_backup_target(settings: RegistrySettings, dest: Path) -> None:
    """A home with a database to back up, and a new or empty ``dest`` outside it."""
    home, database = settings.home, settings.database
    if not database.is_file():
        raise NotFound(f"no registry database at {database} (REGISTRY_HOME {home})")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupRefused(f"{dest} exists and is not an empty folder: a backup goes into a "
                            f"new one")
    if dest.resolve().is_relative_to(home.resolve()):
        raise BackupRefused(f"{dest} is inside the registry home {home}: back up elsewhere")


def copy_signed_head(home: Path, tmp: Path) -> anchor.SignedHead | None:
    head_file = home / anchor.FILE
    signed = anchor.read(head_file)
    if signed is not None:
        shutil.copyfile(head_file, tmp / anchor.FILE)
    return signed


def read_contents(database: Path) -> Contents:
    with closing(sqlite3.connect(database)) as conn:
        return Contents(
            chain.head(conn),
            [(str(sha), int(size)) for sha, size in
             conn.execute("SELECT sha256, size FROM blobs ORDER BY sha256")],
            counts(conn),
            [r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")])


def check_signed_head_is_in(signed: anchor.SignedHead | None, head: chain.Head | None,
                            head_file: Path) -> None:
    """The signed head names no record past the snapshot's chain (else the home is damaged)."""
    if signed is not None and (head is None or signed.head.seq > head.seq):
        raise IntegrityError(f"the signed head {head_file} names record {signed.head.seq} "
                             f"but the database ends at {head.seq if head else 0}: run "
                             f"`registry audit --verify` before backing up")


def write_public_key(settings: RegistrySettings, tmp: Path) -> Ed25519PublicKey | None:
    """The signing key's public half, when there is a key (never the private key)."""
    public = keys.existing_public(settings)
    if public is not None:
        (tmp / PUBLIC_KEY).parent.mkdir()
        (tmp / PUBLIC_KEY).write_bytes(public.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return public


def backup_manifest(home: Path, contents: Contents, signed: anchor.SignedHead | None,
                    database: tuple[str, int], public: Ed25519PublicKey | None
                    ) -> dict[str, Any]:
    head, blobs = contents.head, contents.blobs
    db_sha, db_size = database
    return {
        "format": FORMAT,
        "created_at": now(),
        "source_home": str(home.resolve()),
        "audit_head": None if head is None else {"seq": head.seq, "hash": head.hash},
        "signed_head": None if signed is None else {"seq": signed.head.seq,
                                                    "hash": signed.head.hash},
        "database": {"file": DATABASE, "sha256": db_sha, "size": db_size},
        "blobs": [{"sha256": sha, "size": size} for sha, size in blobs],
        "blob_bytes": sum(size for _, size in blobs),
        "key_id": None if public is None else key_id(public),
        "counts": contents.counts,
        "tables": contents.tables,
    }


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    with path.open("x") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def move_backup_into_place(tmp: Path, dest: Path) -> None:
    """Everything on disk first, then one rename: a backup is complete or absent."""
    fsync_tree(tmp)
    if dest.exists():
        dest.rmdir()  # empty (checked above); rename wants it gone or empty
    os.rename(tmp, dest)
    fsync_folder(dest.parent)


# -- restore -----------------------------------------------------------------------------------


def read_manifest(src: Path) -> dict[str, Any]:
    if not src.is_dir():
        raise NotFound(f"no backup folder at {src}")
    path = src / MANIFEST
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise BackupRefused(f"{src} is not a registry backup: no {MANIFEST}") from None
    except (OSError, ValueError) as exc:
        raise IntegrityError(f"{path}: unreadable ({exc})") from exc
    try:
        if data["format"] != FORMAT:
            raise BackupRefused(f"{path}: format {data['format']!r}, this registry reads "
                                f"{FORMAT!r}")
        db = data["database"]
        if db["file"] != DATABASE or not isinstance(db["size"], int) \
                or not isinstance(db["sha256"], str):
            raise ValueError("database entry")
        for blob in data["blobs"]:
            sha, size = blob["sha256"], blob["size"]
            if not (isinstance(sha, str) and len(sha) == 64 and isinstance(size, int)
                    and all(c in "0123456789abcdef" for c in sha)):
                raise ValueError(f"blob entry {blob!r:.100}")
        head = data["audit_head"]
        if head is not None and not (isinstance(head["seq"], int)
                                     and isinstance(head["hash"], str)):
            raise ValueError("audit_head")
    except BackupRefused:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise IntegrityError(f"{path}: not a valid backup manifest ({exc})") from exc
    return data


@dataclass
class Missing:
    """What the home being replaced holds that the backup does not."""

    old_head: int
    records: tuple[int, int] | None  # the seq range past the backup's head
    diverged: bool  # the old chain has another record at the backup's head seq
    versions: list[tuple[str, int]]
    nodes_seen_seq: int  # the highest directive seq a node reported there


@dataclass
class RestoreResult:
    home: Path
    head_seq: int
    checked: int
    blobs: int
    replaced: Path | None = None
    missing: Missing | None = None
    carried: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        missing = self.missing
        return {"home": str(self.home), "head_seq": self.head_seq, "checked": self.checked,
                "blobs": self.blobs, "replaced": None if self.replaced is None else
                str(self.replaced), "carried": self.carried, "warnings": self.warnings,
                "missing": None if missing is None else {
                    "old_head": missing.old_head,
                    "records": list(missing.records) if missing.records else None,
                    "diverged": missing.diverged,
                    "versions": [f"{m}@{v}" for m, v in missing.versions],
                    "nodes_seen_seq": missing.nodes_seen_seq},
                "timings": self.timings, "notes": notes(self)}


def notes(result: RestoreResult) -> list[str]:
    """What an operator must know after a restore (the CLI prints these)."""
    lines = []
    missing, head = result.missing, result.head_seq
    if missing is not None:
        if missing.records:
            first, last = missing.records
            lines.append(f"the replaced home's audit chain went on to record {last}: records "
                         f"{first}..{last} are not in this backup")
        if missing.diverged:
            lines.append(f"the replaced home's record {head} differs from the backup's: the "
                         f"two chains diverged (not an older copy of the same registry)")
        if missing.versions:
            lines.append("model versions in the replaced home but not in this backup: "
                         + ", ".join(f"{m}@{v}" for m, v in missing.versions))
        if missing.nodes_seen_seq > head:
            lines.append(f"nodes reported accepting directives up to seq "
                         f"{missing.nodes_seen_seq} there (node_models.directive_seq), past "
                         f"this backup's head {head}")
    lines.append(f"the restored audit chain ends at seq {head}: nodes that accepted a directive "
                 f"past it keep refusing this registry's pushes until the chain passes their "
                 f"floor (a restore cannot downgrade them; docs/security.md)")
    return lines


def load_public(settings: RegistrySettings, home: Path, src: Path) -> tuple[
        Ed25519PublicKey | None, Path]:
    """The key to check the signed head with: the one this registry is configured with
    (REGISTRY_SIGNING_KEY, or the replaced home's key), else the backup's ``signing.pub``."""
    candidates = [settings.signing_key] if settings.signing_key is not None else []
    candidates += [home / "keys" / keys.PRIVATE, home / "keys" / keys.PUBLIC, src / PUBLIC_KEY]
    for path in candidates:
        if path is None or not path.is_file():
            continue
        try:
            if path.name == keys.PRIVATE or path == settings.signing_key:
                return keys.load_private_key(path).public_key(), path
            public = serialization.load_pem_public_key(path.read_bytes())
        except (SigningError, OSError, ValueError) as exc:
            raise BackupRefused(f"cannot read the key {path}: {exc}") from exc
        if not isinstance(public, Ed25519PublicKey):
            raise BackupRefused(f"{path} is not an Ed25519 public key")
        return public, path
    return None, src / PUBLIC_KEY


def after_restore(conn: sqlite3.Connection) -> None:
    """Run on the restored database before it is moved into place: a restored registry starts
    standalone, whatever the backed-up one was (primary or standby of a group), with no
    standbys' positions and no lease, so a restored copy never acts as a group's member; start
    it with ``registry serve --ha`` to join a group (it then follows, or is elected)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND "
                    "name = 'replication_state'").fetchone() is None:
        return
    conn.execute("UPDATE replication_state SET role = 'standalone', leader = NULL, "
                 "lease_until = 0, applying = 0 WHERE id = 1")
    conn.execute("DELETE FROM replicas")
    if conn.in_transaction:
        conn.commit()


def compare_with(old_database: Path, restored: sqlite3.Connection,
                 head: chain.Head | None) -> Missing | None:
    """What the home about to be replaced holds past the backup (None: it has no database)."""
    if not old_database.is_file():
        return None
    seq = head.seq if head else 0
    with closing(sqlite3.connect(f"file:{old_database}?mode=ro", uri=True,
                                 timeout=BUSY_TIMEOUT_MS / 1000)) as old:
        tables = {r[0] for r in old.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "audit" not in tables:
            return None
        old_head = chain.head(old)
        last = old_head.seq if old_head else 0
        at_ours = chain.hash_at(old, seq) if seq else None
        diverged = bool(seq and last >= seq and at_ours != (head.hash if head else None))
        theirs = {(str(m), int(v)) for m, v in old.execute("SELECT model, version FROM versions")}
        seen = 0
        if "node_models" in tables:
            columns = {r[1] for r in old.execute("PRAGMA table_info(node_models)")}
            if "directive_seq" in columns:
                seen = int(old.execute("SELECT COALESCE(MAX(directive_seq), 0) FROM "
                                       "node_models").fetchone()[0])
    ours = {(str(m), int(v)) for m, v in restored.execute("SELECT model, version FROM versions")}
    return Missing(last, (seq + 1, last) if last > seq else None, diverged,
                   sorted(theirs - ours), seen)


def restore(settings: RegistrySettings, src: Path, home: Path, force: bool = False,
            clock: Callable[[], float] = time.perf_counter) -> RestoreResult:
    """Rebuild the registry home ``home`` from the backup folder ``src`` (see the module)."""
    manifest = read_manifest(src)
    check_restore_target(src, home, force)
    with staging(home, "restoring") as tmp:
        laps = Laps(clock)
        copy_database(src, tmp / DATABASE, manifest["database"])
        laps.lap("database_copy_sha")
        with closing(sqlite3.connect(tmp / DATABASE, isolation_level=None)) as conn:
            check_integrity(conn)
            laps.lap("integrity_check")
            db = sqlite_utils.Database(conn)
            checked = check_chain(db)
            laps.lap("chain_verify")
            head = check_chain_end(conn, manifest["audit_head"])
            check_signed_head(settings, src, home, tmp, db)
            laps.lap("head_check")
            blobs = listed_blobs(conn, manifest)
            copy_blobs(blobs, src, tmp, f"the backup {src}")
            laps.lap("blob_verify")
            missing = compare_with(home / DATABASE, conn, head) if force else None
            after_restore(conn)
        result = RestoreResult(home, head.seq if head else 0, checked, len(blobs),
                               missing=missing, timings=laps.timings)
        if force and home.exists():
            result.carried += carry_secrets(home, tmp)
        add_keys(settings, src, home, tmp, manifest.get("key_id"), result)
        fsync_tree(tmp)
        move_home_into_place(tmp, home, force, result)
        laps.total()
    return result


def check_restore_target(src: Path, home: Path, force: bool) -> None:
    """A new or empty home (any home with ``force``) that does not overlap the backup."""
    if home.exists() and (not home.is_dir() or any(home.iterdir())) and not force:
        raise BackupRefused(f"{home} exists and is not empty: restore into a new home, or "
                            f"give --force to move it aside ({home.name}.replaced-<time>)")
    if home.resolve().is_relative_to(src.resolve()) or \
            src.resolve().is_relative_to(home.resolve()):
        raise BackupRefused(f"the backup {src} and the home {home} overlap")


def copy_database(src: Path, target: Path, expected: dict[str, Any]) -> None:
    """Copy the backup's database, checking its size and sha256 against the manifest."""
    source_db = src / DATABASE
    if not source_db.is_file():
        raise IntegrityError(f"{DATABASE} is missing from the backup {src}")
    sha, size = copy_hashed(source_db, target)
    if size != expected["size"]:
        raise IntegrityError(f"{DATABASE} in the backup is {size} bytes, the manifest says "
                             f"{expected['size']}")
    if sha != expected["sha256"]:
        raise IntegrityError(f"{DATABASE} in the backup does not match the manifest: "
                             f"sha256 {sha[:16]}…, expected {expected['sha256'][:16]}…")


def check_integrity(conn: sqlite3.Connection) -> None:
    verdict = conn.execute("PRAGMA integrity_check").fetchone()[0]
    if verdict != "ok":
        raise IntegrityError(f"{DATABASE}: PRAGMA integrity_check says {verdict}")


def check_chain(db: sqlite_utils.Database) -> int:
    """Walk the audit chain; return how many records it checked."""
    checked, finding = chain.verify(db)
    if finding is not None:
        raise IntegrityError(f"{DATABASE}: the audit chain is broken at record "
                             f"{finding.seq}: {finding.reason}")
    return checked


def check_chain_end(conn: sqlite3.Connection, want: dict[str, Any] | None) -> chain.Head | None:
    """The chain ends at the record the manifest names (none: no records); return its head."""
    head = chain.head(conn)
    if (head is None) != (want is None) or (head is not None and want is not None and (
            head.seq != want["seq"] or head.hash != want["hash"])):
        raise IntegrityError(f"the audit chain ends at record "
                             f"{head.seq if head else 0}, the manifest says "
                             f"{want['seq'] if want else 0}")
    return head


def check_signed_head(settings: RegistrySettings, src: Path, home: Path, tmp: Path,
                      db: sqlite_utils.Database) -> None:
    """The backup's signed head (copied into the new home) verifies with this registry's key
    and matches the chain, and the chain was not rewound past what was witnessed."""
    if (src / anchor.FILE).is_file():
        shutil.copyfile(src / anchor.FILE, tmp / anchor.FILE)
    public, key_path = load_public(settings, home, src)
    _, problem = anchor.check(db, tmp / anchor.FILE, public, key_path)
    if problem is not None:
        raise IntegrityError(f"signed head: {problem}")
    _, rewound = anchor.witnessed(db)
    if rewound is not None:
        raise IntegrityError(rewound)


def listed_blobs(conn: sqlite3.Connection, manifest: dict[str, Any]) -> list[tuple[str, int]]:
    """The manifest's blobs, which must be the database's ``blobs`` table exactly."""
    blobs = [(b["sha256"], b["size"]) for b in manifest["blobs"]]
    listed = {(str(s), int(n)) for s, n in conn.execute("SELECT sha256, size FROM blobs")}
    if listed != set(blobs):
        raise IntegrityError(f"the manifest lists {len(blobs)} blobs, the database's "
                             f"blobs table {len(listed)} others")
    return blobs


def carry_secrets(home: Path, tmp: Path) -> list[str]:
    """Copy what a backup never holds (keys, TLS) from the home being replaced."""
    carried = []
    for name in CARRIED:
        if (home / name).is_dir():
            shutil.copytree(home / name, tmp / name)
            carried.append(name)
    return carried


def add_keys(settings: RegistrySettings, src: Path, home: Path, tmp: Path, key: str | None,
             result: RestoreResult) -> None:
    """Without the replaced home's keys: the backup's public key, and a warning that the
    private key must be put back before publishing."""
    if "keys" not in result.carried and (src / PUBLIC_KEY).is_file():
        # public material only: enough for `audit --verify` and for the nodes' release key
        (tmp / PUBLIC_KEY).parent.mkdir(mode=0o700, exist_ok=True)
        shutil.copyfile(src / PUBLIC_KEY, tmp / PUBLIC_KEY)
    if key and "keys" not in result.carried and settings.signing_key is None:
        result.warnings.append(f"the signing key is not in a backup: put the private key "
                               f"(key id {key}) at {home / 'keys' / keys.PRIVATE} or set "
                               f"REGISTRY_SIGNING_KEY before publishing (a new key would "
                               f"be made, and nodes refuse its releases)")


def move_home_into_place(tmp: Path, home: Path, force: bool, result: RestoreResult) -> None:
    """Move an existing home aside (``force``), then rename the new one into place; on a
    failure, put the old one back: nothing half-restored."""
    if force and home.exists():
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        result.replaced = home.with_name(f"{home.name}.replaced-{stamp}")
        os.rename(home, result.replaced)
    elif home.exists():
        home.rmdir()  # an empty folder (checked above)
    try:
        os.rename(tmp, home)
    except OSError as exc:
        if result.replaced is not None:
            os.rename(result.replaced, home)
        raise RegistryError(f"could not move the restored home into place: {exc}") from exc
    fsync_folder(home.parent)
