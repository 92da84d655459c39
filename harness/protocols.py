"""The V2 protocol runs: the same texts to one tier as V2 JSON/HTTP, the binary tensor extension
over HTTP and gRPC V2, at concurrency 1/8/32 with 1 and 32 rows per request; and JSON requests
whose every row escalates, to edges escalating over REST and over gRPC. The clients are what
users run: request bodies made by ``tritonclient.http`` (binary) and ``tritonclient.grpc``'s
messages, sent with aiohttp and grpc.aio from this one process, which also decodes every
answer. ``python -m bench.protocols`` reports them; ``tests/integration/test_protocols.py``
runs them in miniature.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import grpc
import numpy as np
import tritonclient.http as triton_http
from rich.table import Table
from tritonclient.grpc import service_pb2 as pb

from harness.load import Load, process_cpu_s
from serving.protocol import v2

CONCURRENCY = (1, 8, 32)
ROWS = (1, 32)
PROTOCOLS = ("JSON/HTTP", "binary/HTTP", "gRPC")
OUTPUTS = 4  # label, probabilities, confidence, tier
ANSWER_ALL = {"threshold": 0.0}  # no row escalates: the edge alone answers
ESCALATE_ALL = {"threshold": 1.0}  # every row goes to the center
ESCALATIONS = ("REST", "gRPC")
INFER = "/inference.GRPCInferenceService/ModelInfer"

Send = Callable[[int], Awaitable[int]]  # body index -> rows answered
Echo = Callable[[str], None]  # where each run's line goes as it ends


@dataclass(frozen=True)
class Result:
    protocol: str
    rows: int
    concurrency: int
    load: Load  # what the clients saw, as the other benchmarks report it
    client_cores: float
    server_cores: float


# --- request bodies --------------------------------------------------------------------------

def groups(texts: list[str], rows: int, count: int) -> list[list[str]]:
    """``count`` requests of ``rows`` texts each, rotating through ``texts``."""
    return [[texts[(i * rows + j) % len(texts)] for j in range(rows)] for i in range(count)]


def json_body(group: list[str], parameters: dict[str, float] = ANSWER_ALL) -> bytes:
    return json.dumps({"inputs": [{"name": "text", "shape": [len(group)], "datatype": "BYTES",
                                   "data": group}], "parameters": parameters}).encode()


def binary_body(group: list[str]) -> tuple[bytes, int]:
    """tritonclient.http's own request: binary input, every output binary."""
    text = triton_http.InferInput("text", [len(group)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in group], dtype=object))
    body, header = triton_http.InferenceServerClient.generate_request_body(
        [text], parameters=ANSWER_ALL)
    return bytes(body), int(header)


def grpc_body(group: list[str], model: str) -> bytes:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="text", datatype="BYTES", shape=[len(group)])
    request.raw_input_contents.append(v2.raw("BYTES", group))
    request.parameters["threshold"].double_param = 0.0
    return request.SerializeToString()


# --- clients ---------------------------------------------------------------------------------

def json_sender(session: aiohttp.ClientSession, url: str, bodies: list[bytes]) -> Send:
    async def send(i: int) -> int:
        async with session.post(url, data=bodies[i],
                                headers={"content-type": "application/json"}) as response:
            body = await response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}")
        answer = json.loads(body)
        return len(next(o for o in answer["outputs"] if o["name"] == "label")["data"])
    return send


def binary_sender(session: aiohttp.ClientSession, url: str,
                  bodies: list[tuple[bytes, int]]) -> Send:
    async def send(i: int) -> int:
        body, header = bodies[i]
        async with session.post(url, data=body, headers={
                "content-type": "application/octet-stream",
                "inference-header-content-length": str(header)}) as response:
            raw = await response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}")
            length = response.headers.get("inference-header-content-length")
        result = triton_http.InferResult.from_response_body(
            raw, header_length=int(length) if length else None)
        return len(result.as_numpy("label"))
    return send


def grpc_sender(channel: grpc.aio.Channel, bodies: list[bytes]) -> Send:
    call = channel.unary_unary(INFER, request_serializer=None,
                               response_deserializer=pb.ModelInferResponse.FromString)

    async def send(i: int) -> int:
        response = await call(bodies[i], timeout=30)
        labels = response.raw_output_contents[0]
        probabilities = np.frombuffer(response.raw_output_contents[1], dtype="<f4")
        assert len(response.raw_output_contents) == OUTPUTS and probabilities.size
        return int(response.outputs[0].shape[0]) if labels else 0
    return send


@dataclass(frozen=True)
class Sample:
    latencies: list[float]
    errors: int
    seconds: float
    client_cpu_s: float
    server_cpu_s: float


async def load(send: Send, bodies: int, concurrency: int, seconds: float,
               server_pid: int) -> Sample:
    """``concurrency`` clients, each sending one request after another for ``seconds``."""
    latencies: list[float] = []
    errors = 0
    cpu0, server0 = process_cpu_s(os.getpid()), process_cpu_s(server_pid)
    started = time.perf_counter()
    deadline = started + seconds

    async def client(k: int) -> None:
        nonlocal errors
        i = k
        while time.perf_counter() < deadline:
            sent = time.perf_counter()
            try:
                await send(i % bodies)
                latencies.append(time.perf_counter() - sent)
            except Exception:
                errors += 1
            i += concurrency

    await asyncio.gather(*(client(k) for k in range(concurrency)))
    return Sample(latencies, errors, time.perf_counter() - started,
                process_cpu_s(os.getpid()) - cpu0, process_cpu_s(server_pid) - server0)


