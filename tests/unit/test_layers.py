"""The code stays in rooms a newcomer can find: every module of ``serving/`` sits in a layer of
the import-linter contract, no product package imports the test harness, tests take their
fixtures from the harness and never from ``bench``, and no product class grows past ~150 lines
or ~10 methods without saying why in its docstring."""

from __future__ import annotations

import ast
import pkgutil
import tomllib
from pathlib import Path

import pytest

import serving

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("serving", "sync", "edge", "center", "registry", "tiered", "examples", "nginx")
MAX_LINES = 150
MAX_METHODS = 10
WHY = "Why one class:"  # the docstring paragraph that explains a larger class


def contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return list(config["contracts"])


def serving_layers() -> set[str]:
    contract = next(c for c in contracts() if c.get("containers") == ["serving"])
    layers = contract["layers"]
    assert isinstance(layers, list)
    return {name.strip() for layer in layers for name in str(layer).split("|")}


def test_every_module_of_serving_sits_in_a_layer_of_the_contract() -> None:
    children = {info.name for info in pkgutil.iter_modules(serving.__path__)}
    assert children, "serving/ has no modules"
    assert children <= serving_layers(), (
        f"modules of serving/ in no layer of the contract: {sorted(children - serving_layers())}")
    assert serving_layers() <= children, (
        f"layers naming nothing: {sorted(serving_layers() - children)}")


def test_the_harness_sits_above_every_product_package() -> None:
    contract = next(c for c in contracts() if str(c["name"]).startswith("Top-level packages"))
    layers = [str(layer) for layer in contract["layers"]]  # type: ignore[attr-defined]
    below = {name.strip() for layer in layers[layers.index("harness") + 1:]
             for name in layer.split("|")}
    assert set(PRODUCT) <= below


# Tests start processes, drive traffic and make hostile bodies with ``harness``; only the unit
# tests of the benchmarks' own logic import ``bench``.
BENCH_UNIT_TESTS = ROOT / "tests" / "unit" / "bench"


def bench_imports(source: str) -> list[str]:
    """The modules of ``bench`` a module's source imports, at any depth (a test function's
    local import too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [name for name in names if name == "bench" or name.startswith("bench.")]
    return sorted(found)


def bench_importers() -> list[str]:
    return [f"{path.relative_to(ROOT)}: {name}"
            for path in sorted((ROOT / "tests").rglob("*.py"))
            if not path.is_relative_to(BENCH_UNIT_TESTS)
            for name in bench_imports(path.read_text(encoding="utf-8"))]


def test_no_test_outside_tests_unit_bench_imports_bench() -> None:
    assert not bench_importers(), (
        "tests importing bench (what they need belongs in harness/):\n"
        + "\n".join(bench_importers()))


def test_the_bench_import_check_sees_every_form_of_import() -> None:
    source = ("import bench\nimport benchmark\nfrom harness import bench as b\n"
              "from bench import sites\n\n\ndef test_x() -> None:\n"
              "    import bench.swarm\n    from bench.sites import Traffic\n")
    assert bench_imports(source) == ["bench", "bench", "bench.sites", "bench.swarm"]


def large_classes() -> list[str]:
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "gen" in path.relative_to(ROOT).parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not isinstance(node, ast.ClassDef):
                    continue
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                methods = sum(isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                              for item in node.body)
                if (lines > MAX_LINES or methods > MAX_METHODS) and WHY not in (
                        ast.get_docstring(node) or ""):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                                 f"({lines} lines, {methods} methods)")
    return found


def test_no_product_class_is_large_without_a_reason_in_its_docstring() -> None:
    assert not large_classes(), (
        f"classes over {MAX_LINES} lines or {MAX_METHODS} methods whose docstring has no "
        f"'{WHY}' paragraph:\n" + "\n".join(large_classes()))


# Outside the settings classes (pydantic-settings reads their variables), the only modules of
# the product that read the environment, and why; docs/architecture.md says the same.
READS_ENVIRONMENT = {
    "serving/config/environment.py": "the variables a supervisor sets for its workers",
    "serving/telemetry/tracing.py": "OpenTelemetry's standard OTEL_* variables",
    "serving/transport/workers.py": "passes its own environment on to the workers it starts",
    "tiered/cli.py": "passes OTEL_* on to the tiers; CONSUL_HTTP_TOKEN for `tiered status`",
    "nginx/render.py": "CONSUL_HTTP_TOKEN, as every Consul client does",
}


def environment_readers() -> set[str]:
    found = set()
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv")
                        and isinstance(node.value, ast.Name) and node.value.id == "os"):
                    found.add(str(path.relative_to(ROOT)))
    return found


def test_only_the_modules_that_say_why_read_the_environment() -> None:
    readers = environment_readers()
    assert readers == set(READS_ENVIRONMENT), (
        f"new readers of the environment: {sorted(readers - set(READS_ENVIRONMENT))}; "
        f"no longer reading it: {sorted(set(READS_ENVIRONMENT) - readers)}")
    architecture = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert all(f"`{path}`" in architecture for path in READS_ENVIRONMENT)


# Services and the data plane are handed their parts by the wiring (edge/build.py,
# center/build.py called from each tier's cli.py wire()); their __init__ only keeps them.
HANDED_THEIR_PARTS = [("edge/pipeline.py", "EdgeService"), ("center/service.py", "CenterService"),
                      ("serving/dataplane.py", "DataPlane"), ("serving/process.py", "Process")]


def constructions(path: str, name: str) -> list[str]:
    """Calls in ``name.__init__`` other than the built-in containers: what it builds itself."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef)
                 and n.name == "__init__"), None)
    if init is None:  # a dataclass: its fields are what it is handed
        return []
    return [ast.unparse(call.func) for call in ast.walk(init) if isinstance(call, ast.Call)
            and ast.unparse(call.func) not in ("dict", "set", "list", "super().__init__")]


@pytest.mark.parametrize(("path", "name"), HANDED_THEIR_PARTS)
def test_services_are_handed_their_parts_and_build_nothing(path: str, name: str) -> None:
    assert constructions(path, name) == [], f"{name}.__init__ builds its own collaborators"


def test_the_construction_check_sees_a_collaborator_built_inside() -> None:
    assert constructions("edge/cache.py", "ResponseCache") == ["TTLCache"]
