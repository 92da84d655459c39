"""Signed directives: which release a node is to run, in an order that cannot be replayed.

A release signature says "the registry published these bytes", forever: an older, validly
signed release pushed again by a rogue registry or a man in the middle would verify, and the
node would go back to it (a downgrade). So ``registry serve`` signs, with the same release key,
at push time, a directive naming the node, the model, the version, the manifest's sha256 and
the audit chain's head then (seq and hash). The seq only grows: every change of what a node
should run (publish, promote, rollback) is an audit record first. A node that verifies
releases keeps, per model, the highest seq it accepted (``<store>/.directives.json``, written
atomically) and refuses a directive below it; a legitimate rollback is a new audit record, so
its directive carries a higher seq and is accepted. A node started from a bundle also refuses
anything below the bundle's ``directive_floor`` (the chain's seq when it was provisioned), so a
wiped store does not take a replayed old directive on trust.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from serving.release.signing import SigningError
from serving.release.store import write_durably
from sync.wire.errors import DirectiveError

log = logging.getLogger(__name__)
KIND = "tiered-directive-v1"  # what the signature covers says what it is: never a manifest
FILE = ".directives.json"
SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Directive:
    node_id: str
    model: str
    version: int
    manifest_sha256: str
    seq: int  # the audit chain's head when the registry pushed it
    head: str  # that record's hash

    def encode(self) -> bytes:
        body = {"kind": KIND, **asdict(self)}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


class DirectiveSigner(Protocol):
    def sign(self, data: bytes) -> bytes: ...


class Checker(Protocol):
    """What verifies a directive's signature: the pinned key, or the TUF root's online keys."""

    def check(self, data: bytes, signature: bytes | None, signed_by: str = "") -> None: ...


def sign(signer: DirectiveSigner, directive: Directive) -> tuple[bytes, bytes]:
    data = directive.encode()
    return data, signer.sign(data)


def parse(data: bytes) -> Directive:
    try:
        body = json.loads(data)
        if not isinstance(body, dict) or body.pop("kind", None) != KIND:
            raise ValueError(f"not a {KIND}")
        directive = Directive(**body)
    except (ValueError, TypeError) as exc:
        raise DirectiveError(f"unreadable directive ({exc})") from exc
    ints = (directive.version, directive.seq)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in ints) or \
            not all(isinstance(t, str) for t in (directive.node_id, directive.model)) or \
            not all(isinstance(h, str) and SHA256.fullmatch(h)
                    for h in (directive.manifest_sha256, directive.head)):
        raise DirectiveError("unreadable directive (a field of the wrong type)")
    return directive


@dataclass(frozen=True)
class Accepted:
    """The newest directive a node accepted for one model."""

    seq: int
    version: int
    manifest_sha256: str


class Directives:
    """A node's side: check each pushed release's directive, remember the newest per model."""

    def __init__(self, store_root: Path, node_id: str, verifier: Checker,
                 floor: int = 0) -> None:
        """``floor``: no directive below this seq is taken, whatever the store holds (the
        audit chain's seq when the node's bundle was made): a wiped store, or one never
        filled, does not trust the first directive it is shown."""
        self.path, self.node_id, self.verifier = store_root / FILE, node_id, verifier
        self.floor = floor
        self.accepted = self._load()

    def _load(self) -> dict[str, Accepted]:
        try:
            data = json.loads(self.path.read_bytes())
            return {model: Accepted(int(a["seq"]), int(a["version"]), str(a["manifest_sha256"]))
                    for model, a in data.items()}
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            # the node's own file: whoever can damage it owns the node already; say so loudly
            log.error("%s is unreadable (%s): the downgrade floor starts again from the next "
                      "release pushed", self.path, exc)
            return {}

    def check(self, data: bytes, signature: bytes, model: str, version: int,
              manifest_sha256: str) -> Directive:
        """The directive for this release, if it may be installed (else DirectiveError)."""
        if not data:
            raise DirectiveError("release carries no signed directive (a registry from before "
                                 "directives, or a replayed release)")
        try:
            self.verifier.check(data, signature)
        except SigningError as exc:
            raise DirectiveError(f"directive signature rejected: {exc}") from None
        directive = parse(data)
        if directive.node_id != self.node_id:
            raise DirectiveError(f"directive is for node {directive.node_id[:128]!r}, this is "
                                 f"{self.node_id!r}")
        if (directive.model, directive.version, directive.manifest_sha256) != \
                (model, version, manifest_sha256):
            raise DirectiveError(f"directive names {directive.model[:128]!r} version "
                                 f"{directive.version}, not this release")
        if directive.seq < self.floor:
            raise DirectiveError(f"directive seq {directive.seq} is older than seq {self.floor}, "
                                 f"the audit chain when this node was provisioned: a replayed "
                                 f"or downgraded release")
        last = self.accepted.get(model)
        if last is not None and (directive.seq < last.seq or (
                directive.seq == last.seq and (version, manifest_sha256) !=
                (last.version, last.manifest_sha256))):
            raise DirectiveError(f"directive seq {directive.seq} is older than seq {last.seq} "
                                 f"(version {last.version}) accepted already: a replayed or "
                                 f"downgraded release")
        return directive

    def accept(self, directive: Directive) -> None:
        """Remember it (atomically on disk: a restart keeps the floor)."""
        self.remember(directive.model, Accepted(directive.seq, directive.version,
                                                directive.manifest_sha256))

    def remember(self, model: str, accepted: Accepted) -> None:
        """Keep ``accepted`` as the model's newest directive unless one as new is kept (a
        retire is remembered as version 0: ``sync.wire.retire``)."""
        last = self.accepted.get(model)
        if last is not None and last.seq >= accepted.seq:
            return
        self.accepted[model] = accepted
        body = {m: asdict(a) for m, a in sorted(self.accepted.items())}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_durably(self.path, json.dumps(body, indent=2).encode() + b"\n")


