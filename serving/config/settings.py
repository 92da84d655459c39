"""Settings every serving tier shares; ``center`` and ``edge`` subclass with their prefix."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self

from pydantic import AfterValidator, AliasChoices, Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from serving.config import bundle as bundles
from serving.config.tokens import (
    NODE_ID,
    check_node_token,
    check_secret,
    read_secret,
    write_secret,
)
from serving.config.tokens import REGION as REGION  # a region tag; tokens carry it


def _long_enough(secret: SecretStr) -> SecretStr:
    check_secret(secret.get_secret_value())
    return secret


RegistrySecret = Annotated[SecretStr, AfterValidator(_long_enough)]
"""The registry's secret (``REGISTRY_TOKEN``): refused when empty or under 16 characters."""


class AbsolutePaths(BaseSettings):
    """Settings whose paths are made absolute once, against the folder the command was
    started in, when the object is built: a child process spawned in another working folder
    (``tiered up`` runs its children in ``<root>``) is handed the same files, never a second
    registry or release folder that the relative path names there."""

    @model_validator(mode="after")
    def _absolute_paths(self) -> Self:
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, Path) and not value.is_absolute():
                # abspath, not resolve(): '..' is folded, a symlinked folder is kept as named
                object.__setattr__(self, name, Path(os.path.abspath(value)))
        return self


class ConsulSettings(AbsolutePaths):
    """Consul's own variables, for every process that registers or discovers through it.
    Errors never echo the value they refuse (an almost-right secret is still a secret)."""

    model_config = SettingsConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True,
                                      hide_input_in_errors=True)

    consul_http_addr: str | None = Field(
        default=None, validation_alias=AliasChoices("consul_http_addr", "CONSUL_HTTP_ADDR"))
    """Consul agent (host:port) to register with (and, for the tiers, discover centers and
    the registry through); unset = no Consul (static settings apply)."""

    consul_http_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("consul_http_token", "CONSUL_HTTP_TOKEN"))
    """Consul ACL token (from the environment only)."""

    consul_http_token_file: Path | None = Field(
        default=None, validation_alias=AliasChoices("consul_http_token_file",
                                                    "CONSUL_HTTP_TOKEN_FILE"))
    """File holding the Consul ACL token instead of ``CONSUL_HTTP_TOKEN``."""

    @model_validator(mode="after")
    def _consul_token_from_file(self) -> Self:
        if self.consul_http_token_file is not None:
            object.__setattr__(self, "consul_http_token", SecretStr(
                read_secret(self.consul_http_token_file, "CONSUL_HTTP_TOKEN_FILE")))
        return self


