"""Consul: every process registers itself with a health check; edges follow centers and the
registry through the health API (passing instances only, blocking queries).

Consul is reached at ``CONSUL_HTTP_ADDR`` with ``CONSUL_HTTP_TOKEN`` (Consul's own names, read
into each service's settings). Without an address nothing here runs and the static settings
(``EDGE_CENTER_URL``, ``EDGE_REGISTRY``) apply. When the agent is unreachable, registrations
are retried and watchers keep the last list they had.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

with warnings.catch_warnings():  # py-consul's aio module passes aiohttp a deprecated argument
    warnings.simplefilter("ignore", DeprecationWarning)
    import consul
    import consul.aio

from serving.config import settings
from serving.config.tokens import NODE_ID
from serving.errors import InvalidInstance

log = logging.getLogger(__name__)
SERVICES = {"edge": "tiered-edge", "center": "tiered-center", "registry": "tiered-registry",
            "registry-standby": "tiered-registry-standby"}  # a standby: nodes never use it
# The TLS names certificates answer to (RFC 2606 .invalid: never resolved, only TLS matches
# them). A center's role name (registry.trust.pki.role_name("center")): what a static center URL is
# checked against; a node's own name (``node_tls_name``): what a caller that found the node in
# Consul checks, for the node id the entry claims, whatever address the catalog gave.
TLS_DOMAIN = "tiered.invalid"
CENTER_TLS_NAME = f"center.{TLS_DOMAIN}"
# The registry's role name (registry.trust.pki.role_name("registry")): what every node and standby
# checks the registry's certificate against, so a node's certificate from the same CA (which
# lists its own addresses) cannot stand in for the registry.
REGISTRY_TLS_NAME = f"registry.{TLS_DOMAIN}"
TIERS = ("edge", "center")
NODE_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")  # a node id that can be a DNS label
CHECK_INTERVAL = "1s"
CHECK_TIMEOUT = "1s"
# Consul reaps a critical instance only after a minute whatever is asked below that.
DEREGISTER_AFTER = "1m"
RECHECK_S = 2.0  # a registration is compared with the agent's entry at least this often
MIN_RECHECK_S = 0.2  # and at most this often (a blocking query wakes it on any change)
WAIT = "30s"  # blocking query wait
ERRORS = (aiohttp.ClientError, consul.ConsulException, TimeoutError, OSError, ValueError)

# What an instance read from Consul may hold. Anyone who can register a service writes these
# strings, and they end up in nginx's config, in URLs and in logs: each is checked against a
# strict pattern before use, and an instance with any value outside it is skipped.
SERVICE_ID = NODE_ID  # a node registers under its node id
SERVICE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")  # tiered-edge, ...
TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:=-]{0,63}")
META_KEY = re.compile(r"[A-Za-z0-9_-]{1,64}")  # Consul's own rule, shorter
META_VALUE = re.compile(r"[A-Za-z0-9._:,=@+-]{0,512}")  # ids, regions, "tiny=1,big=3"; = Consul max
REGION = re.compile(settings.REGION)
HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")  # RFC 1123
MAX_HOSTNAME = 253
MAX_TAGS, MAX_META = 16, 16
SKIP_LOG_EVERY_S = 60.0  # a flood of bad registrations logs once a minute, with a count


@dataclass(frozen=True)
class Instance:
    service_id: str
    address: str
    port: int
    tags: tuple[str, ...] = ()
    meta: dict[str, str] = field(default_factory=dict, compare=False, hash=False)
    passing: bool = True  # every check passing (a Watch with passing_only lists only these)

    @property
    def url(self) -> str:
        return f"http://{self.target}"

    @property
    def target(self) -> str:
        return host_port(self.address, self.port)

    @property
    def region(self) -> str:
        return self.meta.get("region") or "local"

    @property
    def metrics_port(self) -> int | None:
        """Meta ``metrics_port`` (decimal digits; "" = none), checked like a port."""
        return self._meta_port("metrics_port")

    @property
    def grpc_port(self) -> int | None:
        """Meta ``grpc_port``: the node's gRPC V2 port (none = no gRPC), checked like a port."""
        return self._meta_port("grpc_port")

    def _meta_port(self, key: str) -> int | None:
        value = self.meta.get(key)
        if not value:
            return None
        digits = value.isascii() and value.isdigit() and len(value) <= 5
        return checked_port(int(value) if digits else value)


