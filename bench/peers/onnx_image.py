"""What both peer runtimes do for one batch of images, as Tiered's edge does with FP32 requests:
take the ``FP32`` input already in the model's layout (``[n, 1, 28, 28]`` for the digits
release), run the INT8 ONNX on the CPU with the edge's session options (``edge/runtime.py``:
``ORT_ENABLE_ALL``, intra-op threads = the runtime default unless given), softmax. Imported by
``mlserver_runtime.py`` and ``kserve_server.py`` inside their own venvs, so it uses only numpy
and onnxruntime.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort

IMAGE_INPUT = "image"


def floats_of(data: Any, shape: list[int]) -> np.ndarray:
    """An FP32 input's data (flat or nested lists, MLServer's root model, or an array) as a
    float32 array of ``shape``."""
    values = getattr(data, "root", data)  # MLServer wraps the list in a pydantic root model
    return np.asarray(values, dtype=np.float32).reshape(shape)


class ImageOnnx:
    def __init__(self, onnx: str, threads: int) -> None:
        self.args = (onnx, threads)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(onnx, options, providers=["CPUExecutionProvider"])
        model_input = self.session.get_inputs()[0]
        self.name = model_input.name
        self.row_shape = [int(d) for d in model_input.shape[1:]]

    def __getstate__(self) -> tuple[str, int]:
        """Pickled as its arguments (KServe's ``--workers N`` pickles its models)."""
        return self.args

    def __setstate__(self, args: tuple[str, int]) -> None:
        self.__init__(*args)  # type: ignore[misc]

    def warm(self) -> None:
        self.probabilities(np.zeros([1, *self.row_shape], dtype=np.float32))

    def probabilities(self, images: np.ndarray) -> np.ndarray:
        logits = np.asarray(self.session.run(None, {self.name: images})[0], dtype=np.float32)
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        return np.asarray(shifted / shifted.sum(axis=1, keepdims=True), dtype=np.float32)
