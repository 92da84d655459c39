"""``tiered demo``: a demo's test split through nginx, one review (or one digit image, as PNG
bytes in the binary tensor extension) per V2 request, or a user's own labelled rows
(``tiered.demo_data``) in requests of a few rows, a few requests at a time; what answered (edge
or center, which edge), how accurately, how fast."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from examples.sentiment import data


@dataclass
class Outcome:
    """Counts in rows (``sent``, ``failed``: the rows of failed requests), latencies per
    request."""

    sent: int = 0
    failed: int = 0
    requests: int = 0
    correct: int = 0
    rows_by_tier: Counter[str] = field(default_factory=Counter)
    by_node: Counter[str] = field(default_factory=Counter)
    by_region: Counter[str] = field(default_factory=Counter)
    by_version: Counter[str] = field(default_factory=Counter)  # model version that answered
    correct_by_version: Counter[str] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def answered(self) -> int:
        return self.sent - self.failed

    @property
    def accuracy(self) -> float:
        return self.correct / self.answered if self.answered else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else 0.0


@dataclass(frozen=True)
class DemoRequest:
    """One demo request: its body (and the binary extension's header length), the label of
    each of its rows."""

    content: bytes
    labels: list[str]
    header_length: int | None = None


OUTPUTS = [{"name": "label"}, {"name": "tier"}]


def test_split(rows: int) -> list[tuple[str, str]]:
    """(text, label name) for the first ``rows`` reviews of the demo's test split."""
    split = data.split(data.load_reviews(), seed=7).test
    return [(t, data.LABELS[y]) for t, y in zip(split.texts, split.labels, strict=True)][:rows]


def text_requests(rows: int) -> list[DemoRequest]:
    return [DemoRequest(json.dumps({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES",
                                            "data": [text]}], "outputs": OUTPUTS}).encode(),
                        [label]) for text, label in test_split(rows)]


def image_requests(release: Path, rows: int) -> list[DemoRequest]:
    """The image demo's test PNGs (in ``release``), each one request carrying the PNG as a
    BYTES element in the binary tensor extension, as a camera client sends it."""
    from examples.digits.data import test_rows

    out = []
    for png, label in test_rows(release, rows):
        head = json.dumps({"inputs": [{"name": "image", "shape": [1], "datatype": "BYTES",
                                       "parameters": {"binary_data_size": len(png) + 4}}],
                           "outputs": OUTPUTS}).encode()
        out.append(DemoRequest(head + len(png).to_bytes(4, "little") + png, [label],
                               len(head)))
    return out


async def run(url: str, model: str, rows: int, concurrency: int,
              region: str | None = None, requests: list[DemoRequest] | None = None) -> Outcome:
    """``requests``: default, the text demo's reviews."""
    examples = requests if requests is not None else text_requests(rows)
    outcome = Outcome()
    queue: asyncio.Queue[DemoRequest] = asyncio.Queue()
    for example in examples:
        queue.put_nowait(example)
    headers = {"X-Tiered-Region": region} if region else {}
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as client:
        await asyncio.gather(*(_worker(client, model, queue, outcome)
                               for _ in range(concurrency)))
    outcome.seconds = time.perf_counter() - started
    return outcome


async def _worker(client: httpx.AsyncClient, model: str, queue: asyncio.Queue[DemoRequest],
                  outcome: Outcome) -> None:
    while not queue.empty():
        request = queue.get_nowait()
        headers = ({"Inference-Header-Content-Length": str(request.header_length)}
                   if request.header_length is not None else
                   {"content-type": "application/json"})
        rows = len(request.labels)
        outcome.sent += rows
        outcome.requests += 1
        began = time.perf_counter()
        try:
            response = await client.post(f"/v2/models/{model}/infer",
                                         content=request.content, headers=headers)
        except httpx.HTTPError as exc:
            outcome.failed += rows
            outcome.errors[type(exc).__name__] += 1
            continue
        outcome.latencies_ms.append((time.perf_counter() - began) * 1000)
        if response.status_code != 200:
            outcome.failed += rows
            outcome.errors[f"HTTP {response.status_code}"] += 1
            continue
        _count(response.json(), request.labels, outcome)


def _count(answer: dict[str, Any], labels: list[str], outcome: Outcome) -> None:
    """One answered request's rows: right or wrong against ``labels``, which tier, version,
    node and region answered."""
    outputs = {o["name"]: o["data"] for o in answer["outputs"]}
    version = str(answer.get("model_version", "?"))
    parameters = answer.get("parameters", {})
    for label, served, tier in zip(labels, outputs["label"], outputs["tier"], strict=True):
        correct = served == label
        outcome.correct += correct
        outcome.by_version[version] += 1
        outcome.correct_by_version[version] += correct
        outcome.rows_by_tier[tier] += 1
        outcome.by_node[str(parameters.get("node_id", "?"))] += 1
        outcome.by_region[str(parameters.get("region", "?"))] += 1
