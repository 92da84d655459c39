"""``registry node provision``: a new node's whole identity in one bundle
(``serving.config.bundle``), made on the registry host and copied to the node.

The bundle holds the node's token (its id, generation, tier and region under the registry's
MAC), its own certificate and key from the fleet CA (``registry.trust.pki.node``), the CA itself,
and the audit chain's head seq as the node's directive floor (so even an empty store refuses a
replayed older directive). Provisioning is an audit record (``provision-node``: the node, its
tier, region, generation and certificate, never a secret), committed with the bundle written:
if either fails, neither happens.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from registry.settings import RegistrySettings
from registry.store import chain
from registry.store.db import connect
from registry.trust import anchor, pki
from registry.trust.anchor import audited
from serving.config import bundle
from serving.config.bundle import Bundle
from serving.config.tokens import check_identity, node_token

ACTION = "provision-node"


class ProvisionError(ValueError):
    """A node that cannot be provisioned (its id, tier or region, or no registry secret)."""


def check(settings: RegistrySettings, node_id: str, tier: str, region: str) -> None:
    """ProvisionError, before anything is made or recorded, for what provisioning refuses."""
    try:
        check_identity(node_id, tier, region)
        pki.node_name(node_id, tier)  # the certificate names it: a DNS label
    except ValueError as exc:
        raise ProvisionError(str(exc)) from exc
    if settings.token is None:
        raise ProvisionError("node tokens are derived from the registry's secret: set "
                             "REGISTRY_TOKEN (or REGISTRY_TOKEN_FILE)")


def provision(settings: RegistrySettings, node_id: str, tier: str, region: str,
              hosts: tuple[str, ...] = (), ca_dir: Path | None = None,
              out: Path | None = None) -> Bundle:
    """``node_id``'s bundle: a token at its current generation, a fresh key and certificate
    from the fleet CA in ``ca_dir`` (default ``settings.ca_folder``, made on first use), the
    CA, and the chain's head seq as its directive floor; audited, and written to ``out``
    (mode 0600) inside the same transaction when given."""
    check(settings, node_id, tier, region)
    assert settings.token is not None
    folder = ca_dir or settings.ca_folder
    cert_pem, key_pem = pki.node(folder, node_id, tier, region, hosts)
    ca_pem = (folder / "ca.pem").read_text()
    cert = x509.load_pem_x509_certificate(cert_pem)
    fingerprint = hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()
    db = connect(settings.database)
    try:
        with audited(db, anchor.for_settings(settings)) as conn:
            row = conn.execute("SELECT generation FROM node_tokens WHERE node_id = ?",
                               [node_id]).fetchone()
            generation = int(row[0]) if row else 1
            head = chain.head(conn)
            made = Bundle(kind=bundle.KIND, node_id=node_id, tier=tier, region=region,
                          token=node_token(settings.token.get_secret_value(), node_id, tier,
                                           region, generation),
                          cert=cert_pem.decode(), key=key_pem.decode(), ca=ca_pem,
                          directive_floor=head.seq if head else 0)
            chain.append(conn, actor=settings.actor, action=ACTION, payload={
                "node": node_id, "tier": tier, "region": region, "generation": generation,
                "cert_serial": f"{cert.serial_number:x}", "cert_sha256": fingerprint,
                "directive_floor": made.directive_floor, "hosts": list(hosts)})
            if out is not None:
                bundle.write(out, made)
    finally:
        db.conn.close()
    return made
