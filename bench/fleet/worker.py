"""One worker process of ``bench.fleet``: many simulated nodes on one event loop.

    python -m bench.fleet.worker    (driven by bench.fleet: JSON lines on stdin and stdout)

The first stdin line is the plan (``Plan``); the worker opens every node's channel, answers
``{"ready": n}``, and on ``go`` starts every stream at once (the connect storm). Then each
``status`` line is answered with what its nodes saw (``Status``); ``stop`` closes them all.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import uvloop

from bench.fleet.sim import Sim, Traffic, make_sim, subscribe

ERRORS_SHOWN = 5


@dataclass
class Plan:
    target: str
    secret: str
    region: str
    model: str
    first: int  # index of this worker's first node
    edges: int  # edge nodes here (node ids fleet-edge-<index>)
    busy_every: int  # every busy_every-th edge serves traffic and reports (0: none does)
    rows_per_s: float
    centers: int  # center nodes here, after the edges (fleet-center-<index>)
    capacity_rows_s: float
    wave: list[int]  # indices of the edges that fetch for real
    wave_from: int  # the first version the wave fetches
    wave_pace_per_s: float  # wave fetches begun per second
    store: str  # where the wave's stores go
    fidelity: float


@dataclass
class Status:
    connected: int
    errors: int  # nodes that stopped at a failure (none: they reconnect)
    failures: int  # streams that failed, reconnected after
    errors_shown: list[str]
    reports: int
    budgets: int
    received: list[float]  # wall times the asked version's Release arrived
    verified: list[float]  # ... and it was acked ACTIVE
    fetching: list[float]  # wave: when each fetch of it began
    fetched_bytes: float
    interrupted: int  # wave nodes whose first fetches broke (then resumed)
    resumed: int  # fetches that resumed a partial file at its offset
    cut_bytes: int  # what the broken fetches had written


def build(plan: Plan) -> list[Sim]:
    sims = []
    wave = {index: order for order, index in enumerate(plan.wave)}
    for i in range(plan.first, plan.first + plan.edges):
        busy = plan.busy_every > 0 and i % plan.busy_every == 0
        traffic = Traffic(rows_per_s=plan.rows_per_s if busy else None)
        extra: dict[str, Any] = {}
        if i in wave:
            extra = {"store": Path(plan.store) / f"edge-{i}", "fetch_from": plan.wave_from,
                     "fetch_delay_s": wave[i] / plan.wave_pace_per_s,
                     "interrupt": wave[i] % 2 == 1}  # every other one: a broken transfer
        sims.append(make_sim(f"fleet-edge-{i}", plan.target, plan.secret, plan.region,
                             traffic=traffic, fidelity=plan.fidelity, **extra))
    for i in range(plan.first, plan.first + plan.centers):
        sims.append(make_sim(f"fleet-center-{i}", plan.target, plan.secret, plan.region,
                             tier="center", fidelity=1.0,
                             traffic=Traffic(capacity_rows_s=plan.capacity_rows_s)))
    return sims


def status(sims: list[Sim], version: int) -> Status:
    errors = [s.last_error for s in sims if s.last_error]
    return Status(sum(1 for s in sims if s.connected), sum(1 for s in sims if s.error),
                  sum(s.failures for s in sims), errors[:ERRORS_SHOWN],
                  sum(s.reports for s in sims),
                  sum(s.budgets for s in sims),
                  [s.received[version] for s in sims if version in s.received],
                  [s.verified[version] for s in sims if version in s.verified],
                  [s.fetching[version] for s in sims if version in s.fetching],
                  sum(s.bytes.get(version, 0.0) for s in sims),
                  sum(1 for s in sims if s.cut), sum(s.resumed() for s in sims),
                  sum(s.cut for s in sims))


def say(**what: Any) -> None:
    sys.stdout.write(json.dumps(what) + "\n")
    sys.stdout.flush()


async def main() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a socket per node
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    plan = Plan(**json.loads(await reader.readline()))
    sims = build(plan)
    say(ready=len(sims))
    tasks: list[asyncio.Task[None]] = []
    try:
        while line := await reader.readline():
            command = json.loads(line)
            if command["cmd"] == "go":
                tasks = [asyncio.create_task(subscribe(s, seed=i, reconnect=True))
                         for i, s in enumerate(sims)]
                say(started=time.time())
            elif command["cmd"] == "status":
                say(**asdict(status(sims, int(command["version"]))))
            elif command["cmd"] == "stop":
                break
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(s.channel.close() for s in sims), return_exceptions=True)
    say(stopped=True)


if __name__ == "__main__":
    uvloop.run(main())
