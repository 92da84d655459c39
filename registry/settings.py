"""The registry's one settings object, read from ``REGISTRY_*`` variables; CLI flags override."""

from __future__ import annotations

import getpass
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from serving.config.settings import ConsulSettings, RegistrySecret
from serving.config.tokens import check_secret, read_secret


def _default_actor() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


class RegistrySettings(ConsulSettings):
    """Every ``REGISTRY_*`` setting (docs/registry.md lists them, generated from here).

    Why one class: pydantic-settings reads one prefix into one object, and the commands and
    ``registry serve`` all take it whole; its few methods are paths derived from its fields."""

    model_config = SettingsConfigDict(env_prefix="REGISTRY_", extra="forbid", frozen=True,
                                      use_attribute_docstrings=True)

    home: Path = Path("./var/registry")
    """Folder holding ``registry.sqlite3`` and the content-addressed blob store (``blobs/``);
    made by ``registry init`` (or ``publish --create``, ``serve``), never by another command.
    Unset: the registry of a stack running in this clone (``var/stack/stack.json``), else
    ``./var/registry``."""

    host: str = "127.0.0.1"
    """Interface ``registry serve`` listens on (0.0.0.0 in containers)."""

    grpc_port: int = Field(default=50051, ge=0, le=65535)
    """Port of ``registry serve`` (sync and gRPC health; 0 = any free port)."""

    metrics_port: int | None = Field(default=9300, ge=0, le=65535)
    """HTTP port of the registry's Prometheus /metrics (sync and node quality; not 8300,
    which Consul's agent takes); unset = off."""

    token: RegistrySecret | None = None
    """The registry's secret (at least 16 characters), from the environment only: node tokens
    are derived from it (``registry node token``); required by ``registry serve``."""

    token_file: Path | None = None
    """File holding the secret instead of ``REGISTRY_TOKEN`` (one line; e.g. a mounted
    secret)."""

    signing_key: Path | None = None
    """Ed25519 private key (PEM) that ``registry publish`` signs releases with; unset =
    ``<home>/keys/signing.key``, created (mode 0600, ``signing.pub`` beside it) on first use.
    A path set here is never created: a typo must not mint a new key."""

    online_key: Path | None = None
    """Ed25519 private key (PEM) that ``registry serve`` signs the online TUF roles (snapshot,
    timestamp) and each node's directive with; unset = the signing key. Read again at every
    re-signing, so a rotated key (``registry key rotate --role online``) takes effect without
    a restart. A key that is not root's online key cannot advance the timestamp: nodes flag
    the registry stale once theirs expires."""

    timestamp_expiry_s: float = Field(default=3600, ge=3, le=7 * 86400)
    """How long a TUF timestamp signed by ``registry serve`` is valid; it is re-signed every
    third of this. A node that gets no fresh one for this long (a frozen registry, a replayed
    stream) flags itself stale and installs nothing new until it does."""

    tls_cert: Path | None = None
    """PEM certificate chain for ``registry serve`` (with ``tls_key``; unset = plaintext)."""

    tls_key: Path | None = None
    """PEM private key matching ``tls_cert``."""

    ca_dir: Path | None = None
    """Folder of the fleet CA (``ca.pem``/``ca.key``) that ``registry node provision`` signs
    node certificates with; unset = ``<home>/tls``, made on first use (as ``registry tls``
    does)."""

    advertise: str | None = None
    """Address registered in Consul (default: host, or the host name on 0.0.0.0)."""

    chunk_bytes: int = Field(default=1 << 20, ge=1024, le=3 << 20)
    """Bytes per Fetch message (below gRPC's 4 MiB default receive limit)."""

    refusal_interval_s: float = Field(default=60.0, gt=0, le=3600)
    """Calls refused for a missing or wrong token are audited in aggregate: one record per
    peer host per this many seconds (and at shutdown), with the count and methods."""

    refusal_limit: int = Field(default=100, ge=1)
    """Refused calls from one peer host per interval that are logged; past it a refusal is
    only counted (the aggregate audit record says how many)."""

    fetches_per_node: int = Field(default=8, ge=1, le=1024)
    """Fetch calls one node (by its token) may have in flight at once; more are refused
    ``RESOURCE_EXHAUSTED`` (the node retries, resuming), so one node cannot hold every
    connection slot and file handle of ``registry serve``."""

    max_concurrent_streams: int = Field(default=128, ge=1, le=65536)
    """Concurrent gRPC calls (streams) one connection may have open on ``registry serve``
    (a node needs its Sync stream and a few Fetches)."""

    watch_interval_s: float = Field(default=0.2, gt=0, le=5)
    """How often ``registry serve`` looks for changes committed by other processes
    (publish, promote, rollback) before pushing them."""

    report_interval_s: float = Field(default=10.0, gt=0)
    """How often subscribers send quality reports (told to them on connect)."""

    node_series: bool = True
    """Export every node's last quality report as its own series (``registry_node_*``: about
    18 per node) on the registry's /metrics; the fleet's aggregates (``registry_fleet_*``,
    per model, version, tier and region) are exported either way. Turn it off for a large
    fleet (docs/registry.md, "Fleet aggregates")."""

    budget_split: Literal["traffic", "equal"] = "traffic"
    """How ``registry serve`` splits the centers' capacity over the edges when a model has no
    policy of its own (``registry cascade MODEL --split``): by each edge's traffic, or
    equally."""

    actor: str = Field(default_factory=_default_actor)
    """Who the audit log names for changes made from this process (default ``user@host``)."""

    min_fidelity: float = Field(default=0.97, ge=0.0, le=1.0)
    """Minimum top-1 agreement of the INT8 edge model with its fp32 source to publish."""

    tolerance: float = Field(default=0.005, ge=0.0, le=1.0)
    """Calibration: accepted loss of cascade accuracy versus center-only (0.005 = 0.5 points)."""

    confidence: float = Field(default=0.9, ge=0.0, lt=1.0)
    """Calibration: share of bootstrap resamples of the calibration split in which the chosen
    threshold must be within tolerance (0 = judge the split as it is)."""

    ha: bool = False
    """Take part in electing the primary through a Consul lock (needs ``consul_http_addr``):
    every registry of the group runs with this; the one holding the lock is the primary, the
    others are standbys that follow it and take over when it is gone."""

    join: bool = False
    """With ``ha``: this registry joins a group that has (or will have) a primary holding the
    fleet's history, so it never takes the lock before it has copied a primary's database
    once (its audit chain names no promotion yet). For a standby whose home starts empty (a
    new host, a Swarm or Kubernetes volume): started at the same time as the primary, it could
    otherwise win the first election with an empty database and have the primary's history
    replaced by it."""

    follow: str | None = None
    """``host:port`` of a primary to follow as a standby without Consul (no automatic
    failover; ``registry serve --follow``)."""

    registry_id: str | None = Field(default=None, pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
    """This registry's name among its peers (a DNS label; default
    ``registry-<advertised address>-<port>``, made one)."""

    peer_ca: Path | None = None
    """CA that a standby checks its primary's certificate with (default: ``<ca_dir>/ca.pem``
    when this registry serves TLS; unset and no TLS = plaintext)."""

    sync_standbys: int = Field(default=1, ge=0, le=8)
    """As primary of a group: a publish, promote, rollback, revoke or provision returns once
    this many standbys hold it (semi-synchronous); 0 = do not wait."""

    sync_timeout_s: float = Field(default=5.0, gt=0, le=600)
    """How long a change waits for the standbys before it stands on the primary alone (the
    command says so, and ``registry_replication_async_commits_total`` counts it)."""

    lock_ttl_s: float = Field(default=3.0, ge=1, le=60)
    """Failover timing: the primary's lock check expires this long after its process stopped
    passing it; the lock then waits as long again before another registry may take it, and
    a primary stops accepting writes one second before that (its lease)."""

    changes_kept: int = Field(default=100_000, ge=1_000)
    """Captured changes each registry keeps (pruned every minute by ``registry serve``): a
    standby further behind than this copies a snapshot instead."""

    lock_key: str = Field(default="tiered/registry/leader", pattern=r"^[a-z0-9/_-]{1,128}$")
    """Consul KV key the registries elect their primary with."""

    wave_pace: float = Field(default=0.0, ge=0, le=1e9)
    """Wave rollouts (``registry publish --waves``): nodes admitted per minute in the first
    wave (0 = each wave at once)."""

    wave_growth: float = Field(default=2.0, ge=1, le=1000)
    """Wave rollouts: the pace is multiplied by this for every following wave."""

    wave_bake_s: float = Field(default=300.0, ge=0, le=7 * 86400)
    """Wave rollouts: seconds a wave runs after its nodes installed, before its gate."""

    wave_install_timeout_s: float = Field(default=900.0, ge=1, le=7 * 86400)
    """Wave rollouts: a connected wave node that has not acknowledged the release this long
    after its wave began counts as failed."""

    wave_max_failures: float = Field(default=0.1, ge=0, le=1)
    """Wave rollouts: the gate fails when more than this share of a wave's connected nodes
    failed, refused or did not answer (and, from 3 edges on, at least 2 of them: one node's
    word never halts a wave)."""

    wave_max_agreement_drop: float = Field(default=0.02, ge=0, le=1)
    """Wave rollouts: the gate fails when the wave's live audit agreement with the center is
    below the previous version's by more than this, beyond its 95% interval."""

    wave_min_audit_rows: int = Field(default=200, ge=1)
    """Wave rollouts: audited rows on each side before agreement is judged (short of them the
    gate waits up to another bake and then holds: not measured is never passed)."""

    wave_min_audit_nodes: int = Field(default=3, ge=1, le=1000)
    """Wave rollouts: distinct nodes with audit figures on each side before agreement is
    judged, or a majority of the side's edges when that is fewer (at least 2 from 3 edges on;
    1 trusts one node's word); a side's agreement is the median of its nodes' (with 3 or more,
    one node cannot move it outside the others' range, whatever it reports)."""

    wave_max_drift_share: float = Field(default=0.25, ge=0, le=1)
    """Wave rollouts: the gate fails when the share of wave nodes with a drift alarm exceeds
    the other edges' share by more than this (from 3 edges on, at least 2 nodes in drift)."""

    wave_max_p99_ratio: float = Field(default=2.0, ge=1, le=1000)
    """Wave rollouts: the gate fails when the wave's median p99 is over this many times the
    previous version's."""

    wave_tick_s: float = Field(default=1.0, gt=0, le=60)
    """How often ``registry serve`` steps its wave rollouts (admits, checks, judges)."""

    witness_interval_s: float = Field(default=5.0, gt=0, le=3600)
    """How often, at most, ``registry serve`` tells the connected nodes its audit chain's new
    head (signed): each keeps the newest and shows it in its hello, so records removed later
    (an older signed head put back) are caught when the nodes reconnect. The primary of a
    group tells only a head ``sync_standbys`` standbys (at least one) hold."""

    chunking: bool = True
    """Cut each published artifact into content-defined chunks (FastCDC, zstd-compressed,
    stored once per distinct chunk), so that a node fetches only the chunks no version it holds
    has. Off: releases are fetched whole (what nodes of Tiered before chunking understand)."""

    egress_mbit_s: float = Field(default=0, ge=0)
    """The most artifact bytes ``registry serve`` sends to all nodes together, in Mbit/s (0: no
    limit), so a rollout never fills the registry's uplink."""

    site_mbit_s: float = Field(default=0, ge=0)
    """The most artifact bytes sent to the nodes of one region (one site's link) together, in
    Mbit/s (0: no limit). The region is the one in each node's token."""

    node_write_interval_s: float = Field(default=0.25, gt=0, le=5)
    """How long ``registry serve`` gathers what nodes send up (hellos, acks, quality reports)
    before writing it in one transaction. Longer: fewer commits and fsyncs with many nodes;
    shorter: ``registry status`` and the audit log follow the fleet more closely. Should the
    process die meanwhile, each node says again what it serves when it reconnects."""

    @model_validator(mode="after")
    def _token_from_file(self) -> RegistrySettings:
        if self.token_file is not None:
            secret = read_secret(self.token_file, "REGISTRY_TOKEN_FILE")
            object.__setattr__(self, "token", SecretStr(check_secret(secret)))
        return self

    @property
    def database(self) -> Path:
        return self.home / "registry.sqlite3"

    @property
    def blobs(self) -> Path:
        return self.home / "blobs"

    @property
    def ca_folder(self) -> Path:
        return self.ca_dir or self.home / "tls"

    @property
    def signing_key_path(self) -> Path:
        return self.signing_key or self.home / "keys" / "signing.key"

    @property
    def online_key_path(self) -> Path:
        return self.online_key or self.signing_key_path

    @property
    def ca_pem(self) -> Path | None:
        if self.peer_ca is not None:
            return self.peer_ca
        return self.ca_folder / "ca.pem" if self.tls_cert is not None else None

    @property
    def advertised(self) -> str:
        if self.advertise:
            return self.advertise
        return socket.gethostname() if self.host in ("0.0.0.0", "::", "") else self.host
