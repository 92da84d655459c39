"""Ordered schema migrations; each is applied once, in its own transaction, and recorded."""

from __future__ import annotations

MIGRATIONS: list[tuple[int, str, str]] = [
    (1, "catalog and audit chain", """
CREATE TABLE models (
    name TEXT PRIMARY KEY,
    created_at TEXT NOT NULL
);
CREATE TABLE blobs (
    sha256 TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE versions (
    model TEXT NOT NULL REFERENCES models(name),
    version INTEGER NOT NULL CHECK (version >= 1),
    manifest TEXT NOT NULL,
    manifest_sha256 TEXT NOT NULL,
    source_sha256 TEXT,
    publisher TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (model, version)
);
CREATE TABLE artifacts (
    model TEXT NOT NULL,
    version INTEGER NOT NULL,
    role TEXT NOT NULL,
    sha256 TEXT NOT NULL REFERENCES blobs(sha256),
    PRIMARY KEY (model, version, role),
    FOREIGN KEY (model, version) REFERENCES versions(model, version)
);
CREATE TABLE aliases (
    model TEXT NOT NULL,
    alias TEXT NOT NULL,
    version INTEGER NOT NULL,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (model, alias),
    FOREIGN KEY (model, version) REFERENCES versions(model, version)
);
CREATE TABLE rollouts (
    id INTEGER PRIMARY KEY,
    model TEXT NOT NULL,
    alias TEXT NOT NULL,
    version INTEGER NOT NULL,
    targets TEXT NOT NULL,
    created_at TEXT NOT NULL,
    FOREIGN KEY (model, version) REFERENCES versions(model, version)
);
CREATE TABLE audit (
    seq INTEGER PRIMARY KEY,
    at TEXT NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    model TEXT,
    version INTEGER,
    sha256 TEXT,
    payload TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL UNIQUE
);
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
CREATE TRIGGER versions_immutable BEFORE UPDATE ON versions
BEGIN SELECT RAISE(ABORT, 'published versions are immutable'); END;
CREATE TRIGGER versions_no_delete BEFORE DELETE ON versions
BEGIN SELECT RAISE(ABORT, 'published versions are immutable'); END;
"""),
    (2, "sync nodes and their per-model state", """
CREATE TABLE nodes (
    node_id TEXT PRIMARY KEY,
    tier TEXT NOT NULL,
    region TEXT NOT NULL,
    peer TEXT,
    connected INTEGER NOT NULL DEFAULT 0,
    first_seen TEXT NOT NULL,
    last_seen TEXT NOT NULL
);
CREATE TABLE node_models (
    node_id TEXT NOT NULL REFERENCES nodes(node_id),
    model TEXT NOT NULL,
    version INTEGER,
    state TEXT NOT NULL,
    reason TEXT,
    updated_at TEXT NOT NULL,
    report TEXT,
    report_at TEXT,
    PRIMARY KEY (node_id, model)
);
"""),
    (3, "release signatures", """
CREATE TABLE signatures (
    model TEXT NOT NULL,
    version INTEGER NOT NULL,
    key_id TEXT NOT NULL,
    signature TEXT NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (model, version),
    FOREIGN KEY (model, version) REFERENCES versions(model, version)
);
CREATE TRIGGER signatures_immutable BEFORE UPDATE ON signatures
BEGIN SELECT RAISE(ABORT, 'release signatures are immutable'); END;
CREATE TRIGGER signatures_no_delete BEFORE DELETE ON signatures
BEGIN SELECT RAISE(ABORT, 'release signatures are immutable'); END;
"""),
    (4, "node hardware and measured fidelity", """
ALTER TABLE nodes ADD COLUMN platform TEXT;
ALTER TABLE node_models ADD COLUMN fidelity REAL;
ALTER TABLE node_models ADD COLUMN fidelity_rows INTEGER;
ALTER TABLE node_models ADD COLUMN fidelity_version INTEGER;
"""),
    (5, "per-node token generations", """
CREATE TABLE node_tokens (
    node_id TEXT PRIMARY KEY,
    generation INTEGER NOT NULL CHECK (generation >= 1),
    updated_at TEXT NOT NULL
);
"""),
    (6, "cascade policies", """
CREATE TABLE cascade_policies (
    model TEXT PRIMARY KEY REFERENCES models(name),
    mode TEXT NOT NULL CHECK (mode IN ('auto', 'static')),
    capacity_rows_s REAL CHECK (capacity_rows_s IS NULL OR capacity_rows_s > 0),
    split TEXT NOT NULL CHECK (split IN ('traffic', 'equal')),
    updated_at TEXT NOT NULL
);
"""),
    (7, "report clamps: a capacity ceiling; the directive seqs nodes reported", """
ALTER TABLE cascade_policies ADD COLUMN max_capacity_rows_s REAL
    CHECK (max_capacity_rows_s IS NULL OR max_capacity_rows_s > 0);
ALTER TABLE node_models ADD COLUMN directive_seq INTEGER;
"""),
]

