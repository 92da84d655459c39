"""Record real requests: the demo's test split through nginx, one V2 request of 1-3 reviews
each, written with the answer it got (JSON lines)."""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tiered.demo import test_split


@dataclass(frozen=True)
class Recorded:
    path: str
    body: dict[str, Any]
    status: int
    labels: list[str]  # what the stack answered when recorded

    def dumps(self) -> str:
        return json.dumps({"path": self.path, "body": self.body, "status": self.status,
                           "labels": self.labels}, ensure_ascii=False)

    @classmethod
    def loads(cls, line: str) -> Recorded:
        d = json.loads(line)
        return cls(d["path"], d["body"], d["status"], d["labels"])


def requests(model: str, count: int, seed: int = 0) -> list[tuple[str, dict[str, Any]]]:
    rng = random.Random(seed)
    texts = itertools.cycle([t for t, _ in test_split(count * 3)])  # the split has 2,000
    out: list[tuple[str, dict[str, Any]]] = []
    for _ in range(count):
        rows = [next(texts) for _ in range(rng.choice((1, 1, 2, 3)))]
        out.append((f"/v2/models/{model}/infer",
                    {"id": f"rec-{len(out)}", "inputs": [{"name": "text", "shape": [len(rows)],
                                                          "datatype": "BYTES", "data": rows}],
                     "outputs": [{"name": "label"}, {"name": "tier"}]}))
    return out


def labels_of(response: httpx.Response) -> list[str]:
    if response.status_code != 200:
        return []
    outputs = {o["name"]: o["data"] for o in response.json()["outputs"]}
    return [str(label) for label in outputs.get("label", [])]


def record(url: str, model: str, count: int, out: Path) -> list[Recorded]:
    """Send ``count`` requests through ``url`` (nginx) and write what went and came back."""
    recorded = []
    with httpx.Client(base_url=url, timeout=30) as http:
        for path, body in requests(model, count):
            response = http.post(path, json=body)
            recorded.append(Recorded(path, body, response.status_code, labels_of(response)))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(r.dumps() + "\n" for r in recorded), encoding="utf-8")
    return recorded


def load(path: Path) -> list[Recorded]:
    return [Recorded.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]
