"""Which edges the entry nginx renders over TLS (``--edge-ca``) when the catalog may lie: the
edge role's Consul token registers any ``tiered-edge`` entry, at any address, and deregisters
any. An entry is rendered once its address has answered as its own node (``probe``): a decoy
registered at a real edge's address under another id is dropped, never the edge; an edge that
leaves the catalog while its address still answers as that node is held a while; and a
catalog change alone never takes nginx from some edges to none."""

from __future__ import annotations

import dataclasses
import logging

from serving.fleet import discovery
from serving.fleet.discovery import Instance

from .fleet import Dropped
from .metrics import HELD
from .probe import Key, Prober, ProbeVerdict
from .upstreams import edge_tls_name

log = logging.getLogger("nginx.render")
HOLD_S = 120.0  # an edge gone from the catalog that still answers as itself: held this long
SILENT_HOLD_S = 10.0  # one that no longer answers (a restart, a slow moment): this long
REJOIN_S = 30.0  # one back in the catalog keeps its health this long after it last passed
RECHECK_HELD_S = 5.0  # a held edge's address is asked again this often


def key(i: Instance, port: int | None = None) -> Key:
    return (i.service_id, i.address, port or i.port)


def keys(i: Instance) -> list[Key]:
    """The addresses nginx may dial ``i`` at (HTTP, and gRPC when it has a gRPC port)."""
    return [key(i), *([key(i, i.grpc_port)] if i.grpc_port else [])]


class EdgeGuard:
    """The keep and drop rules, over the prober's verdicts: a catalog entry is rendered while
    its HTTP address has proven its node (now, or before and not disproved since), its gRPC
    port only when that has too; one that answered as another node is dropped at once. An
    edge that was rendered and left the catalog is held while its address still answers as
    it (``hold_s``; ``silent_hold_s`` once it stops answering), and beyond that when it is
    the last one left; when it comes back failing (its entry registered again: Consul starts
    new checks critical), it stays passing for up to ``REJOIN_S`` after it last passed, so
    that a deregistration loop does not flip it in and out of the primaries (each flip a
    reload, which closes clients' idle keep-alive connections). Held edges are a warning in
    the log and ``HELD`` in the metrics."""

    def __init__(self, prober: Prober, hold_s: float = HOLD_S,
                 silent_hold_s: float = SILENT_HOLD_S) -> None:
        self.prober, self.hold_s, self.silent_hold_s = prober, hold_s, silent_hold_s
        self.proofs: dict[Key, float] = {}  # when each address last answered as its node
        self.rendered: dict[Key, Instance] = {}  # the last screen's edges: the last good set
        self.listed: dict[Key, Instance] = {}  # the catalog's entries at the last screen
        self.departed: dict[Key, float] = {}  # rendered, no longer listed: since when
        self.held: dict[Key, str] = {}  # held edges: "departed" or "last"
        self.asked: list[Key] = []  # the keys the last screen needed a verdict for
        self.passed: dict[Key, float] = {}  # when the catalog last listed each as passing
        self.left: dict[Key, float] = {}  # when each last left the catalog while rendered
        self.warnings = discovery.Throttled(log)  # a deregistration loop logs once a minute

    def due(self) -> bool:
        """Whether a screen now may change something: an edge held, an entry waiting for a
        verdict, or a verdict past its time."""
        return bool(self.departed) or any(self.prober.due(k) for k in self.asked)

    async def screen(self, edges: list[Instance]) -> tuple[list[Instance], list[Dropped]]:
        """The edges to render, and the catalog entries left out, each with its reason."""
        now = self.prober.clock()
        listed, dropped = named(edges)
        departed = {k: self.departed.get(k, now) for k in self.rendered if k not in listed}
        self.left |= dict.fromkeys(departed.keys() - self.departed.keys(), now)
        self.passed |= {k: now for k, i in listed.items() if i.passing}
        self.departed = departed
        verdicts = await self._verdicts(listed, now)
        kept = []
        for i in listed.values():
            problem = self._problem(i, verdicts.get(key(i)))
            if problem is None:
                kept.append(self._as_rendered(i, now))
            else:
                dropped.append(problem)
        held = self._held(verdicts, now)
        chosen, losers = one_per_address([*kept, *held.values()], self.proofs)
        dropped += [Dropped("edges", i.service_id, "duplicate_address", why)
                    for i, why in losers if key(i) in listed]
        why = dict.fromkeys(held, "departed")
        if not chosen and self.rendered:  # never from some edges to none on the catalog's word
            last = {k: i for k, i in self.rendered.items()
                    if verdicts.get(k) is ProbeVerdict.PROVEN}
            chosen, why = list(last.values()), dict.fromkeys(last, "last")
        chosen.sort(key=key)  # one order whichever entries are held: no reload for nothing
        self.rendered, self.listed = {key(i): i for i in chosen}, listed
        self.passed = {k: t for k, t in self.passed.items() if k in listed or k in self.rendered}
        self.left = {k: t for k, t in self.left.items() if k in self.passed}
        self._alarm({k: w for k, w in why.items() if k in self.rendered})
        return chosen, dropped

    async def _verdicts(self, listed: dict[Key, Instance], now: float) -> dict[Key, ProbeVerdict]:
        """Every needed verdict: the listed entries' and the departed edges'. Asked again at
        once: an entry that changed (unless it was found lying), a departed edge not asked
        since it left, or not for ``RECHECK_HELD_S``."""
        candidates = [*listed.values(), *(self.rendered[k] for k in self.departed)]
        self.asked = [k for i in candidates for k in keys(i)]
        cached = self.prober.verdicts
        forced = [k for k, i in listed.items() if self.listed.get(k) != i
                  and cached.get(k, (None,))[0] is not ProbeVerdict.WRONG]
        forced += [k for k, since in self.departed.items()
                   if self.prober.age(k) > min(now - since, RECHECK_HELD_S)]
        verdicts = await self.prober.check(self.asked, forced)
        self.proofs = {k: t for k, t in self.proofs.items() if k in verdicts}
        for k, verdict in verdicts.items():
            if verdict is ProbeVerdict.PROVEN:
                self.proofs[k] = self.prober.verdicts[k][1]
            elif verdict is ProbeVerdict.WRONG:
                self.proofs.pop(k, None)
        return verdicts

    def _problem(self, i: Instance, verdict: ProbeVerdict | None) -> Dropped | None:
        name = edge_tls_name(i.service_id)
        if verdict is ProbeVerdict.WRONG:
            return Dropped("edges", i.service_id, "wrong_identity",
                           f"{i.target} answered without proving {name}")
        if key(i) not in self.proofs:
            return Dropped("edges", i.service_id, "unverified",
                           f"no handshake has proven {name} at {i.target} yet")
        return None

    def _as_rendered(self, i: Instance, now: float) -> Instance:
        """``i`` without its gRPC port unless that port has proven the node too; passing if
        it is failing only since its entry left the catalog and came back (``REJOIN_S``)."""
        passed = self.passed.get(key(i), float("-inf"))
        if not i.passing and self.left.get(key(i), passed) > passed and now - passed < REJOIN_S:
            i = dataclasses.replace(i, passing=True)
        if i.grpc_port is None or key(i, i.grpc_port) in self.proofs:
            return i
        return dataclasses.replace(i, meta={k: v for k, v in i.meta.items() if k != "grpc_port"})

    def _held(self, verdicts: dict[Key, ProbeVerdict], now: float) -> dict[Key, Instance]:
        """The departed edges still rendered: answering as themselves within ``hold_s`` of
        leaving; or, as a backup only (tried when no other edge answers, like an edge Consul
        lists as failing), not answering but not disproved within ``silent_hold_s``."""
        held = {}
        for k, since in self.departed.items():
            gone, verdict = now - since, verdicts.get(k)
            if verdict is ProbeVerdict.PROVEN and gone < self.hold_s:
                held[k] = self.rendered[k]
            elif verdict is not ProbeVerdict.WRONG and gone < self.silent_hold_s:
                held[k] = dataclasses.replace(self.rendered[k], passing=False)
        return held

    def _alarm(self, held: dict[Key, str]) -> None:
        for k, why in held.items():
            if self.held.get(k) != why:
                self.warnings.warning(
                    "edge %r at %s left the catalog while nginx used it (deregistered by a "
                    "holder of the edge role's token, or shutting down?): %s", k[0],
                    discovery.host_port(k[1], k[2]), "kept while it answers as itself (up to "
                    f"{self.hold_s:.0f} s)" if why == "departed" else "kept beyond that: it "
                    "answers as itself, and nginx would have no edge left without it")
        for k in self.held.keys() - held.keys():
            log.debug("edge %r at %s no longer held", k[0], discovery.host_port(k[1], k[2]))
        self.held = held
        for why in ("departed", "last"):
            HELD.labels(why).set(sum(1 for w in held.values() if w == why))