@dataclass
class Throttled:
    """A warning logged at most once every ``every_s`` seconds (with how many were held back
    since the last one): a flood of bad registrations cannot fill the disk."""

    logger: logging.Logger
    every_s: float = SKIP_LOG_EVERY_S
    held: int = 0
    _last: float | None = None

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if self._last is not None and now - self._last < self.every_s:
            self.held += 1
            return
        self.logger.warning(message + " (%d more like it not logged)", *args, self.held)
        self.held, self._last = 0, now


def node_tls_name(node_id: str, tier: str) -> str:
    """The TLS server name of one node's certificate, and no other node's:
    ``<node id>.<tier>.tiered.invalid`` (``registry.trust.pki.node`` signs it; ``registry.pki.
    node_name`` is the same rule). An entry that Consul lists as ``center-1`` is reached
    checking ``center-1.center.tiered.invalid``, so the entry moved to another address (even
    another center's) reaches nobody but a failed handshake. ValueError for a node id that is
    not a DNS label or a tier that is not one."""
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {TIERS}, not {tier[:32]!r}")
    if not NODE_LABEL.fullmatch(node_id):
        raise ValueError(f"node id {node_id[:64]!r} cannot be named in a certificate: use "
                         f"lower-case letters, digits and '-' (at most 63, not at either end)")
    return f"{node_id}.{tier}.{TLS_DOMAIN}"


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def checked_address(value: object) -> str:
    """An IP literal (normalised, no IPv6 zone: it is free text) or an RFC 1123 host name of
    at most 253 characters whose last label is not all digits (that would be an IP in disguise,
    like ``01.2.3.4``)."""
    if not isinstance(value, str):
        raise InvalidInstance(f"address is not a string: {type(value).__name__}")
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        labels = value.removesuffix(".").split(".")
        if (len(value) > MAX_HOSTNAME or not all(HOST_LABEL.fullmatch(x) for x in labels)
                or labels[-1].isdigit()):
            raise InvalidInstance(f"address {value[:80]!r} is neither an IP address nor a "
                                  f"host name") from None
        return value.removesuffix(".").lower()
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        raise InvalidInstance(f"address {value[:80]!r} has an IPv6 zone")
    return str(ip)


