"""Length-aware batching on the real models: a published tiny release's INT8 ONNX edge model
(onnxruntime) and fp32 TorchScript center model (torch), fed concurrent requests of mixed
lengths through the batcher, answer every request's rows in its order, as each row alone
would be answered: exactly (fp32) or within the INT8 tolerance (dynamic quantization scales
activations per batch, so batch-mates move an INT8 answer a little)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch

from center.runtime import TorchScriptRuntime
from edge.runtime import OnnxRuntime
from examples.sentiment import data
from serving.model.scores import softmax
from serving.model.text import load_tokenizer, token_rows, unpadded
from serving.release.store import InstalledReleases
from serving.runtime.batcher import Batcher, BatchStats
from serving.runtime.repository import Runtime
from tests.codecs import TOKEN_BATCHING, token_feeds

pytestmark = pytest.mark.slow
REQUESTS = 48
INT8_MAX_DIFF = 0.05  # largest |Δp| between a row batched and alone (measured: < 0.01)


@pytest.fixture
def stores(tiny_stores: Path) -> Path:
    return tiny_stores


def runtime(stores: Path, tier: str) -> tuple[Runtime, list[list[np.ndarray]]]:
    """The tier's runtime as its server loads it, and requests of 1-3 rows of mixed lengths
    (review snippets cut to 1..40 words: the tiny model truncates at 32 tokens)."""
    manifest = InstalledReleases(stores / tier).verify("tiny", 1, tier)  # type: ignore[arg-type]
    folder = stores / tier / "tiny" / "1"
    served: Runtime = (OnnxRuntime(folder / manifest.edge.file, 1) if tier == "edge" else
                       TorchScriptRuntime(folder / manifest.center.file, torch.device("cpu"),
                                          "fp32", 1, [i.name for i in manifest.inputs]))
    tokenizer = unpadded(load_tokenizer(folder / (manifest.preprocessing.tokenizer or ""),
                                        manifest.preprocessing.max_length))
    rng = np.random.default_rng(3)
    words = [t.split() for t, _ in data.load_reviews()[:REQUESTS * 3]]
    texts = [" ".join(w[:int(rng.integers(1, 41))]) for w in words]
    rows, _ = token_rows(tokenizer, texts)
    sizes = rng.integers(1, 4, size=REQUESTS)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return served, [rows[starts[k]:starts[k + 1]] for k in range(REQUESTS)]


def batched(served: Runtime, requests: list[list[np.ndarray]],
            call_tokens: int) -> tuple[list[np.ndarray], list[BatchStats]]:
    stats: list[BatchStats] = []

    async def main() -> list[np.ndarray]:
        batcher = Batcher(served.predict, *TOKEN_BATCHING, max_batch_size=32, max_delay_ms=100,
                          max_queue_rows=1000, observe=stats.append, call_tokens=call_tokens)
        batcher.start()
        answers = await asyncio.gather(*(batcher.submit(r) for r in requests))
        await batcher.stop()
        return list(answers)

    return asyncio.run(main()), stats


@pytest.mark.parametrize("tier", ["center", "edge"])
def test_length_grouped_batches_answer_every_request_as_its_rows_alone(stores: Path,
                                                                     tier: str) -> None:
    served, requests = runtime(stores, tier)
    alone = [np.stack([served.predict(token_feeds([row]))[0] for row in request])
             for request in requests]
    grouped, stats = batched(served, requests, call_tokens=32)
    whole, whole_stats = batched(served, requests, call_tokens=10 ** 9)  # one call per batch

    assert sum(s.calls for s in stats) > len(stats)  # mixed lengths were split into groups
    assert sum(s.padded_tokens for s in stats) < sum(s.padded_tokens for s in whole_stats)
    assert sum(s.tokens for s in stats) == sum(len(r) for q in requests for r in q)
    for answers in (grouped, whole):
        assert [a.shape[0] for a in answers] == [len(q) for q in requests]
        for got, want in zip(answers, alone, strict=True):
            if tier == "center":  # fp32: padding and batch-mates change nothing
                assert np.allclose(got, want, atol=1e-4)
            else:
                diff = np.abs(softmax(got) - softmax(want)).max()
                assert diff <= INT8_MAX_DIFF, f"a row moved by {diff:.3f} when batched"
