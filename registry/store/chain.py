"""The hash-chained, append-only audit log.

Every record carries the previous record's hash and its own, computed over its canonical JSON;
SQLite triggers reject UPDATE and DELETE. A record is always written in the same transaction as
the state change it describes, before that change (write-ahead): either both are visible or
neither is. ``verify`` walks the chain and names the first record that does not fit.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass
from typing import Any

import sqlite_utils

from registry.store.clock import now

GENESIS = "0" * 64


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Record:
    seq: int
    at: str
    actor: str
    action: str
    model: str | None
    version: int | None
    sha256: str | None
    payload: str
    prev_hash: str
    hash: str

    def expected_hash(self) -> str:
        body = [self.seq, self.at, self.actor, self.action, self.model, self.version,
                self.sha256, self.payload, self.prev_hash]
        return hashlib.sha256(canonical(body).encode()).hexdigest()


def append(conn: sqlite3.Connection, *, actor: str, action: str, model: str | None = None,
           version: int | None = None, sha256: str | None = None,
           payload: dict[str, Any] | None = None) -> Record:
    """Append one record; call inside ``db.transaction`` so it commits with its change."""
    last = head(conn)
    seq, prev = (last.seq + 1, last.hash) if last else (1, GENESIS)
    unsigned = Record(seq, now(), actor, action, model, version, sha256,
                      canonical(payload or {}), prev, "")
    record = Record(**{**unsigned.__dict__, "hash": unsigned.expected_hash()})
    conn.execute("INSERT INTO audit VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                 (record.seq, record.at, record.actor, record.action, record.model,
                  record.version, record.sha256, record.payload, record.prev_hash, record.hash))
    return record


@dataclass(frozen=True)
class Head:
    """The newest record of the chain: its seq (monotonic, the log only grows) and hash."""

    seq: int
    hash: str


def head(conn: sqlite3.Connection) -> Head | None:
    row = conn.execute("SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1").fetchone()
    return Head(int(row[0]), str(row[1])) if row else None


def hash_at(conn: sqlite3.Connection, seq: int) -> str | None:
    row = conn.execute("SELECT hash FROM audit WHERE seq = ?", [seq]).fetchone()
    return str(row[0]) if row else None


def records(db: sqlite_utils.Database, model: str | None = None,
            limit: int | None = None) -> list[Record]:
    sql, params = "SELECT * FROM audit", []
    if model is not None:
        sql, params = sql + " WHERE model = ?", [model]
    sql += " ORDER BY seq"
    rows = [Record(**row) for row in db.query(sql, params)]
    return rows[-limit:] if limit else rows


@dataclass(frozen=True)
class Finding:
    seq: int
    reason: str


_encode_string = json.encoder.encode_basestring  # what ``canonical`` writes for a str
COLUMNS = "seq, at, actor, action, model, version, sha256, payload, prev_hash, hash"


def row_hash(row: tuple[Any, ...]) -> str:
    """``Record.expected_hash`` of a row of ``COLUMNS`` (the definition stays there), without
    building the record: the canonical JSON of the hashed fields written directly when they
    are strings, ints and None (what the table holds), through ``canonical`` otherwise."""
    parts = []
    for value in row[:9]:
        if value is None:
            parts.append("null")
        elif type(value) is str:
            parts.append(_encode_string(value))
        elif type(value) is int:
            parts.append(int.__repr__(value))
        else:  # a float or blob a forger wrote: the slow path says what it hashes to
            return hashlib.sha256(canonical(list(row[:9])).encode()).hexdigest()
    return hashlib.sha256(("[" + ",".join(parts) + "]").encode()).hexdigest()


HASHED = "seq, at, actor, action, model, version, sha256, payload, prev_hash"


def verify(db: sqlite_utils.Database) -> tuple[int, Finding | None]:
    """Walk the whole chain; return how many records were checked and the first bad one.

    Fast (a million records in a few seconds): SQLite writes each record's hashed fields as a
    JSON array (``json_array``), which for text, integers and NULL is byte for byte what
    ``canonical`` writes; Python hashes it. A record whose array does not hash to its hash is
    judged again by the definition (``row_hash``, the same as ``Record.expected_hash``), so a
    value SQLite writes otherwise (another SQLite version, a REAL) is never called altered
    wrongly."""
    conn = db.conn
    try:
        cursor = conn.execute(f"SELECT seq, prev_hash, hash, json_array({HASHED}) FROM audit "
                              f"ORDER BY seq")
    except sqlite3.OperationalError:  # an SQLite without JSON functions
        return _verify_rows(conn)
    sha256 = hashlib.sha256
    expected_seq, prev = 1, GENESIS
    checked = 0
    while rows := cursor.fetchmany(4096):
        for seq, prev_hash, digest, body in rows:
            if seq != expected_seq:
                return checked, Finding(seq, f"sequence gap: expected record {expected_seq}")
            if prev_hash != prev:
                return checked, Finding(seq, "previous-hash link does not match the record "
                                             "before it")
            if sha256(body.encode()).hexdigest() != digest:
                row = conn.execute(f"SELECT {COLUMNS} FROM audit WHERE seq = ?",
                                   (seq,)).fetchone()
                if row_hash(row) != digest:
                    return checked, Finding(seq, "content does not match its hash (altered)")
            checked += 1
            expected_seq, prev = seq + 1, digest
    return checked, None


def _verify_rows(conn: sqlite3.Connection) -> tuple[int, Finding | None]:
    """``verify`` on plain cursor tuples hashed by ``row_hash`` (no JSON in SQLite)."""
    expected_seq, prev = 1, GENESIS
    checked = 0
    cursor = conn.execute(f"SELECT {COLUMNS} FROM audit ORDER BY seq")
    while rows := cursor.fetchmany(4096):
        for row in rows:
            seq = row[0]
            if seq != expected_seq:
                return checked, Finding(seq, f"sequence gap: expected record {expected_seq}")
            if row[8] != prev:
                return checked, Finding(seq, "previous-hash link does not match the record "
                                             "before it")
            if row_hash(row) != row[9]:
                return checked, Finding(seq, "content does not match its hash (altered)")
            checked += 1
            expected_seq, prev = seq + 1, row[9]
    return checked, None