def checked_port(value: object) -> int:
    """An int (not a bool) in 1..65535."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise InvalidInstance(f"port {str(value)[:20]!r} is not an integer in 1..65535")
    return value


def checked_region(value: object) -> str:
    return _checked(REGION, "region", value)


def _checked(pattern: re.Pattern[str], what: str, value: object) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise InvalidInstance(f"{what} {str(value)[:80]!r} does not match {pattern.pattern}")
    return value


def client(address: str, token: str | None) -> consul.aio.Consul:
    host, _, port = address.removeprefix("http://").rpartition(":")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        # a bound on every call: a blocking query waits WAIT (+ jitter), a hung agent no longer
        return consul.aio.Consul(host=host or "127.0.0.1", port=int(port or 8500), token=token,
                                 connections_timeout=45)


@dataclass
class Registration:
    """One service instance on the local agent: registered, then held as registered, and
    deregistered on shutdown.

    Consul's ACLs cannot restrict a token by service *id*: whoever holds the edge role's token
    may register ``edge-us-1`` again, at another address or port, with the same meta. So the
    node does not trust that its id still means its entry: it follows the agent's definition
    of its id with a blocking query (``/v1/agent/service/<id>`` with the content hash, so a
    change wakes it within a round trip) and compares address, port, tags, meta and its
    checks with what it registered at least every ``RECHECK_S``. Anything different is
    registered again at once and logged as a warning naming what changed (an agent that lost
    its state gets it back the same way)."""

    consul: consul.aio.Consul
    name: str
    service_id: str
    address: str
    port: int
    check: dict[str, Any]
    tags: list[str]
    meta: Callable[[], dict[str, str]]
    extra_checks: list[dict[str, Any]] = field(default_factory=list)  # e.g. the gRPC health
    _published: dict[str, str] | None = None
    _hash: str | None = None  # the agent's content hash of the entry as last compared

    def __post_init__(self) -> None:
        """InvalidInstance for an id or name outside what discovery reads back. Consul takes
        a service id with a control character, but then no API call deregisters it (400, even
        with the management token) and anti-entropy puts it back: such an id never reaches
        the agent."""
        if not SERVICE_ID.fullmatch(self.service_id):
            raise InvalidInstance(f"service id {self.service_id[:64]!r}: letters, digits and "
                                  f"._:@- only (at most 128, starting with a letter or digit)")
        if not SERVICE_NAME.fullmatch(self.name):
            raise InvalidInstance(f"service name {self.name[:64]!r}: lower-case letters, "
                                  f"digits and - only")

    async def run(self) -> None:
        while True:
            try:
                await self.ensure()
                await self.wait_for_change(RECHECK_S)
            except ERRORS as exc:
                log.warning("consul: cannot register %s: %s", self.service_id, exc)
                self._published, self._hash = None, None
                await asyncio.sleep(RECHECK_S)
            await asyncio.sleep(MIN_RECHECK_S)  # a tug of war re-registers 5 times a second

    async def ensure(self) -> None:
        """Register when the agent's entry for this id is missing or differs from ours."""
        meta = self.meta()
        entry = await self._entry()
        if entry is not None and self._published is not None:
            changed = self.differences(entry, await self._check_kinds(), meta)
            if not changed:
                return
            if meta != self._published and changed == ["meta"]:
                log.debug("consul: publishing new meta of %s", self.service_id)
            else:
                log.warning("consul: the agent's entry for %s is not what this node registered "
                            "(%s): someone else registered its id; registering it again",
                            self.service_id, "; ".join(changed))
        elif entry is None and self._published is not None:
            log.warning("consul: %s is no longer registered with the agent; registering it "
                        "again", self.service_id)
        await self.consul.agent.service.register(
            self.name, service_id=self.service_id, address=self.address, port=self.port,
            tags=self.tags, meta=meta, check=self.check, extra_checks=self.extra_checks or None)
        if self._published is None:
            log.info("consul: registered %s as %s at %s:%s", self.service_id, self.name,
                     self.address, self.port)
        self._published, self._hash = meta, None

    def differences(self, entry: dict[str, Any], kinds: list[str],
                    meta: dict[str, str]) -> list[str]:
        """What the agent's ``entry`` (and its checks' kinds) has that this node did not
        register, each as ``what: theirs != ours`` (empty: it is ours)."""
        theirs = {"service": entry.get("Service"), "address": entry.get("Address"),
                  "port": entry.get("Port"), "tags": entry.get("Tags") or [],
                  "meta": entry.get("Meta") or {}, "checks": kinds}
        ours = {"service": self.name, "address": self.address, "port": self.port,
                "tags": list(self.tags), "meta": meta, "checks": self.check_kinds()}
        return [f"{key}: {str(theirs[key])[:200]} != {ours[key]}" if key != "meta" else "meta"
                for key in ours if theirs[key] != ours[key]]

    def check_kinds(self) -> list[str]:
        """The kinds of the checks this node registers (``http``, ``grpc``), sorted: what the
        agent shows of a check (its target is not in Consul 1.8's ``Definition``)."""
        return sorted(_kind(c) for c in [self.check, *self.extra_checks])

    async def _entry(self) -> dict[str, Any] | None:
        """The agent's definition of this service id (None: not registered), its content
        hash remembered for ``wait_for_change``."""
        entry, self._hash = await self._get(f"/v1/agent/service/{self.service_id}", {})
        return entry if isinstance(entry, dict) else None

    async def _check_kinds(self) -> list[str]:
        checks, _ = await self._get("/v1/agent/checks", {})
        return sorted(str(c.get("Type") or "").lower() for c in (checks or {}).values()
                      if isinstance(c, dict) and c.get("ServiceID") == self.service_id)

    async def wait_for_change(self, wait_s: float) -> None:
        """Until the agent's entry for this id changes, or ``wait_s`` passes."""
        if self._hash is None:
            return
        await self._get(f"/v1/agent/service/{self.service_id}",
                        {"hash": self._hash, "wait": f"{max(1, round(wait_s))}s"})

    async def _get(self, path: str, params: dict[str, str]) -> tuple[Any, str | None]:
        def parse(response: Any) -> tuple[Any, str | None]:
            if response.code == 404:
                return None, None
            if response.code != 200:
                raise consul.ConsulException(f"{path}: HTTP {response.code}")
            return (json.loads(response.body),
                    response.headers.get("X-Consul-ContentHash"))

        http = self.consul.http
        return await http.get(parse, path, params=params or None,
                              headers=self.consul.prepare_headers())

    async def deregister(self) -> None:
        try:
            await self.consul.agent.service.deregister(self.service_id)
        except ERRORS as exc:
            log.warning("consul: cannot deregister %s: %s", self.service_id, exc)


