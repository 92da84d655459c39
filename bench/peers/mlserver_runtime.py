"""MLServer custom runtimes for the demo's INT8 ONNX text classifier and the digits INT8 ONNX
image classifier (bench/peers/run.py).

Runs inside the MLServer venv (``var/bench/venvs/mlserver``), so it imports nothing from the
project. It does what Tiered's edge does for one batch: tokenize with the release's
``tokenizer.json`` (truncate to the manifest's ``max_length``, pad to the longest text of the
batch), run the INT8 ONNX with onnxruntime on the CPU with the edge's session options
(``edge/runtime.py``: ``ORT_ENABLE_ALL``, intra-op threads = the runtime default unless
``threads`` is set), softmax the logits.

Requests are the same V2 bodies Tiered takes: one BYTES input named ``text`` (shape ``[n]``);
request ``parameters`` are ignored. MLServer's adaptive batcher (``max_batch_size`` /
``max_batch_time`` in model-settings.json) merges concurrent requests into one request whose
``text`` input holds every text, and splits the outputs back along the first axis, so the
outputs are flat and row-major: ``label`` BYTES ``[n]``, ``probabilities`` FP32 ``[n, 2]``,
``confidence`` FP32 ``[n]``.

model-settings.json ``parameters``: ``uri`` the ``model.onnx`` file; ``extra``:
``tokenizer`` (path), ``max_length`` (int), ``labels`` (list of str), ``threads`` (int, 0 =
runtime default). The model runs in a one-thread executor, like Tiered's batcher, so the event
loop keeps taking requests while a batch computes (also with ``parallel_workers: 0``).

``OnnxImageClassifier`` does the same for an image model: one ``FP32`` input named ``image``
already in the model's layout (``[n, 1, 28, 28]``, as Tiered takes it), no tokenizer; ``extra``:
``labels``, ``threads``.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mlserver import MLModel
from mlserver.errors import InferenceError
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput
from mlserver.utils import get_model_uri
from onnx_image import IMAGE_INPUT, ImageOnnx, floats_of
from onnx_text import INPUT, TextOnnx, texts_of


class OnnxTextClassifier(MLModel):
    """``implementation: mlserver_runtime.OnnxTextClassifier`` (with this folder on
    PYTHONPATH)."""

    async def load(self) -> bool:
        parameters = self.settings.parameters
        extra: dict[str, Any] = dict(parameters.extra or {}) if parameters else {}
        path = await get_model_uri(self.settings)
        self.model = TextOnnx(path, str(extra["tokenizer"]), int(extra["max_length"]),
                              int(extra.get("threads", 0)))
        self.labels: list[str] = [str(label) for label in extra["labels"]]
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="onnx")
        self.model.probabilities(["warm-up"])
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inputs = [i for i in payload.inputs if i.name == INPUT]
        if not inputs or inputs[0].datatype != "BYTES":
            raise InferenceError(f"expected a BYTES input named {INPUT!r}")
        texts = texts_of(inputs[0].data)
        if not texts:
            raise InferenceError(f"input {INPUT!r} holds no text")
        loop = asyncio.get_running_loop()
        probabilities = await loop.run_in_executor(self.executor, self.model.probabilities,
                                                   texts)
        return answer(self, payload, probabilities, self.labels)

    async def unload(self) -> bool:
        return unload(self)


class OnnxImageClassifier(MLModel):
    """``implementation: mlserver_runtime.OnnxImageClassifier``: FP32 images in the model's
    layout."""

    async def load(self) -> bool:
        parameters = self.settings.parameters
        extra: dict[str, Any] = dict(parameters.extra or {}) if parameters else {}
        path = await get_model_uri(self.settings)
        self.model = ImageOnnx(path, int(extra.get("threads", 0)))
        self.labels: list[str] = [str(label) for label in extra["labels"]]
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="onnx")
        self.model.warm()
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        inputs = [i for i in payload.inputs if i.name == IMAGE_INPUT]
        if not inputs or inputs[0].datatype != "FP32":
            raise InferenceError(f"expected an FP32 input named {IMAGE_INPUT!r}")
        shape = list(inputs[0].shape)
        if len(shape) != 1 + len(self.model.row_shape) or shape[1:] != self.model.row_shape:
            raise InferenceError(f"input {IMAGE_INPUT!r}: shape {shape}, the model takes "
                                 f"[n, {', '.join(map(str, self.model.row_shape))}]")
        images = floats_of(inputs[0].data, shape)
        loop = asyncio.get_running_loop()
        probabilities = await loop.run_in_executor(self.executor, self.model.probabilities,
                                                   images)
        return answer(self, payload, probabilities, self.labels)

    async def unload(self) -> bool:
        return unload(self)


def answer(model: MLModel, payload: InferenceRequest, probabilities: Any,
           labels: list[str]) -> InferenceResponse:
    """``label`` BYTES ``[n]``, ``probabilities`` FP32 ``[n, classes]``, ``confidence`` FP32
    ``[n]``."""
    n, classes = probabilities.shape
    return InferenceResponse(
        model_name=model.name, model_version=model.version, id=payload.id,
        outputs=[
            ResponseOutput(name="label", shape=[n], datatype="BYTES",
                           data=[labels[i] for i in probabilities.argmax(1)]),
            ResponseOutput(name="probabilities", shape=[n, classes], datatype="FP32",
                           data=probabilities.astype(float).ravel().tolist()),
            ResponseOutput(name="confidence", shape=[n], datatype="FP32",
                           data=probabilities.max(1).astype(float).tolist()),
        ])


def unload(model: MLModel) -> bool:
    executor: ThreadPoolExecutor | None = getattr(model, "executor", None)
    if executor is not None:
        executor.shutdown(wait=False)
    return True
