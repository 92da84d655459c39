"""The audit chain's head, signed and kept outside the database (``<home>/audit-head.json``).

The hash chain proves that no record was altered or taken out of the middle, but a chain cut
short at its end is still a valid chain: whoever can write the SQLite file (dropping the
triggers first) can delete the newest records, and the chain alone would still verify. So
after every audit write the process that wrote it signs the chain's head (seq and hash) with
the registry's signing key and keeps it in this file, only ever moved forward along the same
chain (a file lock orders concurrent writers). ``registry audit --verify`` then fails when the
database holds less than the signed head, or something else at its seq. Nodes hold the head
too: every release pushed to them carries it in a signed directive (``sync.wire.directive``).

The head may lag the chain (a process killed between its commit and its head write): the next
audit write catches up, and a chain longer than its signed head verifies. A head is never
created over a chain it did not see start unless an operator asks (``registry audit
--anchor``): deleting the file must not let the next write bless a truncated chain.
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import json
import logging
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlite_utils
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from registry.errors import AnchorError
from registry.settings import RegistrySettings
from registry.store import chain
from registry.store.chain import Head, canonical
from registry.store.clock import now
from registry.store.db import transaction
from registry.trust import keys, witness_check
from registry.trust.keys import Signer
from serving.release.signing import key_id
from serving.release.store import write_durably

log = logging.getLogger(__name__)
FILE, LOCK = "audit-head.json", ".audit-head.lock"
KIND = "tiered-audit-head-v1"  # what the signature covers says what it is: never a manifest


def body(head: Head) -> bytes:
    """The signed bytes: canonical JSON of the head, tagged with its kind."""
    return canonical({"kind": KIND, "seq": head.seq, "hash": head.hash}).encode()


@dataclass(frozen=True)
class SignedHead:
    head: Head
    key_id: str
    signature: bytes
    at: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": KIND, "seq": self.head.seq, "hash": self.head.hash,
                "key_id": self.key_id, "signature": base64.b64encode(self.signature).decode(),
                "at": self.at}


def for_settings(settings: RegistrySettings) -> Anchor:
    """The anchor of this registry home, signing with its release key (created on first use
    like publish does, unless REGISTRY_SIGNING_KEY names one)."""
    return Anchor(settings.home, lambda: keys.signer(settings))


def read(path: Path) -> SignedHead | None:
    """The head file as written (None: there is none); its signature is not checked here."""
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise AnchorError(f"{path}: unreadable ({exc})") from exc
    try:
        if data["kind"] != KIND:
            raise ValueError(f"kind {data['kind']!r}")
        seq, digest = data["seq"], data["hash"]
        if not (isinstance(seq, int) and seq >= 1 and isinstance(digest, str)):
            raise ValueError("seq or hash of the wrong type")
        signature = base64.b64decode(data["signature"], validate=True)
        return SignedHead(Head(seq, digest), str(data["key_id"]), signature, str(data["at"]))
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise AnchorError(f"{path}: not a signed audit head ({exc})") from exc


class Anchor:
    """Moves ``<home>/audit-head.json`` forward after audit writes. ``signer`` is given, or
    loaded on first use by ``load`` (so read-only commands never touch the key)."""

    def __init__(self, home: Path, load: Callable[[], Signer]) -> None:
        self.path, self.lock = home / FILE, home / LOCK
        self._load = load
        self._signer: Signer | None = None

    @property
    def signer(self) -> Signer:
        """The key (loaded now if it was not): call before a change, so a missing or bad key
        fails before anything is committed."""
        if self._signer is None:
            self._signer = self._load()
        return self._signer

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.lock.parent.mkdir(parents=True, exist_ok=True)
        with self.lock.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def advance(self, db: sqlite_utils.Database, started: bool = False) -> SignedHead | None:
        """After a commit that appended audit records (``started``: the first ones of the
        chain): sign the chain's head now, if it extends the signed one. Never raises: the
        change is committed already; a head that could not be written lags until the next
        write (and verify says what is wrong)."""
        try:
            return self._advance(db, started)
        except (AnchorError, OSError) as exc:
            log.error("audit head not advanced: %s", exc)
            return None

    def _advance(self, db: sqlite_utils.Database, started: bool) -> SignedHead | None:
        with self._locked():
            ours = chain.head(db.conn)
            if ours is None:
                return None
            kept = read(self.path)
            if kept is None:
                if not started:  # a chain this process did not see start: see the docstring
                    raise AnchorError(f"no signed head {self.path} over an existing chain of "
                                      f"{ours.seq} records; check it and run `registry audit "
                                      f"--anchor`")
            elif ours.seq <= kept.head.seq:
                return kept  # another process signed this far (or further) already
            elif chain.hash_at(db.conn, kept.head.seq) != kept.head.hash:
                raise AnchorError(f"record {kept.head.seq} is not the one the signed head names "
                                  f"(the chain was cut or rewritten); `registry audit --verify`")
            return self._write(ours)

    def create(self, db: sqlite_utils.Database) -> SignedHead:
        """``registry audit --anchor``: sign the head of a chain that has no signed head yet
        (a registry from before heads were signed). Refused when a head file exists."""
        with self._locked():
            if self.path.exists():
                raise AnchorError(f"{self.path} exists; a signed head is only moved forward "
                                  f"(by audit writes). Investigate before deleting it")
            ours = chain.head(db.conn)
            if ours is None:
                raise AnchorError("the audit log is empty: nothing to anchor yet")
            return self._write(ours)

    def _write(self, head: Head) -> SignedHead:
        signer = self.signer
        signed = SignedHead(head, signer.key_id, signer.sign(body(head)), now())
        write_durably(self.path, json.dumps(signed.to_json(), indent=2).encode() + b"\n")
        return signed


@contextmanager
def audited(db: sqlite_utils.Database, anchor: Anchor | None) -> Iterator[sqlite3.Connection]:
    """``db.transaction`` for a change that appends audit records: the key is loaded before
    it (a missing key fails before anything changes), the head is advanced after the commit."""
    if anchor is not None:
        anchor.signer  # noqa: B018 - loads the key now
    with transaction(db) as conn:
        started = chain.head(conn) is None
        yield conn
    if anchor is not None:
        anchor.advance(db, started)


def check(db: sqlite_utils.Database, path: Path, public: Ed25519PublicKey | None,
          key_path: Path) -> tuple[SignedHead | None, str | None]:
    """Compare the database's chain with the signed head: the head (None: no file) and what
    is wrong (None: the chain holds the head, signed by the registry's key)."""
    ours = chain.head(db.conn)
    try:
        kept = read(path)
    except AnchorError as exc:
        return None, str(exc)
    if kept is None:
        if ours is None:
            return None, None
        return None, (f"no signed head ({path}) for a chain of {ours.seq} records: a truncated "
                      f"chain cannot be told from a whole one. If this registry predates signed "
                      f"heads, check the records and run `registry audit --anchor`")
    if public is None:
        return kept, (f"no key at {key_path} to check the signed head with (signed by key "
                      f"{kept.key_id}): the public key is enough, e.g. the backup's "
                      f"keys/signing.pub")
    try:
        public.verify(kept.signature, body(kept.head))
    except InvalidSignature:
        return kept, (f"the signed head's signature does not verify with the registry's key "
                      f"{key_id(public)} (file says key {kept.key_id}): forged or damaged")
    if ours is None or ours.seq < kept.head.seq:
        last = ours.seq if ours else 0
        return kept, (f"the chain ends at record {last} but its signed head is record "
                      f"{kept.head.seq}: records {last + 1}..{kept.head.seq} were removed "
                      f"(truncated)")
    if chain.hash_at(db.conn, kept.head.seq) != kept.head.hash:
        return kept, (f"record {kept.head.seq} has another hash than the signed head "
                      f"{kept.head.hash[:16]}: the chain was rewritten")
    return kept, None


def witnessed(db: sqlite_utils.Database) -> tuple[int, str | None]:
    """The highest seq any node was told the chain reached (0: none) and what is wrong (None:
    the chain holds it). Nodes are a witness the database cannot rewind: a chain that ends
    below what a node was told lost its newest records, whatever the signed head beside it
    says (an older, valid head file may have been put back). Two kinds of word: the directive
    seq a node accepted (``node_models.directive_seq``), and the signed audit witness it showed
    in its hello (``registry.trust.witness_check``: it also names the record's hash, so a chain
    rewritten from there on is caught too). Both are rebuilt from the nodes when they reconnect."""
    conn = db.conn
    row = conn.execute("SELECT node_id, model, directive_seq FROM node_models WHERE "
                       "directive_seq IS NOT NULL ORDER BY directive_seq DESC, node_id "
                       "LIMIT 1").fetchone()
    told = witness_check.highest(conn)
    ours = chain.head(conn)
    last = ours.seq if ours else 0
    seen = max(int(row[2]) if row else 0, told[1].seq if told else 0)
    if told is not None:
        problem = witness_check.conflict(conn, told[1], f"node {told[0]}")
        if problem is not None:
            return seen, problem
    if row is None or last >= row[2]:
        return seen, None
    node_id, model, directive_seq = row
    return seen, (f"a node has seen seq {directive_seq} but the chain ends at {last}: records "
                  f"were removed and an older head put back (node {node_id} accepted a "
                  f"directive for {model} at seq {directive_seq})")
