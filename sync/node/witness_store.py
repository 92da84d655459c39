"""A node's audit witnesses (``sync.wire.witness``): it keeps the newest statement that verifies
(``<store>/.audit-witness.json``, written atomically) and shows it in every hello."""

from __future__ import annotations

import base64
import json
import logging
from pathlib import Path

from serving.release.signing import SigningError
from serving.release.store import write_durably
from sync.gen import sync_pb2 as pb
from sync.wire.directive import Checker
from sync.wire.witness import WitnessedHead, WitnessError, parse

log = logging.getLogger(__name__)
FILE = ".audit-witness.json"


class Witnesses:
    """A node's side: keep the newest verified witness, show it in the hello."""

    def __init__(self, store_root: Path, checker: Checker | None) -> None:
        self.path, self.checker = store_root / FILE, checker
        self.newest: tuple[WitnessedHead, bytes, bytes] | None = self._load()

    def _load(self) -> tuple[WitnessedHead, bytes, bytes] | None:
        try:
            kept = json.loads(self.path.read_bytes())
            data = base64.b64decode(kept["statement"], validate=True)
            signature = base64.b64decode(kept["signature"], validate=True)
            return parse(data, signature), data, signature
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.error("%s is unreadable (%s): the next witness the registry sends is kept",
                      self.path, exc)
            return None

    def offer(self, message: pb.Witness) -> bool:
        """Keep ``message`` when it verifies and is newer than what is kept (blocking: a file
        write); whether it was kept."""
        if self.checker is None:
            return False
        try:
            head = parse(message.statement, message.signature)
            self.checker.check(message.statement, message.signature)
        except (WitnessError, SigningError) as exc:
            log.warning("ignoring an audit witness from the registry: %s", exc)
            return False
        if self.newest is not None and head.seq <= self.newest[0].seq:
            return False
        self.newest = head, message.statement, message.signature
        body = {"statement": base64.b64encode(message.statement).decode(),
                "signature": base64.b64encode(message.signature).decode(), "seq": head.seq}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_durably(self.path, json.dumps(body, indent=2).encode() + b"\n")
        return True

    def message(self) -> pb.Witness | None:
        """What the hello carries (None: nothing kept)."""
        if self.newest is None:
            return None
        return pb.Witness(statement=self.newest[1], signature=self.newest[2])
