"""Fuzzing a tier's V2 API: Schemathesis over the OpenAPI document it serves (positive and
negative cases per operation, plus V2-shaped bodies with fuzzed content), and hand-made hostile
bodies (JSON and the binary tensor extension) a correct tier refuses with a 4xx. Each run is
tallied per operation. ``tests/integration/test_fuzz.py`` runs it bounded; ``python -m
bench.fuzz`` longer, as a table. How it tests: docs/benchmark-methods.md, "Fuzzing the V2 API".
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import Failure, FailureGroup, ServerError
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

POSITIVE_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
                   response_schema_conformance]
NEGATIVE_CHECKS = [*POSITIVE_CHECKS, negative_data_rejection]
POSITIVE, NEGATIVE = schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE


@dataclass
class Tally:
    """What one tier answered to the cases generated for one operation (both modes)."""

    tier: str
    operation: str
    cases: int = 0
    ok: int = 0
    client_errors: int = 0
    server_errors: int = 0
    violations: int = 0
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)  # first few, with a curl to reproduce

    def record(self, status: int, problems: list[str]) -> None:
        self.cases += 1
        if 200 <= status < 300:
            self.ok += 1
        elif 400 <= status < 500:
            self.client_errors += 1
        elif status >= 500:
            self.server_errors += 1
        self.violations += bool(problems)
        self.failures += problems[:max(0, 3 - len(self.failures))]


def _problems(case: Any, response: Any, checks: list[Any]) -> list[str]:
    """The failed checks, described; a 5xx is counted as such, not again as a violation."""
    try:
        case.validate_response(response, checks=checks)
    except FailureGroup as group:
        failures = list(group.exceptions)
    except Failure as failure:
        failures = [failure]
    else:
        return []
    return [f"{f.title}: {f.message[:300]} -- {case.as_curl_command()}" for f in failures
            if not isinstance(f, ServerError)]


@dataclass
class Target:
    """One running tier and how hard to fuzz it."""

    tier: str
    base_url: str
    examples: int
    seed: int
    session: requests.Session
    served: dict[str, str]  # path parameters naming a loaded model: {"model": m, "version": v}


def fuzz_operation(operation: Any, target: Target) -> Tally:
    """Generated path parameters (mostly unknown models: 404) and, where the path names a
    model, the served model with a generated version and body, positive and negative."""
    tally = Tally(target.tier, operation.label)
    started = time.perf_counter()
    names = {p.name for p in operation.path_parameters}
    served = {"model": target.served["model"]}  # the version, if any, is generated
    runs: list[tuple[schemathesis.GenerationMode, dict[str, str]]] = [(POSITIVE, {})]
    runs += [(POSITIVE, served), (NEGATIVE, served)] if "model" in names else [(NEGATIVE, {})]
    for mode, path_parameters in runs:
        _send_cases(operation, mode, path_parameters, tally, target)
    tally.seconds = time.perf_counter() - started
    return tally


def _send_cases(operation: Any, mode: schemathesis.GenerationMode,
                path_parameters: dict[str, str], tally: Tally, target: Target) -> None:
    checks = NEGATIVE_CHECKS if mode == NEGATIVE else POSITIVE_CHECKS

    @seed(target.seed)
    @settings(max_examples=target.examples, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck), print_blob=False)
    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
    def send(case: Any) -> None:
        response = case.call(base_url=target.base_url, session=target.session, timeout=30)
        tally.record(response.status_code, _problems(case, response, checks))

    try:
        send()
    except Unsatisfiable:  # nothing to negate: the operation takes no parameters or body
        if mode == POSITIVE:
            raise


OUTPUT_NAMES = ["label", "probabilities", "confidence", "tier"]


def _rare(draw: st.DrawFn) -> bool:
    """True one time in eight: most bodies stay valid so the model runs, some break one rule."""
    return draw(st.integers(0, 7)) == 0


@st.composite
def v2_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """Well-formed V2 requests with fuzzed content: arbitrary texts, token ids in and out of
    the vocabulary, masks, thresholds, truncate flags, output names. Schemathesis alone rarely
    reaches the model: JSON Schema cannot tie ``shape`` to ``data``."""
    body: dict[str, Any] = {"inputs": draw(_texts()) if draw(st.booleans()) else
                            draw(_token_tensors())}
    parameters: dict[str, Any] = {}
    if draw(st.booleans()):
        parameters["threshold"] = draw(st.none() | st.booleans() | st.text(max_size=3)
                                       | st.floats(-0.5, 1.5)) if _rare(draw) else \
            draw(st.floats(0, 1))
    if draw(st.booleans()):
        parameters["truncate"] = draw(st.integers(0, 1)) if _rare(draw) else draw(st.booleans())
    body["parameters"] = parameters
    names = [*OUTPUT_NAMES, "logits"] if _rare(draw) else OUTPUT_NAMES
    body["outputs"] = [{"name": n} for n in draw(st.lists(st.sampled_from(names), max_size=4,
                                                          unique=True))] or None
    body["id"] = draw(st.none() | st.text(max_size=40))
    return body


@st.composite
def _texts(draw: st.DrawFn) -> list[dict[str, Any]]:
    texts = draw(st.lists(st.text(max_size=300), min_size=0 if _rare(draw) else 1, max_size=6))
    nested = draw(st.booleans())
    return [{"name": "text", "datatype": "BYTES",
             "shape": [len(texts), 1] if nested else [len(texts)],
             "data": [[t] for t in texts] if nested else texts}]


@st.composite
def _token_tensors(draw: st.DrawFn) -> list[dict[str, Any]]:
    rows = draw(st.integers(0 if _rare(draw) else 1, 4))
    length = draw(st.integers(1, 48))
    ids = st.integers(-(2 ** 63), 2 ** 63 - 1) if _rare(draw) else st.integers(0, 30_521)
    id_rows = [draw(st.lists(ids, min_size=length, max_size=length)) for _ in range(rows)]
    masks = []
    for _ in range(rows):
        if _rare(draw):
            masks.append(draw(st.lists(st.integers(-1, 2), min_size=length, max_size=length)))
        else:  # padded on the right, as tokenizers do
            real = draw(st.integers(1, length))
            masks.append([1] * real + [0] * (length - real))
    shape = [rows, length]
    return [{"name": "input_ids", "datatype": "INT64", "shape": shape, "data": id_rows},
            {"name": "attention_mask", "datatype": "INT64", "shape": shape, "data": masks}]


def fuzz_bodies(operation: Any, target: Target) -> Tally:
    """The served model's infer route fed ``v2_bodies``."""
    tally = Tally(target.tier, f"{operation.label} (V2-shaped bodies)")
    started = time.perf_counter()
    path = {k: v for k, v in target.served.items()
            if k in {p.name for p in operation.path_parameters}}

    @seed(target.seed)
    @settings(max_examples=target.examples, database=None, deadline=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck), print_blob=False)
    @given(body=v2_bodies())
    def send(body: dict[str, Any]) -> None:
        case = operation.Case(path_parameters=path, body=body, media_type="application/json")
        response = case.call(base_url=target.base_url, session=target.session, timeout=30)
        tally.record(response.status_code, _problems(case, response, POSITIVE_CHECKS))

    send()
    tally.seconds = time.perf_counter() - started
    return tally


