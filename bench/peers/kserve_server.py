"""KServe Python model server for the demo's INT8 ONNX text classifier and the digits INT8 ONNX
image classifier (bench/peers/run.py).

Runs inside the KServe venv (``var/bench/venvs/kserve``), so it imports nothing from the
project::

    python kserve_server.py --model_name sentiment --http_port PORT --enable_grpc false \
        --onnx MODEL.onnx --tokenizer tokenizer.json --max_length 64 --labels rotten,fresh

It does what Tiered's edge does for one request: tokenize with the release's
``tokenizer.json`` (truncate to the manifest's ``max_length``, pad to the longest text), run
the INT8 ONNX with onnxruntime on the CPU with the edge's session options (``edge/runtime.py``:
``ORT_ENABLE_ALL``, intra-op threads = the runtime default unless ``--threads``), softmax.
Requests are the same V2 bodies Tiered takes (one BYTES input ``text``, shape ``[n]``; request
``parameters`` are ignored); outputs ``label`` BYTES ``[n]``, ``probabilities`` FP32 ``[n, 2]``,
``confidence`` FP32 ``[n]``. With ``--kind image`` (no ``--tokenizer``/``--max_length``) it serves
an image model instead: one ``FP32`` input named ``image`` already in the model's layout
(``[n, 1, 28, 28]``, as Tiered takes it), the same outputs.

No adaptive batching: KServe's Python model server (``kserve.ModelServer``) has none. KServe's
batcher (``spec.predictor.batcher``: ``maxBatchSize``, ``maxLatency``) is part of the KServe
agent sidecar (Go) that the KServe controller injects into an InferenceService pod on
Kubernetes; it is not in the ``kserve`` Python package, and per KServe's docs it batches the V1
protocol only. So each request is one model execution. ``predict`` is a plain (synchronous)
method, as in KServe's custom-model examples: KServe then calls it on the event loop, one
request at a time.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import kserve
from kserve.errors import InvalidInput
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse
from onnx_image import IMAGE_INPUT, ImageOnnx, floats_of
from onnx_text import INPUT, TextOnnx, texts_of


class OnnxTextClassifier(kserve.Model):
    def __init__(self, name: str, onnx: str, tokenizer: str, max_length: int,
                 labels: list[str], threads: int) -> None:
        super().__init__(name)
        self.model = TextOnnx(onnx, tokenizer, max_length, threads)
        self.labels = labels
        self.load()

    def load(self) -> bool:
        self.model.probabilities(["warm-up"])
        self.ready = True
        return True

    def predict(self, payload: InferRequest, headers: dict[str, str] | None = None
                ) -> InferResponse:
        inputs = [i for i in payload.inputs if i.name == INPUT]
        if not inputs or inputs[0].datatype != "BYTES":
            raise InvalidInput(f"expected a BYTES input named {INPUT!r}")
        texts = texts_of(inputs[0].data)
        if not texts:
            raise InvalidInput(f"input {INPUT!r} holds no text")
        return answer(self, payload, self.model.probabilities(texts), self.labels)


class OnnxImageClassifier(kserve.Model):
    def __init__(self, name: str, onnx: str, labels: list[str], threads: int) -> None:
        super().__init__(name)
        self.model = ImageOnnx(onnx, threads)
        self.labels = labels
        self.load()

    def load(self) -> bool:
        self.model.warm()
        self.ready = True
        return True

    def predict(self, payload: InferRequest, headers: dict[str, str] | None = None
                ) -> InferResponse:
        inputs = [i for i in payload.inputs if i.name == IMAGE_INPUT]
        if not inputs or inputs[0].datatype != "FP32":
            raise InvalidInput(f"expected an FP32 input named {IMAGE_INPUT!r}")
        shape = list(inputs[0].shape)
        if len(shape) != 1 + len(self.model.row_shape) or shape[1:] != self.model.row_shape:
            raise InvalidInput(f"input {IMAGE_INPUT!r}: shape {shape}, the model takes "
                               f"[n, {', '.join(map(str, self.model.row_shape))}]")
        images = floats_of(inputs[0].data, shape)
        return answer(self, payload, self.model.probabilities(images), self.labels)


def answer(model: kserve.Model, payload: InferRequest, probabilities: Any,
           labels: list[str]) -> InferResponse:
    """``label`` BYTES ``[n]``, ``probabilities`` FP32 ``[n, classes]``, ``confidence`` FP32
    ``[n]``."""
    n, classes = probabilities.shape
    outputs = [
        InferOutput("label", [n], "BYTES", [labels[i] for i in probabilities.argmax(1)]),
        InferOutput("probabilities", [n, classes], "FP32",
                    probabilities.astype(float).ravel().tolist()),
        InferOutput("confidence", [n], "FP32", probabilities.max(1).astype(float).tolist()),
    ]
    return InferResponse(response_id=payload.id or "", model_name=model.name,
                         infer_outputs=outputs)


def main(argv: list[str]) -> None:
    # kserve.model_server parses sys.argv at import for its own flags (--http_port,
    # --enable_grpc, --model_name, ...) and ignores the rest; these are ours.
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--model_name", default="sentiment")
    parser.add_argument("--kind", choices=("text", "image"), default="text")
    parser.add_argument("--onnx", required=True)
    parser.add_argument("--tokenizer", help="text: the release's tokenizer.json")
    parser.add_argument("--max_length", type=int, default=0, help="text: truncate to this")
    parser.add_argument("--labels", required=True, help="comma-separated, in logit order")
    parser.add_argument("--threads", type=int, default=0, help="0 = onnxruntime's default")
    args, _ = parser.parse_known_args(argv)
    labels = args.labels.split(",")
    model: kserve.Model
    if args.kind == "image":
        model = OnnxImageClassifier(args.model_name, args.onnx, labels, args.threads)
    else:
        if not args.tokenizer or not args.max_length:
            parser.error("--kind text needs --tokenizer and --max_length")
        model = OnnxTextClassifier(args.model_name, args.onnx, args.tokenizer,
                                   args.max_length, labels, args.threads)
    kserve.ModelServer().start([model])


if __name__ == "__main__":
    main(sys.argv[1:])