# Replication (registry.ha.changes): what a standby copies, in the order the primary wrote it.
# Every write to these tables is captured into ``changes`` by a trigger, in commit order, so a
# standby applies whole transactions of the primary in order; ``nodes``/``node_models`` (what
# connected nodes report, rebuilt when they reconnect) are not replicated. A migration that adds
# a column to one of these tables must recreate its two capture triggers.
REPLICATED: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # table: (columns, primary key)
    "models": (("name", "created_at"), ("name",)),
    "blobs": (("sha256", "size", "created_at"), ("sha256",)),
    "versions": (("model", "version", "manifest", "manifest_sha256", "source_sha256",
                  "publisher", "created_at"), ("model", "version")),
    "artifacts": (("model", "version", "role", "sha256"), ("model", "version", "role")),
    "aliases": (("model", "alias", "version", "updated_at"), ("model", "alias")),
    "rollouts": (("id", "model", "alias", "version", "targets", "created_at"), ("id",)),
    "audit": (("seq", "at", "actor", "action", "model", "version", "sha256", "payload",
               "prev_hash", "hash"), ("seq",)),
    "signatures": (("model", "version", "key_id", "signature", "created_at"),
                   ("model", "version")),
    "node_tokens": (("node_id", "generation", "updated_at"), ("node_id",)),
    "cascade_policies": (("model", "mode", "capacity_rows_s", "split", "updated_at",
                          "max_capacity_rows_s"), ("model",)),
    "waves": (("id", "model", "version", "previous", "policy", "wave", "cutoff", "state",
               "wave_started", "admitted_at", "installed_at", "reason", "figures",
               "created_at", "updated_at"), ("id",)),
    "trust_metadata": (("role", "version", "data", "complete", "created_at"),
                       ("role", "version")),
    "retirements": (("model", "version", "seq", "actor", "reason", "retired_at"), ("model",)),
}
# replicated tables made after migration 8, with their triggers
LATER = {"waves", "trust_metadata", "retirements"}
NOT_PRIMARY = "tiered: this registry is not the primary"
# Unix time in SQL (SQLite 3.40 has no unixepoch('subsec')): milliseconds.
NOW_S = "((julianday('now') - 2440587.5) * 86400.0)"


WRITABLE = (f"(SELECT applying = 1 OR role = 'standalone' OR (role = 'primary' AND "
            f"lease_until > {NOW_S}) FROM replication_state WHERE id = 1)")
CAPTURING = "(SELECT applying FROM replication_state WHERE id = 1) = 0"


def _replication_sql() -> str:
    parts = ["""
CREATE TABLE changes (
    id INTEGER PRIMARY KEY,
    tbl TEXT NOT NULL,
    op TEXT NOT NULL CHECK (op IN ('upsert', 'delete')),
    row TEXT NOT NULL
);
CREATE TABLE replication_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    role TEXT NOT NULL CHECK (role IN ('standalone', 'primary', 'standby')),
    term INTEGER NOT NULL DEFAULT 0,
    registry_id TEXT,
    leader TEXT,
    lease_until REAL NOT NULL DEFAULT 0,
    applying INTEGER NOT NULL DEFAULT 0,
    async_commits INTEGER NOT NULL DEFAULT 0,
    history_term INTEGER NOT NULL DEFAULT 0,
    updated_at TEXT
);
INSERT INTO replication_state (id, role) VALUES (1, 'standalone');
CREATE TABLE replicas (
    replica TEXT PRIMARY KEY,
    position INTEGER NOT NULL,
    acked_at REAL NOT NULL
);
"""]
    parts += [_capture_sql(table) for table in REPLICATED if table not in LATER]
    return "".join(parts)


