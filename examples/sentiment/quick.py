"""The quick demo release, built in well under a minute: ``python -m examples.sentiment.quick``.

``tiered up`` publishes it first, so a newcomer has a cascade to send requests to within a couple
of minutes, and trains the full release (``examples.sentiment.build``, ~12 minutes on 2 cores)
behind it. Nothing of the encoder is trained here: MiniLM's pretrained layers stay as they are,
mean-pooled like sentence-transformers, and only a logistic-regression head is fitted on top.

Center: all 6 layers plus a head. Edge: the first layer plus its own head (INT8 after publish).
One forward pass over the training rows gives both feature sets (after layer 1 and after layer
6); each head is an L-BFGS fit of a regularised cross-entropy, a second on 384 features. On the
demo's test split the center scores ~76% and the INT8 edge ~72% (the full release: ~82% and
~80%), so the cascade is real, if narrow: the edge answers what it is sure of, the center the
rest.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import numpy as np
import torch
from rich.console import Console
from torch import Tensor, nn

from examples.sentiment import data, encoder
from examples.sentiment.bert import BertClassifier, load_pretrained
from examples.sentiment.release import write_release
from examples.sentiment.train import _batch, seed_everything
from serving.model.text import load_tokenizer

MARKER = "quick.key"  # written last: its presence means the folder is complete
HERE = Path(__file__).parent
console = Console(highlight=False)


@dataclass(frozen=True)
class QuickConfig:
    seed: int = 7
    max_length: int = 64
    edge_layers: int = 1
    train_rows: int = 3000
    calibration_rows: int = 1000
    l2: float = 1e-2  # on the head's weights; 1e-3 costs the INT8 edge 2 points of fidelity


def quick_key(cfg: QuickConfig) -> str:
    """Changes when anything that shapes the release changes."""
    digest = hashlib.sha256(json.dumps([asdict(cfg), torch.__version__]).encode())
    for name in ("quick.py", "bert.py", "data.py", "release.py"):
        digest.update((HERE / name).read_bytes())
    return digest.hexdigest()


def is_built(out: Path, cfg: QuickConfig | None = None) -> bool:
    marker = out / MARKER
    return marker.is_file() and marker.read_text().strip() == quick_key(cfg or QuickConfig())


def build_quick(out: Path, cfg: QuickConfig | None = None) -> Path:
    """Write the quick release folder (reused when it is complete and from the same code)."""
    cfg = cfg or QuickConfig()
    if is_built(out, cfg):
        console.print(f"[dim]reusing the quick release in {out} (same code and settings)[/]")
        return out
    (out / MARKER).unlink(missing_ok=True)
    started = time.perf_counter()
    seed_everything(cfg.seed)
    dataset = data.split(data.load_reviews(), seed=cfg.seed)
    train = data.Split(dataset.train.texts[:cfg.train_rows],
                       dataset.train.labels[:cfg.train_rows])
    tokenizer = load_tokenizer(encoder.tokenizer_path(), cfg.max_length)
    center = load_pretrained(encoder.weights_path(), 6).eval()
    console.print(f"quick release: pooled MiniLM features of {len(train)} review snippets …")
    features = pooled_features(center, tokenizer, train.texts, (cfg.edge_layers, 6))
    labels = torch.tensor(train.labels)
    fit_head(center.classifier, features[6], labels, cfg.l2)
    edge = load_pretrained(encoder.weights_path(), cfg.edge_layers).eval()
    fit_head(edge.classifier, features[cfg.edge_layers], labels, cfg.l2)
    calibration = data.Split(dataset.val.texts[:cfg.calibration_rows],
                             dataset.val.labels[:cfg.calibration_rows])
    write_release(out, center, edge, encoder.tokenizer_path(), calibration, cfg.max_length)
    (out / MARKER).write_text(quick_key(cfg) + "\n")
    console.print(f"quick release written to {out} in {time.perf_counter() - started:.0f} s "
                  f"(center: 6 frozen layers + logistic head; edge: {cfg.edge_layers})")
    return out


def pooled_features(model: BertClassifier, tokenizer: object, texts: list[str],
                    layers: tuple[int, ...], batch_size: int = 64) -> dict[int, Tensor]:
    """Mean-pooled hidden states after each of ``layers`` (1-based), one row per text; the
    texts go through in length order so that batches pad little."""
    found = {k: torch.empty(len(texts), model.classifier.in_features) for k in layers}
    order = np.argsort([len(t) for t in texts], kind="stable")
    with torch.inference_mode():
        for start in range(0, len(texts), batch_size):
            rows = torch.from_numpy(order[start:start + batch_size])
            ids, mask = _batch(tokenizer, [texts[i] for i in rows])  # type: ignore[arg-type]
            weights = mask.to(torch.float32)
            additive = ((1.0 - weights) * -10000.0).unsqueeze(1).unsqueeze(2)
            hidden = model.embeddings(ids)
            for depth, layer in enumerate(model.layers, start=1):
                if depth > max(layers):
                    break
                hidden = layer(hidden, additive)
                if depth in found:
                    pooled = (hidden * weights.unsqueeze(-1)).sum(1)
                    found[depth][rows] = pooled / weights.sum(1, keepdim=True).clamp(min=1.0)
    return found


def fit_head(head: nn.Linear, features: Tensor, labels: Tensor, l2: float) -> None:
    """Logistic regression into ``head`` in place, on the raw pooled features. Not standardised
    on purpose: that would give large weights to the low-variance dimensions, where INT8's
    rounding noise is as large as anywhere, and the quantized edge would then disagree with
    its fp32 self on ~3.5% of the rows instead of ~2% (measured on the calibration split)."""
    optimizer = torch.optim.LBFGS(head.parameters(), max_iter=200,
                                  line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = (nn.functional.cross_entropy(head(features), labels)
                + l2 * head.weight.pow(2).sum())
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    head.requires_grad_(False)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", type=click.Path(path_type=Path), default=Path("var/demo/quick"),
              show_default=True, help="Release folder to write (reused when up to date).")
def main(out: Path) -> None:
    """Build the quick demo release folder (pretrained MiniLM, logistic heads) in seconds."""
    build_quick(out)


if __name__ == "__main__":
    main()