MAX_BODY = 1 << 20  # the tiers' default max_body_bytes
DEPTHS = (2_000, 100_000)
TEXT_INPUT = '{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}'
NEST_IN = {  # "@" is where the nested arrays go: every field of a V2 request
    "data": '{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": @}]}',
    "data row": '{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1, 1], '
                '"data": [@]}]}',
    "token data": '{"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 1], '
                  '"data": @}, {"name": "attention_mask", "datatype": "INT64", "shape": [1, 1], '
                  '"data": [1]}]}',
    "shape": '{"inputs": [{"name": "text", "datatype": "BYTES", "shape": @, "data": ["a"]}]}',
    "name": '{"inputs": [{"name": @, "datatype": "BYTES", "shape": [1], "data": ["a"]}]}',
    "parameters": '{"inputs": [' + TEXT_INPUT + '], "parameters": {"x": @}}',
    "input parameters": '{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], '
                        '"data": ["a"], "parameters": {"x": @}}]}',
    "outputs": '{"inputs": [' + TEXT_INPUT + '], "outputs": @}',
    "output parameters": '{"inputs": [' + TEXT_INPUT + '], "outputs": [{"name": "label", '
                         '"parameters": {"x": @}}]}',
    "id": '{"inputs": [' + TEXT_INPUT + '], "id": @}',
    "inputs": '{"inputs": [@]}',
    "body": "@",
}


