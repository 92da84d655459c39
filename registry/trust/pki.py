"""A small fleet CA: the certificates that let a node check it talks to the real registry and
an edge check it escalates to a real center, before either sends a token or a user's input.

``registry tls --out DIR`` (and ``tiered up``) make ``ca.pem``/``ca.key`` once and sign
``registry.pem`` and ``center.pem`` (ECDSA P-256, a year) for the given names. Each server
certificate also carries its role as a name that never resolves (``center.tiered.invalid``):
an edge connects to a center with that name as the TLS server name, so the handshake fails
(before a byte of a user's input is sent) unless the certificate is a center's; the
registry's certificate, from the same CA, cannot stand in for a center. Keys are written mode
0600.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from serving.config.tokens import write_secret
from serving.fleet import discovery

ROLES = ("registry", "center")
ROLE_DOMAIN = "tiered.invalid"  # RFC 2606: never resolves, so only TLS ever matches it
VALID_DAYS = 365


def role_name(role: str) -> str:
    """The TLS server name a ``role`` certificate answers to (e.g. center.tiered.invalid)."""
    return f"{role}.{ROLE_DOMAIN}"


def node_name(node_id: str, tier: str) -> str:
    """The TLS server name one node's certificate answers to, and no other node's:
    ``<node id>.<tier>.tiered.invalid`` (e.g. ``edge-us-1.edge.tiered.invalid``). Whoever
    reaches a node found in Consul (nginx an edge, an edge a center) checks this name for the
    node id the catalog entry claims, so an entry moved to another address reaches nobody but
    a failed handshake. One rule for signer and checkers: ``discovery.node_tls_name``.
    ValueError for a node id that is not a DNS label or a tier that is not one."""
    return discovery.node_tls_name(node_id, tier)


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Tiered fleet"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    write_secret(path, key.private_bytes(serialization.Encoding.PEM,
                                         serialization.PrivateFormat.PKCS8,
                                         serialization.NoEncryption()))


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def ca(folder: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """The fleet CA in ``folder`` (made on first use)."""
    cert_path, key_path = folder / "ca.pem", folder / "ca.key"
    if cert_path.is_file() and key_path.is_file():
        key = serialization.load_pem_private_key(key_path.read_bytes(), None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path} is not the EC key this CA uses")
        return x509.load_pem_x509_certificate(cert_path.read_bytes()), key
    folder.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(_name("Tiered fleet CA"))
            .issuer_name(_name("Tiered fleet CA")).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False,
                                         False), critical=True)
            .sign(key, hashes.SHA256()))
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def server(folder: Path, role: str, hosts: list[str]) -> tuple[Path, Path]:
    """A ``role`` certificate for ``hosts`` signed by the fleet CA: ``<role>.pem``/``.key``."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}")
    if not hosts:
        raise ValueError("a server certificate needs at least one --host")
    authority, authority_key = ca(folder)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    names = [_san(h) for h in dict.fromkeys(hosts)]
    cert = (x509.CertificateBuilder().subject_name(_name(f"tiered {role}"))
            .issuer_name(authority.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName(
                [*names, x509.DNSName(role_name(role))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(authority_key, hashes.SHA256()))
    cert_path, key_path = folder / f"{role}.pem", folder / f"{role}.key"
    _write_key(key_path, key)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def node(folder: Path, node_id: str, tier: str, region: str,
         hosts: tuple[str, ...] = ()) -> tuple[bytes, bytes]:
    """One node's own certificate and key (PEM bytes, nothing written): signed by the fleet CA
    in ``folder``, naming the node (``node_name``), its tier (OU) and region (L), usable as
    a TLS server (nginx -> edge, edge -> center) and client. A center's also carries the
    role name ``center.tiered.invalid``, so callers that check only the role still accept it.
    ``hosts``: addresses it may also be reached by (IP or DNS SANs)."""
    name = node_name(node_id, tier)
    authority, authority_key = ca(folder)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    sans: list[x509.GeneralName] = [x509.DNSName(name)]
    if tier == "center":
        sans.append(x509.DNSName(role_name("center")))
    sans += [_san(h) for h in dict.fromkeys(hosts)]
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Tiered fleet"),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, tier),
                         x509.NameAttribute(NameOID.LOCALITY_NAME, region),
                         x509.NameAttribute(NameOID.COMMON_NAME, node_id)])
    cert = (x509.CertificateBuilder().subject_name(subject)
            .issuer_name(authority.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                  ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(authority_key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def fleet(folder: Path, hosts: list[str]) -> list[Path]:
    """The CA and a certificate per role for ``hosts``; the paths written."""
    made = [folder / "ca.pem"]
    for role in ROLES:
        made.extend(server(folder, role, hosts))
    return made
