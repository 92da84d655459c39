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
