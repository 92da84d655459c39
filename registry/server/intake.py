"""What nodes send up their sync streams: acks, recorded and audited (a rollout's progress),
and quality reports, which move each model's escalation budgets; a budget that moved enough is
pushed back down to its node's stream."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from google.protobuf.json_format import MessageToDict

from registry.fleet import budgets, nodes
from registry.fleet.budgets import CascadePolicy, LastReport
from registry.fleet.nodes import STATES, AckedFidelity
from registry.server.metrics import SyncMetrics
from registry.settings import RegistrySettings
from serving.protocol.visible import visible
from serving.release import probe
from serving.release.manifest import is_valid_name
from sync.gen import sync_pb2 as pb

if TYPE_CHECKING:
    from registry.server.session import Database, Session, WriteBehind

log = logging.getLogger(__name__)
FEATURE = re.compile(r"[a-z0-9_]{1,32}")
MACHINE = re.compile(r"[A-Za-z0-9_.-]{1,32}")
MAX_FEATURES = 64
MAX_REASON = 1000  # characters of an ack's reason kept (control characters escaped first)
REBALANCE_EVERY_S = 1.0  # a model's budgets are split at most this often (reports coalesce)
SAY_EVERY_S = 60.0  # a node's dropped messages are logged at most this often


class Intake:
    """Acks and quality reports of the connected nodes (``sessions``, shared with the service
    that opens and closes them), and the escalation budgets the reports add up to."""

    def __init__(self, settings: RegistrySettings, db: Database, metrics: SyncMetrics,
                 sessions: dict[str, Session], writes: WriteBehind,
                 rebalance_every_s: float = REBALANCE_EVERY_S) -> None:
        self.settings, self.db, self.metrics, self.sessions = settings, db, metrics, sessions
        self.writes = writes
        # every report changes the split, and a split covers every node: O(nodes) per report,
        # O(nodes²) per report interval; what arrives within a second is split once
        self.splits = Coalesced(self.rebalance, rebalance_every_s)
        self.seen: dict[str, dict[str, LastReport]] = {}  # model -> node id -> its last report
        self.policies: dict[str, CascadePolicy] = {}  # model -> the operator's cascade policy
        self.known: set[str] = set()  # the models in the catalog (reloaded with the policies)
        self._said: dict[str, tuple[float, int]] = {}  # node id -> (last logged, drops since)

    def _versions(self, session: Session, model: str) -> set[int]:
        """The versions of ``model`` the node may speak of: the one pushed to it on this
        stream, and the one it serves by its hello if the registry knows the model (empty:
        a model it has no business reporting, whose name must not become a series or a
        row)."""
        versions = {session.sent[model]} if model in session.sent else set()
        if model in session.active and model in self.known:
            versions.add(session.active[model])
        if model in session.retiring:  # its RETIRED ack
            versions.add(session.retiring[model])
        return versions

    def _drop(self, session: Session, kind: str, reason: str, model: str) -> None:
        """Count a dropped message (fixed labels) and log it at most once a minute per node."""
        self.metrics.dropped.labels(kind, reason).inc()
        node_id, at = session.node.node_id, time.monotonic()
        last, since = self._said.get(node_id, (-math.inf, 0))
        if at - last < SAY_EVERY_S:
            self._said[node_id] = (last, since + 1)
            return
        self._said[node_id] = (at, 0)
        log.warning("dropped a %s from %s (%s: %s)%s", kind, node_id, reason,
                    visible(model, 64), f"; {since} more dropped since the last such line"
                    if since else "")

    async def ack(self, session: Session, ack: pb.Ack) -> None:
        # proto3 enums are open: a value this registry does not know parses, Name() raises
        state = pb.AckState.Name(ack.state) if ack.state in pb.AckState.values() else "?"
        if state not in STATES or not is_valid_name(ack.model) or ack.version < 1:
            self._drop(session, "ack", "malformed", ack.model)
            return
        if not self._versions(session, ack.model):
            self._drop(session, "ack", "unknown-model", ack.model)
            return
        seq = ack.directive_seq
        if seq and not 0 < seq <= session.seqs.get(ack.model, 0):
            # only a seq the registry itself signed into a directive on this stream counts
            self._drop(session, "ack", "seq-not-pushed", ack.model)
            seq = 0
        reason = visible(ack.reason[:MAX_REASON], MAX_REASON)
        self.metrics.acks.labels(state).inc()
        log.info("%s: %s version %s %s%s", session.node.node_id, ack.model, ack.version, state,
                 f" ({reason})" if reason else "")
        measured = None
        if ack.fidelity_rows:
            if not (math.isfinite(ack.fidelity) and 0 <= ack.fidelity <= 1 and
                    ack.fidelity_rows <= probe.MAX_ROWS):
                self._drop(session, "ack", "malformed", ack.model)
                return
            measured = AckedFidelity(ack.fidelity, ack.fidelity_rows, platform(ack.platform))
        self.writes.add(nodes.ack(session.node, ack.model, ack.version, state, reason,
                                  measured, seq))

    async def report(self, session: Session, report: pb.QualityReport) -> None:
        if not is_valid_name(report.model):
            self._drop(session, "report", "malformed", report.model)
            return
        if report.version not in self._versions(session, report.model):
            self._drop(session, "report", "unknown-model", report.model)
            return
        data = MessageToDict(report, preserving_proto_field_name=True,
                             always_print_fields_with_no_presence=True)
        # proto JSON writes 64-bit ints as strings
        for key in ("version", "requests", "rows", "audit_rows", "input_rows"):
            data[key] = int(data[key])
        if not (math.isfinite(report.fidelity) and 0 <= report.fidelity <= 1):
            data["fidelity"] = 0.0
        for key, value in data.items():  # proto JSON writes NaN and infinities as strings
            if isinstance(value, str) and key != "model":
                data[key] = 0.0
        n = session.node
        self.metrics.report([n.node_id, n.tier, n.region, report.model, str(report.version)],
                            data)
        self.writes.add(nodes.quality(n.node_id, report.model, data))
        seen = self.seen.setdefault(report.model, {})
        seen[n.node_id] = LastReport.of(n.node_id, n.tier, time.monotonic(), data,
                                  seen.get(n.node_id), self.settings.report_interval_s)
        self.splits.soon(report.model)

    def gone(self, node_id: str) -> None:
        """A node disconnected: its capacity or traffic is gone from every model's budgets."""
        self._said.pop(node_id, None)
        for model, seen in self.seen.items():
            if seen.pop(node_id, None) is not None:
                self.splits.soon(model)

    def rebalance(self, model: str) -> None:
        """Recompute ``model``'s escalation budgets; push those that moved enough."""
        seen = self.seen.get(model, {})
        policy = self.policies.get(model, CascadePolicy(split=self.settings.budget_split))
        found = budgets.split(policy, list(seen.values()),
                              time.monotonic(), 3 * self.settings.report_interval_s)
        for node_id, budget in found.items():
            session = self.sessions.get(node_id)
            if session is None or not budgets.changed(session.budgets.get(model), budget):
                continue
            session.budgets[model] = budget
            session.outbox.put_nowait(pb.ServerMessage(budget=pb.Budget(
                model=model, controlled=budget.controlled, rows_per_s=budget.rows_per_s,
                capacity_rows_s=budget.capacity_rows_s, share=budget.share)))
            log.info("budget for %s on %s: %s", model, node_id,
                     f"{budget.rows_per_s:.1f} rows/s of {budget.capacity_rows_s:.1f}"
                     if budget.controlled else "none (calibrated threshold)")

    async def stop(self) -> None:
        self.splits.stop()

    async def load_policies(self) -> None:
        """The operators' cascade policies (``registry cascade``); budgets follow them."""
        self.policies, self.known = await self.db.run(lambda: (
            budgets.policies(self.db.catalog.db),
            {r["name"] for r in self.db.catalog.db.query("SELECT name FROM models")}))
        for model in list(self.seen):
            self.rebalance(model)


