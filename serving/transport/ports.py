"""Bounded ports: how many descriptors a tier process may have, and how many of them its
HTTP and gRPC connections may take (docs/security.md, "Bounded ports").

At start-up the soft RLIMIT_NOFILE is raised to the hard one. A quarter of it (at least
``RESERVE_MIN``) is kept for everything that is not a client's connection (model files, the
store, logs, Consul, the registry, the batchers' threads); gRPC connections get an eighth of
the rest, HTTP connections what remains, at most ``HTTP_CEILING`` (memory, not descriptors,
bounds a process past it). A cap set explicitly is kept unless it would not fit.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)
RESERVE_MIN = 256
HTTP_CEILING = 10_000
GRPC_CEILING = 1_000
NOFILE_CEILING = 1 << 20  # the soft limit asked for when the hard one is unlimited


def raise_nofile() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (logged); the soft limit after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NOFILE_CEILING if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        log.info("open files limit (RLIMIT_NOFILE): %s", soft)
        return NOFILE_CEILING if soft == resource.RLIM_INFINITY else soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the open files limit from %d to %d: %s", soft, target, exc)
        return soft
    log.info("open files limit (RLIMIT_NOFILE) raised from %d to %d", soft, target)
    return target


@dataclass(frozen=True)
class Caps:
    """Connections each port may hold, under a soft RLIMIT_NOFILE of ``nofile``."""

    nofile: int
    http: int
    grpc: int


def caps(nofile: int, http: int = 0, grpc: int = 0) -> Caps:
    """The caps for ``nofile`` descriptors: ``http``/``grpc`` as set (0: derived), each
    lowered to what fits beside the reserve (with a warning)."""
    budget = max(32, nofile - max(RESERVE_MIN, nofile // 4))
    derived_grpc = max(8, min(GRPC_CEILING, budget // 8))
    grpc_cap = _fit("grpc_max_connections", grpc, derived_grpc, budget // 2)
    http_cap = _fit("max_connections", http, min(HTTP_CEILING, budget - grpc_cap),
                    budget - grpc_cap)
    return Caps(nofile, http_cap, grpc_cap)


def _fit(name: str, given: int, derived: int, room: int) -> int:
    if not given:
        return derived
    if given > room:
        log.warning("%s=%d does not fit the open files limit; using %d", name, given, room)
        return room
    return given


@dataclass
class HttpBounds:
    """What the HTTP protocol (``serving/transport/httpserver.py``) holds a connection to.
    ``admitted`` and ``waiting`` are this process's connections: all of them, and those
    waiting for a request's headers (a new one, or kept alive), oldest first."""

    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    admitted: dict[Any, None] = field(default_factory=dict)
    waiting: dict[Any, None] = field(default_factory=dict)
    refused: int = 0
    evicted: int = 0
    said_at: float = 0.0  # when refusals and evictions were last logged (at most every 10 s)