class ServingSettings(ConsulSettings):
    """What both tiers are run with: one field per flag and ``<TIER>_`` variable.

    Why one class: pydantic-settings reads a flat class's fields as flat variables with the
    tier's prefix, and the table in docs/operations.md is generated from it in one piece;
    grouping the fields in nested models would rename every variable."""

    model_config = SettingsConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    TIER: ClassVar[str] = ""  # "edge" or "center": the tier a bundle must be made for

    bundle: Path | None = None
    """This node's provisioning bundle (``registry node provision``, one mode-0600 file): its
    node id, region, registry token, its own TLS certificate and key (served over HTTPS and
    gRPC) and the fleet CA (the default ``registry_ca``, and an edge's ``center_ca``). A
    node id, region, token or certificate set otherwise that disagrees with it stops the
    node at start-up."""

    serve_tls: bool = True
    """With a bundle: serve HTTPS (and gRPC over TLS) with its certificate; false = plain
    HTTP (a node reached only through a local proxy that does not speak TLS to it yet)."""

    directive_floor: int = Field(default=0, ge=0)
    """Lowest directive seq a pushed release may carry, even when the store (and its
    ``.directives.json``) is empty: no trust on first use. The bundle's (the audit chain
    when it was made) when that is higher."""

    host: str = "127.0.0.1"
    """Interface to listen on (0.0.0.0 in containers)."""

    port: int = Field(default=8000, ge=0, le=65535)
    """HTTP port of the V2 API and /metrics (0 = any free port)."""

    grpc_port: int = Field(default=0, ge=0, le=65535)
    """gRPC port of the V2 API (``inference.GRPCInferenceService``, gRPC health, reflection);
    0 = no gRPC."""

    store: Path = Path("./var/model-store")
    """Model store folder (<store>/<model>/<version>/, CURRENT), filled by registry pull."""

    node_id: str = ""
    """Name of this node in logs, responses and the registry's status, and its Consul service
    id; must be unique per node (default: <host name>-<port>, so two tiers on one host differ):
    letters, digits and ``._:@-``, at most 128, starting with a letter or digit."""

    region: str = Field(default="local", pattern=rf"^{REGION}$")
    """Region tag of this node (rollouts can target ``region:R``; routing prefers the nearest):
    lower-case letters, digits and hyphens (what discovery accepts from Consul)."""

    registry: str | None = None
    """host:port of ``registry serve`` to subscribe to for releases; unset = no sync (the store
    is filled by ``registry pull``)."""

    registry_token: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("registry_token", "REGISTRY_TOKEN"))
    """This node's own token for the registry (``registry node provision`` puts it in the
    node's bundle, ``registry node token`` prints it; it proves this node id, tier and region
    and no other), from the environment only."""

    registry_token_file: Path | None = None
    """File holding this node's registry token instead of ``REGISTRY_TOKEN``."""

    registry_ca: Path | None = None
    """PEM CA certificate (the fleet CA) that the registry's TLS certificate must chain to, and
    carry the registry's name ``registry.tiered.invalid`` (``registry tls`` signs it; a node's
    certificate from the same CA never does); unset = plaintext, and then a registry found
    through Consul is not used (the token is only sent to a registry named in ``registry`` or
    proven by TLS)."""

    release_key: Path | None = None
    """Public key (PEM, e.g. the registry's ``signing.pub``) that releases must be signed with:
    a release or store version whose signature is missing or does not verify is refused;
    unset = signatures are not checked (logged as a warning at start-up)."""

    min_fidelity: float | None = Field(default=None, ge=0.0, le=1.0)
    """Floor of top-1 agreement with the fp32 reference that a version must reach on this
    node's own hardware (its release probe, run at load) to be served; unset = the release's
    floor (``registry publish --min-fidelity``). Below it the version is refused and the
    previous one keeps serving."""

    tls_cert: Path | None = None
    """PEM certificate chain to serve HTTPS with (with ``tls_key``; a center's comes from
    ``registry tls``, so edges that pin the fleet CA can tell it is a center); unset = HTTP."""

    tls_key: Path | None = None
    """PEM private key matching ``tls_cert``."""

    advertise: str | None = None
    """Address registered in Consul for this node (default: host, or the host name when
    listening on 0.0.0.0)."""

    sync_backoff_max_s: float = Field(default=30.0, gt=0)
    """Longest wait between reconnects or retries of a failed release (exponential, jittered)."""

    sync_mbit_s: float = Field(default=0, ge=0)
    """The most this node downloads releases at, in Mbit/s (0: no limit), so a rollout leaves
    room on a shop's or a factory's uplink for the traffic it serves."""

    max_batch_size: int = Field(default=32, ge=1, le=4096)
    """Most rows one model execution takes (Triton's max_batch_size)."""

    max_batch_delay_ms: float = Field(default=5.0, ge=0, le=10_000)
    """Longest a request waits for company before its batch runs (Triton's
    max_queue_delay_microseconds, in ms)."""

    max_queue_rows: int = Field(default=2048, ge=1)
    """Rows allowed to wait; beyond it requests get 503 with Retry-After at once."""

    max_request_rows: int = Field(default=256, ge=1)
    """Most rows in one inference request."""

    max_text_bytes: int = Field(default=64 * 1024, ge=1)
    """Longest single text (UTF-8 bytes) accepted before tokenization."""

    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    """Largest request body; larger ones get 413. 1 MiB holds the largest legitimate request
    three times over (256 rows of 128 padded token ids and masks: 329 KB as json.dumps writes
    it) and 256 texts of 4 KB each, far more than the model reads; bodies over it only cost
    parse time and memory."""

    header_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """A connection must send a request's complete headers within this many seconds of its
    first byte (of the connection's accept, for its first request, the TLS handshake
    included), else it is closed: idle, silent and slowly trickled connections hold no
    descriptor for long. The gRPC port's TLS handshake has the same bound."""

    body_timeout_s: float = Field(default=20.0, gt=0, le=600)
    """A request's body must arrive within this many seconds of its headers, else the
    connection is closed (``max_body_bytes`` in 20 s is 0.4 Mbit/s)."""

    keep_alive_timeout_s: float = Field(default=5.0, gt=0, le=300)
    """An idle connection kept alive after a response is closed after this many seconds."""

    max_connections: int = Field(default=0, ge=0)
    """Most HTTP connections one serving process holds (0 = derived from the open files limit,
    RLIMIT_NOFILE, which start-up raises to its hard limit: what is left after a quarter kept
    for models, the store, logs, Consul and gRPC, at most 10,000). Beyond it a new connection
    closes the one that has waited longest for a request's headers, or, when every one is inside
    a request, is answered 503 (V2 error JSON) and closed."""

    grpc_max_connections: int = Field(default=0, ge=0)
    """Most gRPC connections (0 = an eighth of what the open files limit leaves after the
    reserve, at most 1,000); beyond it new connections are refused."""

    grpc_max_streams: int = Field(default=100, ge=1, le=10_000)
    """Concurrent streams (calls) per gRPC connection (HTTP/2 MAX_CONCURRENT_STREAMS); a
    client's further calls wait on its side."""

    grpc_max_calls: int = Field(default=1024, ge=1)
    """Calls in progress on the gRPC server, all connections together; further ones end at once
    with RESOURCE_EXHAUSTED (before any handler runs)."""

    grpc_max_health_watches: int = Field(default=64, ge=1)
    """Open gRPC health Watch streams, all connections together (at most 4 per connection);
    further ones end at once with RESOURCE_EXHAUSTED."""

    grpc_max_connection_idle_s: float = Field(default=300.0, gt=0)
    """A gRPC connection with no call for this long is closed (GOAWAY)."""

    grpc_max_connection_age_s: float = Field(default=1800.0, gt=0)
    """A gRPC connection is asked to go away (GOAWAY) after this long (jittered by gRPC), so
    long-lived streams and connections are renewed."""

    grpc_max_connection_age_grace_s: float = Field(default=30.0, gt=0)
    """Time the calls still open on an aged connection get before it is closed (a health Watch
    stream ends here and the client opens a new one)."""

    parse_threads: int = Field(default=0, ge=0, le=256)
    """Threads that parse requests off the event loop (decode images, read bodies over 64 KB),
    a pool of their own (0 = this machine's usable cores, at most 8)."""

    parse_queue: int = Field(default=64, ge=0)
    """Requests that may wait for a parse thread; beyond it a request is answered 503 with
    Retry-After at once."""

    parse_deadline_s: float = Field(default=5.0, gt=0, le=600)
    """Longest a request's parsing (its images decoded) may take, queueing included: past it
    the request is answered 503 and its remaining images are not decoded."""

    slow_request_s: float = Field(default=1.0, gt=0)
    """A request taking longer than this, or refused by a guard (image bounds, a full parse
    queue, the parse deadline, its client gone), logs one warning line with its request id,
    model, reason, CPU and wall time, access log or not, and is counted in
    ``<tier>_request_refused_total`` / ``<tier>_request_slow_total``."""

    threads: int = Field(default=0, ge=0)
    """Intra-op threads of the model runtime per worker (0 = the runtime's default with one
    worker; with several, this machine's usable cores divided among them, at least 1)."""

    workers: int = Field(default=1, ge=1, le=256)
    """Serving processes on the one port (one acceptor hands them connections in turn), each
    with its own model session; the first also joins the fleet (Consul, sync, gRPC) and the
    others follow the model store. Metrics are summed across them (/metrics)."""

    poll_interval_s: float = Field(default=2.0, gt=0)
    """How often the model store is checked for a new CURRENT version."""

    log_file: Path | None = None
    """JSON log file (rotated); logs always go to stderr too."""

    log_max_bytes: int = Field(default=10 * 1024 * 1024, ge=1024)
    """Size at which the log file is rotated."""

    log_backups: int = Field(default=3, ge=0)
    """Rotated log files kept."""

    log_level: str = "INFO"
    """Python log level name."""

    access_log: bool = False
    """A JSON line per answered request (method, path, status, ms, client), as uvicorn's
    access log; off by default, as in Triton: a line per request costs a tenth of a cheap
    model's serving time. Off, requests answered 5xx (and the health checks that fail) are still
    logged; the request id and trace id are on every line the request does log."""

    @model_validator(mode="before")
    @classmethod
    def _default_node_id(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("bundle") is not None:
            data = cls._from_bundle(dict(data), Path(data["bundle"]))
        if isinstance(data, dict) and not data.get("node_id"):
            port = data.get("port", cls.model_fields["port"].default)
            data = {**data, "node_id": f"{socket.gethostname()}-{port}"}
        node_id = data.get("node_id") if isinstance(data, dict) else None
        if isinstance(node_id, str) and not NODE_ID.fullmatch(node_id):
            # it becomes the Consul service id: one with a control character is registered,
            # and no API call can remove it again
            raise ValueError(f"node_id {node_id[:64]!r}: letters, digits and ._:@- only (at "
                             f"most 128, starting with a letter or digit)")
        return data

    @classmethod
    def _from_bundle(cls, data: dict[str, Any], path: Path) -> dict[str, Any]:
        """``data`` with what the bundle at ``path`` says (ValueError where it disagrees)."""
        b = bundles.load(path)
        if cls.TIER and b.tier != cls.TIER:
            raise ValueError(f"{path} is a {b.tier[:16]!r} bundle; this is a {cls.TIER}")
        for key, value in (("node_id", b.node_id), ("region", b.region)):
            given = data.get(key)
            if given and given != value:
                raise ValueError(f"{key} is {str(given)[:64]!r} but the bundle {path} is for "
                                 f"{value!r}: leave {key} unset (the bundle says who this "
                                 f"node is)")
            data[key] = value
        token = data.get("registry_token")
        if data.get("registry_token_file") is not None:
            token = read_secret(Path(data.pop("registry_token_file")), "registry_token_file")
        if isinstance(token, SecretStr):
            token = token.get_secret_value()
        if token is not None and token != b.token:
            raise ValueError(f"a registry token is set (REGISTRY_TOKEN or registry_token_file) "
                             f"that is not the one in the bundle {path}: unset it")
        data["registry_token"] = b.token
        for key in ("tls_cert", "tls_key"):
            if data.get(key) is not None:
                raise ValueError(f"{key} is set, but the bundle {path} holds this node's "
                                 f"certificate and key: unset tls_cert and tls_key")
        folder = _bundle_folder(Path(data.get("store") or cls.model_fields["store"].default))
        _replace(folder / "ca.pem", b.ca.encode())
        data.setdefault("registry_ca", None)
        data["registry_ca"] = data["registry_ca"] or folder / "ca.pem"
        if "center_ca" in cls.model_fields:
            data["center_ca"] = data.get("center_ca") or folder / "ca.pem"
        if str(data.get("serve_tls", True)).lower() not in ("false", "0", "no", "off"):
            _replace(folder / "cert.pem", b.cert.encode())
            _replace(folder / "key.pem", b.key.encode())
            data["tls_cert"], data["tls_key"] = folder / "cert.pem", folder / "key.pem"
        data["directive_floor"] = max(int(data.get("directive_floor") or 0), b.directive_floor)
        return data

    @model_validator(mode="after")
    def _secrets(self) -> ServingSettings:
        """Tokens from their files, and a registry token that is this node's."""
        if self.registry_token_file is not None:
            object.__setattr__(self, "registry_token", SecretStr(
                read_secret(self.registry_token_file, "registry_token_file")))
        if self.registry_token is not None:
            check_node_token(self.registry_token.get_secret_value(), self.node_id,
                             region=self.region)
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("HTTPS needs both tls_cert and tls_key")
        if self.workers > 1 and self.port == 0:
            raise ValueError("workers > 1 needs a fixed port (they share it), not port 0")
        return self

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert is not None else "http"

    @property
    def advertised(self) -> str:
        if self.advertise:
            return self.advertise
        return socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host


BUNDLE_FOLDER = ".bundle"  # in the node's store: never a model name (those start with [a-z0-9])


def _bundle_folder(store: Path) -> Path:
    """``<store>/.bundle``, only this user's (0700): where a bundle's certificate, key and CA
    are put for the servers that read them from files (uvicorn, the gRPC server). One folder
    per node, its files replaced at each start, not a new temporary folder per start that a
    killed process leaves behind with its key in it."""
    folder = Path(os.path.abspath(store)) / BUNDLE_FOLDER
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(folder, 0o700)  # an older folder keeps its mode through mkdir
    return folder


def _replace(path: Path, data: bytes) -> None:
    """``path`` holding ``data`` (0600), swapped in whole: workers of one node starting at
    once each write the same bytes, and none reads a half-written file."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    write_secret(temporary, data)
    os.replace(temporary, path)