async def measure(http_url: str, grpc_target: str, server_pid: int, texts: list[str],
                  seconds: float, warmup: float, model: str, echo: Echo = print) -> list[Result]:
    url = f"{http_url}/v2/models/{model}/infer"
    results = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session, \
            grpc.aio.insecure_channel(grpc_target) as channel:
        for rows in ROWS:
            texts_for = groups(texts, rows, max(1, len(texts) // rows) * 4)
            senders = {"JSON/HTTP": json_sender(session, url, [json_body(g) for g in texts_for]),
                       "binary/HTTP": binary_sender(session, url,
                                                    [binary_body(g) for g in texts_for]),
                       "gRPC": grpc_sender(channel, [grpc_body(g, model) for g in texts_for])}
            for name in PROTOCOLS:  # every protocol answers what the others do, once
                assert await senders[name](0) == rows, name
            for concurrency in CONCURRENCY:
                for name in PROTOCOLS:
                    await load(senders[name], len(texts_for), concurrency, warmup, server_pid)
                    run = await load(senders[name], len(texts_for), concurrency, seconds,
                                     server_pid)
                    results.append(_result(name, rows, concurrency, run, echo))
    return results


async def measure_escalation(edges: dict[str, tuple[str, int]], texts: list[str],
                             seconds: float, warmup: float, model: str,
                             echo: Echo = print) -> list[Result]:
    """JSON requests whose every row escalates, to each edge of ``edges`` (escalation name ->
    (edge URL, edge pid))."""
    results = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for rows in ROWS:
            texts_for = groups(texts, rows, max(1, len(texts) // rows) * 4)
            bodies = [json_body(g, ESCALATE_ALL) for g in texts_for]
            for concurrency in CONCURRENCY:
                for name, (url, pid) in edges.items():
                    send = json_sender(session, f"{url}/v2/models/{model}/infer", bodies)
                    await load(send, len(bodies), concurrency, warmup, pid)
                    run = await load(send, len(bodies), concurrency, seconds, pid)
                    results.append(_result(name, rows, concurrency, run, echo))
    return results


def _result(name: str, rows: int, concurrency: int, run: Sample, echo: Echo) -> Result:
    ms = np.asarray(run.latencies or [0.0]) * 1000
    load = Load(len(run.latencies), run.seconds, float(np.percentile(ms, 50)),
                float(np.percentile(ms, 99)), float(ms.mean()), run.errors)
    echo(f"  {name:11} rows={rows:<2} c={concurrency:<2} {load.rps:8.1f} req/s  "
                  f"p50 {load.p50_ms:6.2f} ms  p99 {load.p99_ms:6.2f} ms")
    return Result(name, rows, concurrency, load, run.client_cpu_s / run.seconds,
                  run.server_cpu_s / run.seconds)


# --- report ----------------------------------------------------------------------------------

def table(results: list[Result], seconds: float, title: str = "V2 protocols on one edge "
          "(demo INT8 model, every row answered at the edge)", base_name: str = "JSON/HTTP",
          vs: str = "vs JSON", column: str = "protocol") -> Table:
    out = Table(title=title,
                caption=f"{seconds:g} s per run after a warm-up; one Python client process "
                        f"(aiohttp / grpc.aio) sends and decodes. {vs}: req/s against the "
                        f"{base_name} row of the same rows and concurrency.")
    for header in ("rows/request", "concurrency", column, "req/s", "rows/s", "p50 ms",
                   "p99 ms", vs, "errors", "client cores", "edge cores"):
        out.add_column(header, justify="left" if header == column else "right")
    by = {(r.rows, r.concurrency, r.protocol): r.load for r in results}
    for r in results:
        base, load = by[r.rows, r.concurrency, base_name].rps, r.load
        out.add_row(str(r.rows), str(r.concurrency), r.protocol, f"{load.rps:.1f}",
                    f"{load.rps * r.rows:.0f}", f"{load.p50_ms:.2f}", f"{load.p99_ms:.2f}",
                    f"{load.rps / base:.2f}x" if base else "-", str(load.errors),
                    f"{r.client_cores:.2f}", f"{r.server_cores:.2f}")
    return out


def summary(results: list[Result], base_name: str, what: str) -> str:
    """One line: each other entry's req/s over ``base_name``'s, geometric mean and range over
    the runs of the same rows and concurrency."""
    by = {(r.rows, r.concurrency, r.protocol): r.load.rps for r in results}
    parts = []
    for name in dict.fromkeys(r.protocol for r in results if r.protocol != base_name):
        ratios = [rps / by[rows, c, base_name] for (rows, c, p), rps in by.items()
                  if p == name and by.get((rows, c, base_name))]
        if ratios:
            mean = float(np.exp(np.mean(np.log(ratios))))
            parts.append(f"{name} {mean:.2f}x ({min(ratios):.2f}-{max(ratios):.2f}x)")
    return f"{what} req/s vs {base_name}, geometric mean over the runs (range): " + \
        "; ".join(parts) + "."
