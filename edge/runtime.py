"""onnxruntime CPU session for the INT8 edge model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from serving.inputs.base import Feeds


class OnnxRuntime:
    def __init__(self, path: Path, threads: int) -> None:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        # Idle intra-op threads sleep instead of spinning: the server's event loop (HTTP,
        # parsing, tokenizing) needs those cores between batches. Measured on a 2-core EPYC
        # with the demo model: +26-33% req/s at 8 and 32 requests in flight (bench.tiers).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(str(path), options,
                                            providers=["CPUExecutionProvider"])
        self.description = f"onnxruntime {ort.__version__} CPU"
        self.names = [i.name for i in self.session.get_inputs()]

    def predict(self, feeds: Feeds) -> np.ndarray:
        """Logits for one call's feeds (those the model takes: a text model exported without
        ``token_type_ids`` ignores it)."""
        return np.asarray(self.session.run(None, {n: feeds[n] for n in self.names})[0],
                          dtype=np.float32)