def _tokens(shape: str, ids: str, mask: str | None = None) -> bytes:
    return (f'{{"inputs": [{{"name": "input_ids", "datatype": "INT64", "shape": {shape}, '
            f'"data": {ids}}}, {{"name": "attention_mask", "datatype": "INT64", '
            f'"shape": {shape}, "data": {mask or ids}}}]}}').encode()


def _id_rows(rows: int, length: int, value: str = "1") -> str:
    return "[" + ",".join("[" + ",".join([value] * length) + "]" for _ in range(rows)) + "]"


def hostile_bodies(max_body: int = MAX_BODY, edge: bool = True) -> list[tuple[str, bytes]]:
    """Hand-made bodies a correct tier refuses with a 4xx and a ``{"error": ...}`` body,
    cheaply: nesting thousands deep in every field, declared shapes far over the limits,
    shapes that do not match their data, token-id bodies of 8 MiB and just under the body
    limit, numbers no INT64 holds, NaN/inf and floats where integers belong. Schemathesis and
    ``v2_bodies`` stay small and well-formed, so none of these come from them. ``edge``: add
    the bad thresholds (the center ignores ``parameters.threshold``)."""
    out: list[tuple[str, bytes]] = []
    for where, template in NEST_IN.items():
        for depth in DEPTHS:
            out.append((f"{depth} nested arrays in {where}",
                        template.replace("@", "[" * depth + "]" * depth).encode()))
    out.append(("100,000 nested objects in parameters",
                ('{"inputs": [' + TEXT_INPUT + '], "parameters": {"x": ' + '{"a": ' * 100_000
                 + "1" + "}" * 100_000 + "}}").encode()))
    for shape in ("[256, 8000]", "[4611686018427387904, 4611686018427387904]",
                  "[9223372036854775807, 1]", "[18446744073709551616, 1]", "[1e999, 1]",
                  "[-1, 2]", "[1, -1]", "[1, 2, 3]", "[1, 1, 1, 1, 1, 1, 1, 1, 1]", "[]",
                  "[257, 1]", "[0, 1]", "[1, 0]"):
        out.append((f"token shape {shape} with one row of data", _tokens(shape, "[[1]]")))
    out.append(("text shape [2**62]", b'{"inputs": [{"name": "text", "datatype": "BYTES", '
                b'"shape": [4611686018427387904], "data": ["a"]}]}'))
    out.append(("8 MiB of token ids, shape [256, 8000]",
                _tokens("[256, 8000]", _id_rows(256, 8000))))  # over the limit: 413
    rows = (max_body // 2 - 200) // (2 * 8000 + 3)  # both tensors just under the body limit
    out.append((f"{rows} rows of 8000 token ids under the body limit, declared [256, 8000]",
                _tokens("[256, 8000]", _id_rows(rows, 8000))))
    flat = ",".join(["1"] * (max_body // 4 - 100))
    out.append(("~1 MiB of flat token ids, declared [1, 1]", _tokens("[1, 1]", f"[{flat}]")))
    out.append(("nested rows of uneven length", _tokens("[2, 3]", "[[1, 2, 3], [1]]")))
    out.append(("more nested rows than declared", _tokens("[1, 2]", "[[1, 2], [1, 2]]")))
    out.append(("fewer flat values than declared", _tokens("[2, 2]", "[1, 2, 3]")))
    out.append(("ids and mask of different shapes", _tokens("[1, 2]", "[1, 2]", "[1]")))
    out.append(("texts: shape [3] for one string", b'{"inputs": [{"name": "text", "datatype": '
                b'"BYTES", "shape": [3], "data": ["a"]}]}'))
    out.append(("texts: nested strings in a [1, 1] row", b'{"inputs": [{"name": "text", '
                b'"datatype": "BYTES", "shape": [1, 1], "data": [["a", ["b"]]]}]}'))
    for value in ("9223372036854775808", "-9223372036854775809", "1" + "0" * 4000, "1e999",
                  "-1e999", "1.0e3", "2.5", "NaN", "Infinity", "-Infinity", "true", "null",
                  '"7"', "{}"):
        out.append((f"token id {value[:24]}", _tokens("[1, 2]", f"[101, {value}]", "[1, 1]")))
        out.append((f"mask value {value[:24]}", _tokens("[1, 2]", "[101, 102]", f"[1, {value}]")))
    for value in ("NaN", "Infinity", "1e999", "-1e999", "1" + "0" * 4000, "[0.5]", '"0.5"'):
        if not edge and value not in ("NaN", "Infinity"):  # malformed JSON for both tiers
            continue
        out.append((f"threshold {value[:24]}", ('{"inputs": [' + TEXT_INPUT + '], '
                    '"parameters": {"threshold": ' + value + "}}").encode()))
    out.append(("a text of 1 MiB", b'{"inputs": [{"name": "text", "datatype": "BYTES", '
                b'"shape": [1], "data": ["' + b"x" * (max_body - 100) + b'"]}]}'))
    return out


def _framed(inputs: list[dict[str, Any]], *chunks: bytes, length: str | None = None,
            **request: Any) -> tuple[bytes, str]:
    """A binary-extension body (JSON header, then ``chunks``) and its header length (or
    ``length``, when the case is a wrong one)."""
    head = json.dumps({"inputs": inputs, **request}).encode()
    return head + b"".join(chunks), length if length is not None else str(len(head))


def _strings(*values: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


def _binary_text(data: bytes, shape: list[int] | None = None, size: Any = None,
                 length: str | None = None, **request: Any) -> tuple[bytes, str]:
    item = {"name": "text", "datatype": "BYTES", "shape": shape or [1],
            "parameters": {"binary_data_size": len(data) if size is None else size}}
    return _framed([item], data, length=length, **request)


def _binary_ids(ids: bytes, shape: list[int], mask: list[int]) -> tuple[bytes, str]:
    return _framed([{"name": "input_ids", "datatype": "INT64", "shape": shape,
                     "parameters": {"binary_data_size": len(ids)}},
                    {"name": "attention_mask", "datatype": "INT64", "shape": shape,
                     "data": mask}], ids)


def hostile_binary_bodies(max_body: int = MAX_BODY) -> list[tuple[str, bytes, str]]:
    """Bodies of the binary tensor extension (``Inference-Header-Content-Length``) that a
    correct tier refuses with a 4xx and a ``{"error": ...}`` body: header lengths that are not
    byte counts or point outside the body or into the JSON, ``binary_data_size`` values that
    overrun, underrun or are not integers, BYTES elements whose length prefixes lie or are cut,
    invalid UTF-8, INT64 data of the wrong length, shapes far over the limits, and a body over
    the limit. (name, body, header length)."""
    good = _strings(b"a fine film")
    cases: list[tuple[str, tuple[bytes, str]]] = [
        (f"header length {value!r}", _binary_text(good, length=value))
        for value in ("", "abc", "-1", "0", "1e3", "0x10", "12 13", "9" * 13, "\u00b2",
                      "18446744073709551616")]
    raw, length = _binary_text(good)
    cases += [
        ("header length past the body", (raw, str(len(raw) + 1))),
        ("header length inside the JSON", (raw, str(int(length) // 2))),
        ("header length covering the binary part", (raw, str(len(raw)))),
        ("binary_data_size past the body", _binary_text(good, size=len(good) + 1)),
        ("binary_data_size short of the body", _binary_text(good, size=len(good) - 1)),
        ("binary_data_size 2**62", _binary_text(good, size=1 << 62)),
        ("binary_data_size -1", _binary_text(good, size=-1)),
        ("binary_data_size a string", _binary_text(good, size="11")),
        ("binary_data_size a float", _binary_text(good, size=11.0)),
        ("binary_data_size true", _binary_text(good, size=True)),
        ("length prefix past the end", _binary_text(struct.pack("<I", 99) + b"short")),
        ("length prefix 2**32-1", _binary_text(struct.pack("<I", 0xFFFFFFFF) + b"x")),
        ("length prefix cut short", _binary_text(b"\x01\x00")),
        ("bytes after the last element", _binary_text(good + b"trailing")),
        ("fewer elements than the shape", _binary_text(good, [3])),
        ("more elements than the shape", _binary_text(_strings(b"a", b"b"), [1])),
        ("invalid UTF-8", _binary_text(_strings(b"\xff\xfe\xfd"))),
        ("100,000 empty strings, shape [100000]", _binary_text(
            _strings(*[b""] * 100_000), [100_000])),
        ("text shape [2**62]", _binary_text(good, [1 << 62])),
        ("a string over the text limit", _binary_text(_strings(b"x" * (max_body // 2)))),
        ("both data and binary_data_size", _framed([
            {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"],
             "parameters": {"binary_data_size": len(good)}}], good)),
        ("binary data nobody declared", _framed([
            {"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}], good)),
        ("binary_data_output not a boolean", _binary_text(
            good, parameters={"binary_data_output": "yes"})),
        ("output binary_data not a boolean", _binary_text(
            good, outputs=[{"name": "label", "parameters": {"binary_data": 1}}])),
        ("INT64 data 4 bytes short", _binary_ids(b"\x00" * 12, [1, 2], [1, 1])),
        ("INT64 ids past the vocabulary", _binary_ids(
            struct.pack("<2q", 101, 1 << 62), [1, 2], [1, 1])),
        ("negative INT64 ids", _binary_ids(struct.pack("<2q", 101, -5), [1, 2], [1, 1])),
        ("INT64 shape [2**31, 2**31]", _binary_ids(b"\x00" * 16, [1 << 31, 1 << 31], [1, 1])),
        (f"{max_body + 1} bytes of binary data", _binary_text(
            _strings(b"x" * (max_body + 1)))),
    ]
    return [(name, body, header) for name, (body, header) in cases]


def fuzz_hostile(tier: str, base_url: str, model: str = "tiny",
                 max_body: int = MAX_BODY) -> Tally:
    """Every ``hostile_bodies`` and ``hostile_binary_bodies`` body, sent once to the infer
    route: each must get a 4xx with a ``{"error": ...}`` body (anything else is a failure; 5xx
    are counted apart)."""
    tally = Tally(tier, "POST /v2/models/{model}/infer (hostile bodies)")
    started = time.perf_counter()
    json_type = {"content-type": "application/json"}
    cases = [(name, body, json_type) for name, body in hostile_bodies(max_body, tier == "edge")]
    cases += [(name, body, {"content-type": "application/octet-stream",
                            "inference-header-content-length": header})
              for name, body, header in hostile_binary_bodies(max_body)]
    with requests.Session() as session:
        for name, body, headers in cases:
            response = session.post(f"{base_url}/v2/models/{model}/infer", data=body,
                                    headers=headers, timeout=60)
            problems = [] if 400 <= response.status_code < 500 and _error_body(response) else [
                f"{name}: {response.status_code} {response.text[:200]}"]
            tally.record(response.status_code, problems)
    tally.seconds = time.perf_counter() - started
    return tally


def _error_body(response: requests.Response) -> bool:
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], str)


def served_model(base_url: str) -> dict[str, str]:
    """Path parameters of the first model the tier serves, at its default version."""
    model = requests.get(f"{base_url}/v2/health/ready", timeout=10).json()["models"][0]
    version = requests.get(f"{base_url}/v2/models/{model}/ready", timeout=10).json()["version"]
    return {"model": model, "version": version}


def fuzz_tier(tier: str, base_url: str, examples: int, seed_: int) -> list[Tally]:
    """Fuzz every operation of the OpenAPI document ``base_url`` serves."""
    schema = schemathesis.openapi.from_url(f"{base_url}/schema/openapi.json")
    with requests.Session() as session:
        target = Target(tier, base_url, examples, seed_, session, served_model(base_url))
        tallies = []
        operations = []
        for result in schema.get_all_operations():
            if isinstance(result, Err):  # the document itself is broken
                raise result.err()
            operations.append(result.ok())
        for operation in sorted(operations, key=lambda o: (o.path, o.method)):
            tallies.append(fuzz_operation(operation, target))
            if operation.method.upper() == "POST":
                tallies.append(fuzz_bodies(operation, target))
        return tallies
