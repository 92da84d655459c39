"""What the node does when the registry tells it to retire a model (``registry retire NAME``):
check the signed retire directive (``sync.wire.retire``), and only when it holds, stop
converging on the model, unload it (``Repository.retire``: in-flight requests drained, the
model's store folder removed, so a restart does not load it) and ack ``RETIRED``. A retire that
does not check out unloads nothing: it is logged and acked ``REFUSED``, and the model serves on.
"""

from __future__ import annotations

import asyncio
import logging

from serving.release.manifest import is_valid_name
from sync.gen import sync_pb2 as pb
from sync.node.converge import Converger
from sync.wire import retire
from sync.wire.errors import DirectiveError

log = logging.getLogger(__name__)


async def obey(releases: Converger, message: pb.Retire) -> None:
    """Unload ``message.model`` if its retire directive is the registry's, for this node, and
    newer than every directive accepted for the model; ack either way."""
    model, version = message.model, max(1, message.version)
    if not is_valid_name(model):
        log.error("ignoring a retire for an invalid model name")
        return
    try:
        directive = retire.check(releases.directives, message.directive,
                                 message.directive_signature, model)
    except DirectiveError as exc:
        log.error("refused to retire %s: %s; it serves on", model, exc)
        await releases.send(pb.NodeMessage(ack=pb.Ack(
            model=model, version=version, state=pb.REFUSED, reason=str(exc)[:1000])))
        return
    assert releases.directives is not None  # checked: a node without one refuses
    await asyncio.to_thread(retire.accept, releases.directives, directive)  # nothing older now
    await releases.drop(model)
    unloaded = await releases.repository.retire(model)
    said = (f"unloaded version {', '.join(map(str, unloaded))}" if unloaded else
            "was not loaded") + " and removed it from the store"
    log.warning("retired %s on the registry's signed directive (seq %s): %s", model,
                directive.seq, said, extra={"fields": {"model": model, "retired": unloaded,
                                                       "directive_seq": directive.seq}})
    await releases.send(pb.NodeMessage(ack=pb.Ack(
        model=model, version=version, state=pb.RETIRED, reason=said,
        directive_seq=directive.seq)))
