"""Schema-driven fuzzing of both tiers' V2 API with Schemathesis.

Run from the repository root (about 3 minutes with the default 200 examples)::

    .venv/bin/python -m bench.fuzz [--examples N] [--seed S] [--markdown PATH]

It builds a tiny release (``examples.sentiment.tiny``), publishes it to a temporary registry,
pulls it into a center and an edge store and starts both tiers on free 127.0.0.1 ports (the
edge escalating to that center). For each tier it loads the OpenAPI document the tier serves at
``/schema/openapi.json`` and, for every operation, sends ``--examples`` requests generated to
fit the schema (positive) and as many generated to break it (negative: wrong types, unknown
fields, values outside enums...). Each response is checked with Schemathesis's checks:
``status_code_conformance``, ``content_type_conformance``, ``response_schema_conformance`` (so
every 4xx must be the documented ``{"error": "..."}``) and, for negative cases,
``negative_data_rejection`` (a request that breaks the schema must be refused). Any 5xx is
counted apart. Generation is seeded (``--seed``) and uses no example database, so a run
repeats exactly. The table lists per tier and operation the cases sent, the responses by
status class, the schema violations and the seconds spent; the first failures are printed
below it with a curl command that reproduces each.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from rich.console import Console
from rich.table import Table
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import Failure, FailureGroup, ServerError
from schemathesis.core.result import Err
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from bench.markdown import Shown
from tiered.processes import BIN, TierProcess, start_tier

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


def _registry(home: Path, *args: str | Path) -> None:
    subprocess.run([str(BIN / "registry"), *map(str, args)], check=True, capture_output=True,
                   env={"PATH": str(BIN), "REGISTRY_HOME": str(home), "HOME": str(home),
                        "REGISTRY_ACTOR": "bench@fuzz"}, timeout=300)


def fill_stores(root: Path, release: Path, model: str = "tiny") -> None:
    """Publish ``release`` to a registry under ``root`` and pull it into both tiers' stores."""
    home = root / "registry"
    _registry(home, "publish", release, "--name", model)
    for tier in ("center", "edge"):
        _registry(home, "pull", model, "--tier", tier, "--store", root / tier)


@contextmanager
def tiers(root: Path, env: dict[str, str] | None = None) -> Iterator[tuple[TierProcess,
                                                                            TierProcess]]:
    """A center and an edge escalating to it, serving the stores under ``root``."""
    center = start_tier("center", root / "center", root, env=env)
    try:
        edge = start_tier("edge", root / "edge", root, "--center-url", center.url, env=env)
        try:
            yield center, edge
        finally:
            edge.stop()
    finally:
        center.stop()


def table(tallies: list[Tally], examples: int, seed_: int) -> Table:
    out = Table(title=f"Schemathesis fuzzing of the V2 API ({examples} positive + {examples} "
                      f"negative examples per operation at most, seed {seed_})")
    for header in ("tier", "operation", "cases", "2xx", "4xx", "5xx", "schema violations",
                   "seconds"):
        out.add_column(header, justify="left" if header in ("tier", "operation") else "right")
    for t in tallies:
        out.add_row(t.tier, t.operation, str(t.cases), str(t.ok), str(t.client_errors),
                    f"[red]{t.server_errors}[/red]" if t.server_errors else "0",
                    f"[red]{t.violations}[/red]" if t.violations else "0", f"{t.seconds:.1f}")
    cases = sum(t.cases for t in tallies)
    out.add_row("all", "", str(cases), str(sum(t.ok for t in tallies)),
                str(sum(t.client_errors for t in tallies)),
                str(sum(t.server_errors for t in tallies)),
                str(sum(t.violations for t in tallies)),
                f"{sum(t.seconds for t in tallies):.1f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=200,
                        help="most cases generated per operation and mode (default 200)")
    parser.add_argument("--seed", type=int, default=7, help="generation seed (default 7)")
    parser.add_argument("--markdown", type=Path, help="also write the table as markdown here")
    args = parser.parse_args()
    from examples.sentiment.tiny import build_tiny_release  # torch: only when run

    console = Console(width=140)
    show = Shown(console)
    with tempfile.TemporaryDirectory(prefix="tiered-fuzz-") as tmp:
        root = Path(tmp)
        fill_stores(root, build_tiny_release(root / "release"))
        with tiers(root) as (center, edge):
            tallies = []
            for server in (center, edge):
                tallies += fuzz_tier(server.tier, server.url, args.examples, args.seed)
    show(table(tallies, args.examples, args.seed))
    failures = [f"{t.tier} {t.operation}: {f}" for t in tallies for f in t.failures]
    show(f"{len(failures)} failures shown" if failures else "No 5xx and no schema violation.")
    for failure in failures[:20]:
        show(failure)
    if args.markdown:
        show.write(args.markdown, "Fuzzing the V2 API (Schemathesis)")


if __name__ == "__main__":
    main()