def named(edges: list[Instance]) -> tuple[dict[Key, Instance], list[Dropped]]:
    """The entries by key, and those whose id cannot name a certificate (``no_tls_name``)."""
    listed, dropped = {}, []
    for i in edges:
        try:
            edge_tls_name(i.service_id)
        except discovery.InvalidInstance as exc:
            dropped.append(Dropped("edges", i.service_id, "no_tls_name", str(exc)))
            continue
        listed[key(i)] = i
    return listed, dropped


def one_per_address(edges: list[Instance], proofs: dict[Key, float],
                    ) -> tuple[list[Instance], list[tuple[Instance, str]]]:
    """``edges`` with each address (ip:port, HTTP or gRPC) left to one node: of the entries
    that claim it, the one whose node answered there last (a certificate names one node, so
    only a stale proof can share an address); the others, each with why."""
    claims: dict[tuple[str, int], list[Instance]] = {}
    for i in edges:
        for _, address, port in keys(i):
            claims.setdefault((address, port), []).append(i)
    losers: dict[Key, tuple[Instance, str]] = {}
    for (address, port), claimants in claims.items():
        best = max(claimants, key=lambda i: proofs.get(key(i, port), float("-inf")))
        for i in claimants:
            if i.service_id != best.service_id:
                losers.setdefault(key(i), (i, f"{discovery.host_port(address, port)} answered "
                                              f"as {best.service_id!r} more recently than as "
                                              f"{i.service_id!r}"))
    return [i for i in edges if key(i) not in losers], list(losers.values())
