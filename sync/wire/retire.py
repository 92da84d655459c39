"""Signed retire directives: "this node is to stop running this model", in an order that cannot
be replayed (``registry retire NAME``).

Taking a model down is as strong a change as installing one, so it is held to more: the
registry signs, when it tells a node, a directive naming the node, the model and the audit
chain's head then (seq and hash), with the key release directives are signed with, and of
another kind (``tiered-retire-v1``), so neither can stand for the other. A node obeys it only
when its signature verifies (the pinned release key, or TUF root's online keys), it names this
node and the model, and its seq is above every directive the node accepted for that model and
not below the node's floor. A retire is the newest word on the model: recorded as version 0 in
``sync.wire.directive``'s file, so a replayed older release is refused after it, and an older
retire replayed after the model was published again (whose directive carries a higher seq) is
refused too. A node that verifies nothing (no release key) unloads nothing on a retire.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from serving.release.signing import SigningError
from sync.wire.directive import SHA256, Accepted, Directives, DirectiveSigner
from sync.wire.errors import DirectiveError

KIND = "tiered-retire-v1"


@dataclass(frozen=True)
class RetireDirective:
    node_id: str
    model: str
    seq: int  # the audit chain's head when the registry told the node
    head: str  # that record's hash

    def encode(self) -> bytes:
        body = {"kind": KIND, **asdict(self)}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def sign(signer: DirectiveSigner, directive: RetireDirective) -> tuple[bytes, bytes]:
    data = directive.encode()
    return data, signer.sign(data)


def parse(data: bytes) -> RetireDirective:
    try:
        body = json.loads(data)
        if not isinstance(body, dict) or body.pop("kind", None) != KIND:
            raise ValueError(f"not a {KIND}")
        directive = RetireDirective(**body)
    except (ValueError, TypeError) as exc:
        raise DirectiveError(f"unreadable retire directive ({exc})") from exc
    seq = directive.seq
    if not (isinstance(seq, int) and not isinstance(seq, bool) and seq >= 1) or \
            not all(isinstance(t, str) for t in (directive.node_id, directive.model)) or \
            not (isinstance(directive.head, str) and SHA256.fullmatch(directive.head)):
        raise DirectiveError("unreadable retire directive (a field of the wrong type)")
    return directive


def check(directives: Directives | None, data: bytes, signature: bytes,
          model: str) -> RetireDirective:
    """The retire directive for ``model``, if this node is to obey it (else DirectiveError)."""
    if directives is None:
        raise DirectiveError("this node verifies no releases (no release key): it cannot tell "
                             "the registry's retire from anyone's, and unloads nothing")
    if not data:
        raise DirectiveError("retire carries no signed directive")
    try:
        directives.verifier.check(data, signature)
    except SigningError as exc:
        raise DirectiveError(f"retire directive signature rejected: {exc}") from None
    directive = parse(data)
    if directive.node_id != directives.node_id:
        raise DirectiveError(f"retire directive is for node {directive.node_id[:128]!r}, this "
                             f"is {directives.node_id!r}")
    if directive.model != model:
        raise DirectiveError(f"retire directive names {directive.model[:128]!r}, not {model!r}")
    if directive.seq < directives.floor:
        raise DirectiveError(f"retire directive seq {directive.seq} is older than seq "
                             f"{directives.floor}, the audit chain when this node was "
                             f"provisioned: a replayed retire")
    last = directives.accepted.get(model)
    if last is not None and directive.seq <= last.seq:
        raise DirectiveError(f"retire directive seq {directive.seq} is not newer than seq "
                             f"{last.seq} (version {last.version}) accepted already: a "
                             f"replayed retire")
    return directive


def accept(directives: Directives, directive: RetireDirective) -> None:
    """Remember it as the model's newest directive (version 0: retired), on disk."""
    directives.remember(directive.model, Accepted(directive.seq, 0, ""))
