"""The OpenAPI description of the V2 routes (served at ``/schema/openapi.json``).

The infer route reads its raw body (``serving.protocol.v2`` decodes and validates it, so every
client mistake gets a precise ``{"error": ...}``), which leaves Litestar nothing to describe. Each
route therefore names an ``Operation`` subclass that writes its bodies and every status it answers
with, so clients and schema-driven fuzzers (Schemathesis) see the real contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Operation

from serving.protocol import v2
from serving.runtime import classify

Schema = dict[str, Any]
JSON = "application/json"


def _object(properties: Schema, required: list[str] | None = None,
            closed: bool = False) -> Schema:
    schema: Schema = {"type": "object", "properties": properties,
                      "required": required if required is not None else list(properties)}
    if closed:
        schema["additionalProperties"] = False
    return schema


STRING: Schema = {"type": "string"}
STRINGS: Schema = {"type": "array", "items": STRING}
ERROR = _object({"error": STRING}, closed=True)
TENSOR_METADATA = _object({"name": STRING, "datatype": STRING,
                           "shape": {"type": "array", "items": {"type": "integer"}}})
REQUEST_INPUT = _object({
    "name": {"type": "string",
             "description": "an input the model's metadata lists (e.g. 'text' as BYTES, or "
                            "'input_ids' and 'attention_mask' as INT64; 'image' as JPEG/PNG "
                            "BYTES, UINT8 pixels or FP32)"},
    "shape": {"type": "array", "items": {"type": "integer", "minimum": 0},
              "minItems": 1, "maxItems": 8,
              "description": "the first dimension is the rows"},
    "datatype": {"enum": ["BYTES", *v2.NUMERIC]},
    "data": {"type": "array", "description": "row-major, flat or nested"},
    "parameters": {"type": "object"},
}, required=["name", "shape", "datatype", "data"], closed=True)
INFER_REQUEST = _object({
    "inputs": {"type": "array", "items": REQUEST_INPUT},
    "id": {"type": ["string", "null"], "description": "echoed in the response"},
    "parameters": {"type": "object", "description": "threshold (0..1, edge only), truncate "
                                                    "(boolean, default true)"},
    "outputs": {"type": ["array", "null"],
                "items": _object({"name": {"enum": list(classify.OUTPUTS)},
                                  "parameters": {"type": "object"}},
                                 required=["name"], closed=True)},
}, required=["inputs"], closed=True)
INFER_RESPONSE = _object({
    "model_name": STRING, "model_version": STRING, "id": {"type": ["string", "null"]},
    "parameters": {"type": "object"},
    "outputs": {"type": "array", "items": _object({
        "name": {"enum": list(classify.OUTPUTS)}, "datatype": {"enum": ["BYTES", "FP32"]},
        "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "data": {"type": "array"}})},
}, required=["model_name", "model_version", "outputs"])
LIVE = _object({"live": {"const": True}})
READY = _object({"ready": {"const": True}, "models": STRINGS})
SERVER = _object({"name": STRING, "version": STRING, "extensions": STRINGS})
MODEL = _object({"name": STRING, "versions": STRINGS, "platform": STRING,
                 "inputs": {"type": "array", "items": TENSOR_METADATA},
                 "outputs": {"type": "array", "items": TENSOR_METADATA},
                 "parameters": {"type": "object"}})
MODEL_READY = _object({"name": STRING, "version": STRING, "ready": {"const": True}})

PATH_PARAMETERS: dict[str, Schema] = {
    "model": {"type": "string", "pattern": "^[a-z0-9][a-z0-9._-]*$", "maxLength": 128},
    "version": {"type": "string", "pattern": "^[0-9]+$"},
}
WHY = {400: "invalid request (the message names the field)",
       404: "unknown model, or that version is not loaded",
       413: "request body larger than max_body_bytes",
       503: "not ready (model loading) or overloaded (Retry-After)"}


def _content(schema: Schema, media_type: str = JSON) -> Schema:
    return {media_type: {"schema": schema}}


def documented(ok: Schema, errors: tuple[int, ...] = (), request: Schema | None = None,
               media_type: str = JSON) -> type[Operation]:
    """An ``Operation`` class that documents ``ok`` (200), ``errors`` in the V2 error shape
    and, when given, the JSON request body; path parameters get ``PATH_PARAMETERS``."""

    @dataclass
    class Documented(Operation):
        def to_schema(self) -> dict[str, Any]:
            schema = super().to_schema()
            for parameter in schema.get("parameters", []):
                if parameter.get("in") == "path":  # Litestar writes str | None as string|null
                    parameter["schema"] = PATH_PARAMETERS.get(parameter["name"], STRING)
            responses = {"200": {"description": "OK", "content": _content(ok, media_type)}}
            for status in errors:
                responses[str(status)] = {"description": WHY[status], "content": _content(ERROR)}
            schema["responses"] = responses
            if request is not None:
                schema["requestBody"] = {"required": True, "content": _content(request)}
            return schema

    return Documented


def config(title: str) -> OpenAPIConfig:
    return OpenAPIConfig(title=title, version="0.1.0", description="Open Inference Protocol "
                         "(KServe V2) REST API; errors are {\"error\": \"<message>\"}.")
