"""What both peer runtimes do for one batch, as Tiered's edge does: tokenize with the release's
``tokenizer.json`` (truncate to ``max_length``, pad to the longest text), run the INT8 ONNX on
the CPU with the edge's session options (``edge/runtime.py``: ``ORT_ENABLE_ALL``, intra-op
threads = the runtime default unless given), softmax. Imported by ``mlserver_runtime.py`` and
``kserve_server.py`` inside their own venvs, so it uses only numpy, onnxruntime and tokenizers.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

INPUT = "text"


def texts_of(data: Any) -> list[str]:
    """The strings of a BYTES input's data (str or bytes, possibly nested one level)."""
    values = getattr(data, "root", data)  # MLServer wraps the list in a pydantic root model
    if isinstance(values, str | bytes):
        values = [values]
    texts: list[str] = []
    for value in values:
        if isinstance(value, list):
            texts.extend(v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in value)
        else:
            texts.append(value.decode("utf-8") if isinstance(value, bytes) else str(value))
    return texts


class TextOnnx:
    def __init__(self, onnx: str, tokenizer: str, max_length: int, threads: int) -> None:
        self.args = (onnx, tokenizer, max_length, threads)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(onnx, options, providers=["CPUExecutionProvider"])
        self.tokenizer = Tokenizer.from_file(tokenizer)
        self.tokenizer.enable_truncation(max_length=max_length)
        padding = self.tokenizer.padding or {}
        self.tokenizer.enable_padding(pad_id=padding.get("pad_id", 0),
                                      pad_token=padding.get("pad_token", "[PAD]"))

    def __getstate__(self) -> tuple[str, str, int, int]:
        """Pickled as its arguments: a server that spawns worker processes (KServe's
        ``--workers N``) pickles its models, and an onnxruntime session cannot be."""
        return self.args

    def __setstate__(self, args: tuple[str, str, int, int]) -> None:
        self.__init__(*args)  # type: ignore[misc]

    def probabilities(self, texts: list[str]) -> np.ndarray:
        encoded = self.tokenizer.encode_batch(texts)
        feeds = {"input_ids": np.asarray([e.ids for e in encoded], dtype=np.int64),
                 "attention_mask": np.asarray([e.attention_mask for e in encoded],
                                              dtype=np.int64)}
        logits = np.asarray(self.session.run(None, feeds)[0], dtype=np.float32)
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        return np.asarray(shifted / shifted.sum(axis=1, keepdims=True), dtype=np.float32)