def _capture_sql(table: str) -> str:
    """The fence (writes refused unless this registry may write) and the capture (each write
    copied into ``changes``) triggers of one replicated table."""
    columns, key = REPLICATED[table]
    parts = []
    for op in ("INSERT", "UPDATE", "DELETE"):
        parts.append(f"CREATE TRIGGER fence_{table}_{op.lower()} BEFORE {op} ON {table} "
                     f"WHEN NOT {WRITABLE}\nBEGIN SELECT RAISE(ABORT, '{NOT_PRIMARY}'); "
                     f"END;\n")
    new = ", ".join(f"'{c}', NEW.{c}" for c in columns)
    old = ", ".join(f"'{c}', OLD.{c}" for c in key)
    for op, kind, row in (("INSERT", "upsert", f"json_object({new})"),
                          ("UPDATE", "upsert", f"json_object({new})"),
                          ("DELETE", "delete", f"json_object({old})")):
        parts.append(f"CREATE TRIGGER capture_{table}_{op.lower()} AFTER {op} ON {table} "
                     f"WHEN {CAPTURING}\nBEGIN INSERT INTO changes (tbl, op, row) VALUES "
                     f"('{table}', '{kind}', {row}); END;\n")
    return "".join(parts)


MIGRATIONS.append((8, "replication: captured changes, role and lease, standbys' positions",
                   _replication_sql()))

MIGRATIONS.append((9, "wave rollouts", """
CREATE TABLE waves (
    id INTEGER PRIMARY KEY,
    model TEXT NOT NULL,
    version INTEGER NOT NULL,
    previous INTEGER,
    policy TEXT NOT NULL,
    wave INTEGER NOT NULL DEFAULT 0 CHECK (wave >= 0),
    cutoff REAL NOT NULL DEFAULT 0 CHECK (cutoff >= 0 AND cutoff <= 1),
    state TEXT NOT NULL CHECK (state IN ('running', 'baking', 'paused', 'halted', 'aborted',
                                         'done', 'superseded')),
    wave_started REAL NOT NULL,
    admitted_at REAL NOT NULL,
    installed_at REAL,
    reason TEXT,
    figures TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    FOREIGN KEY (model, version) REFERENCES versions(model, version)
);
CREATE INDEX waves_model ON waves (model, id);
""" + _capture_sql("waves")))

MIGRATIONS.append((10, "release metadata on The Update Framework; what nodes say of theirs", """
CREATE TABLE trust_metadata (
    role TEXT NOT NULL CHECK (role IN ('root', 'targets', 'snapshot', 'timestamp')),
    version INTEGER NOT NULL CHECK (version >= 1),
    data TEXT NOT NULL,
    complete INTEGER NOT NULL CHECK (complete IN (0, 1)),
    created_at TEXT NOT NULL,
    PRIMARY KEY (role, version)
);
ALTER TABLE nodes ADD COLUMN trust TEXT;
""" + _capture_sql("trust_metadata")))

MIGRATIONS.append((11, "audit witnesses: the newest signed head each node showed", """
ALTER TABLE nodes ADD COLUMN witness_seq INTEGER;
ALTER TABLE nodes ADD COLUMN witness_hash TEXT;
"""))

MIGRATIONS.append((12, "wave rollouts may be held: a gate that cannot judge waits for a person", """
CREATE TABLE waves_held (
    id INTEGER PRIMARY KEY,
    model TEXT NOT NULL,
    version INTEGER NOT NULL,
    previous INTEGER,
    policy TEXT NOT NULL,
    wave INTEGER NOT NULL DEFAULT 0 CHECK (wave >= 0),
    cutoff REAL NOT NULL DEFAULT 0 CHECK (cutoff >= 0 AND cutoff <= 1),
    state TEXT NOT NULL CHECK (state IN ('running', 'baking', 'paused', 'held', 'halted',
                                         'aborted', 'done', 'superseded')),
    wave_started REAL NOT NULL,
    admitted_at REAL NOT NULL,
    installed_at REAL,
    reason TEXT,
    figures TEXT,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    FOREIGN KEY (model, version) REFERENCES versions(model, version)
);
INSERT INTO waves_held SELECT id, model, version, previous, policy, wave, cutoff, state,
    wave_started, admitted_at, installed_at, reason, figures, created_at, updated_at FROM waves;
DROP TABLE waves;
ALTER TABLE waves_held RENAME TO waves;
CREATE INDEX waves_model ON waves (model, id);
""" + _capture_sql("waves")))

MIGRATIONS.append((13, "retired models: taken off every node, their history kept", """
CREATE TABLE retirements (
    model TEXT PRIMARY KEY REFERENCES models(name),
    version INTEGER,
    seq INTEGER NOT NULL,
    actor TEXT NOT NULL,
    reason TEXT,
    retired_at TEXT NOT NULL
);
""" + _capture_sql("retirements")))