def http_check(url: str, tls: bool = False) -> dict[str, Any]:
    """An HTTP(S) health check; over HTTPS the agent does not verify the certificate (it only
    asks whether the node is ready; edges verify centers themselves, against the fleet CA)."""
    check = consul.Check.http(url, CHECK_INTERVAL, timeout=CHECK_TIMEOUT,
                              deregister=DEREGISTER_AFTER)
    return check | ({"TLSSkipVerify": True} if tls else {})


def grpc_check(target: str, tls: bool = False) -> dict[str, Any]:
    """A gRPC health check; over TLS the agent does not verify the certificate (nodes do)."""
    check = consul.Check.grpc(target, CHECK_INTERVAL, timeout=CHECK_TIMEOUT,
                              deregister=DEREGISTER_AFTER)
    return check | ({"GRPCUseTLS": True, "TLSSkipVerify": True} if tls else {})


def _kind(check: dict[str, Any]) -> str:
    """A check definition's kind as the agent reports it (``Type``)."""
    keys = {k.lower() for k in check}
    return next((k for k in ("http", "grpc", "tcp", "ttl") if k in keys), "")


OnChange = Callable[[list[Instance]], Awaitable[None] | None]


@dataclass
class Watch:
    """The passing instances of one service (every registered one with ``passing_only``
    False, each marked), followed with blocking queries. When Consul is unreachable the last
    list stays in force (``on_change`` is not called)."""

    consul: consul.aio.Consul
    service: str
    on_change: OnChange
    instances: list[Instance] | None = None
    passing_only: bool = True
    skips: Throttled = field(default_factory=lambda: Throttled(log), repr=False)

    async def run(self) -> None:
        index, delay = None, 0.5
        while True:
            try:
                index, nodes = await self.consul.health.service(
                    self.service, passing=self.passing_only, index=index, wait=WAIT)
            except ERRORS as exc:
                log.warning("consul: watching %s failed (%s); keeping %d known instances",
                            self.service, exc, len(self.instances or []))
                index = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            delay = 0.5
            found = sorted(self.valid(nodes), key=lambda i: i.service_id)
            if found != self.instances:
                self.instances = found
                log.info("consul: %s passing: %s%s", self.service,
                         [i.target for i in found if i.passing] or "none",
                         "" if self.passing_only else
                         f", failing: {[i.target for i in found if not i.passing]}")
                result = self.on_change(found)
                if result is not None:
                    await result

    def valid(self, nodes: list[Any]) -> set[Instance]:
        """The entries that pass every check; the others are skipped (logged, throttled)."""
        found = set()
        for node in nodes:
            try:
                found.add(instance(node))
            except InvalidInstance as exc:
                self.skips.warning("consul: skipping an invalid %s entry: %s", self.service, exc)
        return found


def instance(node: Any) -> Instance:
    """One entry of ``/v1/health/service/<name>`` as an Instance, every value checked; raises
    InvalidInstance (whatever the entry's shape) rather than let one through."""
    try:
        service, checks = node["Service"], node.get("Checks") or []
        address = service.get("Address") or node["Node"]["Address"]
        tags, meta = service.get("Tags") or [], service.get("Meta") or {}
        if not isinstance(tags, list) or not isinstance(meta, dict) or not isinstance(checks, list):
            raise InvalidInstance("tags, meta or checks of the wrong type")
        if len(tags) > MAX_TAGS or len(meta) > MAX_META:
            raise InvalidInstance(f"{len(tags)} tags, {len(meta)} meta keys: too many")
        checked_meta = {_checked(META_KEY, "meta key", k): _checked(META_VALUE, f"meta {k}", v)
                        for k, v in meta.items()}
        found = Instance(_checked(SERVICE_ID, "service id", service["ID"]),
                         checked_address(address), checked_port(service["Port"]),
                         tuple(_checked(TAG, "tag", t) for t in tags), checked_meta,
                         all(c.get("Status") == "passing" for c in checks))
        checked_region(found.region)
        _ = found.metrics_port, found.grpc_port  # checked if present
    except InvalidInstance:
        raise
    except (KeyError, TypeError, AttributeError) as exc:
        raise InvalidInstance(f"malformed entry ({type(exc).__name__}: {exc})") from None
    return found