class Coalesced:
    """``call(key)`` at most once per ``every_s`` per key: now, if the last call is that long
    ago, else once when the time is up, for every ``soon`` in between (the last state is what
    that one call sees)."""

    def __init__(self, call: Callable[[str], None], every_s: float) -> None:
        self.call, self.every_s = call, every_s
        self._last: dict[str, float] = {}
        self._due: dict[str, asyncio.TimerHandle] = {}

    def soon(self, key: str) -> None:
        if key in self._due:
            return
        wait = self._last.get(key, -math.inf) + self.every_s - time.monotonic()
        if wait <= 0:
            self._run(key)
        else:
            self._due[key] = asyncio.get_running_loop().call_later(wait, self._run, key)

    def _run(self, key: str) -> None:
        self._due.pop(key, None)
        self._last[key] = time.monotonic()
        try:
            self.call(key)
        except Exception:  # the next one tries again
            log.exception("%s(%s) failed", getattr(self.call, "__name__", "call"), key)

    def stop(self) -> None:
        for handle in self._due.values():
            handle.cancel()
        self._due.clear()


def platform(p: pb.Platform) -> dict[str, Any]:
    """A node's hardware as it said, kept only where it looks like what a node sends: short
    printable names and known-shaped feature flags (what does not fit is dropped)."""
    def text(value: str, limit: int = 128) -> str:
        return "".join(c for c in value[:limit] if c.isprintable())

    features = [f for f in p.features[:MAX_FEATURES] if FEATURE.fullmatch(f)]
    return {"cpu": text(p.cpu), "machine": p.machine if MACHINE.fullmatch(p.machine) else "",
            "features": features, "runtime": text(p.runtime)}
