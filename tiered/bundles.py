"""Provisioning bundles for the nodes ``tiered up`` and ``tiered sites`` start (and the tests):
each edge and center gets one file, made with the stack's fleet CA and the registry's secret,
as ``registry node provision`` makes them on a registry host."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from registry.store import chain
from registry.trust import pki
from serving.config import bundle
from serving.config.tokens import node_token


def floor(database: Path) -> int:
    """The audit chain's head seq in the registry ``database`` (0 when it has none yet): a
    bundle's ``directive_floor``, as ``registry node provision`` sets it, so a node whose store
    is wiped refuses a replayed directive older than its provisioning. Read-only: the registry
    may be running."""
    if not database.is_file():
        return 0
    conn = sqlite3.connect(f"{database.resolve().as_uri()}?mode=ro", uri=True)
    try:
        head = chain.head(conn)
    except sqlite3.OperationalError:  # no audit table yet: nothing was ever recorded
        return 0
    finally:
        conn.close()
    return head.seq if head else 0


def token(secret: str, node_id: str, tier: str, region: str) -> str:
    """The node's registry token (its tier and region under the registry's MAC)."""
    return node_token(secret, node_id, tier, region)


def make(tls: Path, secret: str, node_id: str, tier: str, region: str,
         hosts: tuple[str, ...] = (), directive_floor: int = 0) -> bundle.Bundle:
    """``node_id``'s bundle: its token, its own certificate from the fleet CA in ``tls``
    (``pki.node``: named ``<node id>.<tier>.tiered.invalid``, and ``hosts``) and the CA."""
    cert, key = pki.node(tls, node_id, tier, region, hosts)
    return bundle.Bundle(bundle.KIND, node_id, tier, region, token(secret, node_id, tier, region),
                         cert.decode(), key.decode(), (tls / "ca.pem").read_text(),
                         directive_floor)


def write(folder: Path, tls: Path, secret: str, node_id: str, tier: str, region: str,
          hosts: tuple[str, ...] = (), directive_floor: int = 0) -> Path:
    """``make`` written to ``<folder>/<node id>.json`` (0600, the folder 0700)."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    path = folder / f"{node_id}.json"
    bundle.write(path, make(tls, secret, node_id, tier, region, hosts, directive_floor))
    return path
