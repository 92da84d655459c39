"""The code stays in rooms a newcomer can find: every module of ``serving/`` sits in a layer of
the import-linter contract, no product package imports the test harness, tests take their
fixtures from the harness and never from ``bench``, and no product class grows past ~150 lines
or ~10 methods without saying why in its docstring."""

from __future__ import annotations

import ast
import pkgutil
import tomllib
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("serving", "sync", "edge", "center", "registry", "tiered", "examples", "nginx")
MAX_LINES = 200
MAX_METHODS = 15


def contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return list(config["contracts"])


def layers_of(container: str) -> set[str]:
    contract = next(c for c in contracts() if c.get("containers") == [container])
    layers = contract["layers"]
    assert isinstance(layers, list)
    return {name.strip() for layer in layers for name in str(layer).split("|")}


@pytest.mark.parametrize("container", ["serving", "registry", "registry.server", "sync"])
def test_every_module_of_a_layered_package_sits_in_a_layer_of_its_contract(
        container: str) -> None:
    folder = ROOT.joinpath(*container.split("."))
    children = {info.name for info in pkgutil.iter_modules([str(folder)])}
    assert children, f"{folder} has no modules"
    named = layers_of(container)
    assert children <= named, (
        f"modules of {container} in no layer of the contract: {sorted(children - named)}")
    assert named <= children, f"layers naming nothing: {sorted(named - children)}"


def import_loops(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan): each is an import loop,
    counting imports made inside functions and for type checking only."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in graph.find_modules_directly_imported_by(module):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(group) > 1:
                loops.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return loops


def test_no_module_imports_itself_round_a_loop() -> None:
    graph = grimp.build_graph(*PRODUCT, "harness", "bench")
    assert not import_loops(graph), import_loops(graph)
    graph.add_import(importer="registry.store.db", imported="registry.ha.changes")
    graph.add_import(importer="registry.ha.changes", imported="registry.store.db")
    assert import_loops(graph) == [["registry.ha.changes", "registry.store.db"]]


def test_the_registry_top_level_holds_only_its_rooms_and_a_few_modules() -> None:
    modules = [info.name for info in pkgutil.iter_modules([str(ROOT / "registry")])
               if not info.ispkg]
    assert len(modules) <= 6, f"registry/ holds {len(modules)} modules: {sorted(modules)}"


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


def is_settings(node: ast.ClassDef) -> bool:
    """A settings class: a list of fields pydantic-settings reads, long by nature."""
    return node.name.endswith("Settings") and any(
        isinstance(base, ast.Name) and base.id.endswith("Settings") for base in node.bases)


def large_classes(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef) or is_settings(node):
            continue
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        methods = sum(isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                      for item in node.body)
        if lines > MAX_LINES or methods > MAX_METHODS:
            found.append(f"{where}:{node.lineno} {node.name} ({lines} lines, {methods} methods)")
    return found


def test_no_product_class_is_over_the_size_of_one_concern() -> None:
    found = [large for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))
             if "gen" not in path.relative_to(ROOT).parts
             for large in large_classes(path.read_text(encoding="utf-8"),
                                        str(path.relative_to(ROOT)))]
    assert not found, (f"classes over {MAX_LINES} lines or {MAX_METHODS} methods (settings "
                       f"classes excepted): split them by concern\n" + "\n".join(found))


def test_the_size_check_sees_both_sides_of_each_bound() -> None:
    def cls(methods: int, body_lines: int = 0, base: str = "") -> str:
        defs = "".join(f"    def m{i}(self) -> None: ...\n" for i in range(methods))
        return (f"class C({base}):\n" + defs + "    x = 1\n" * body_lines)

    assert not large_classes(cls(MAX_METHODS), "t")
    assert large_classes(cls(MAX_METHODS + 1), "t")
    assert not large_classes(cls(1, MAX_LINES - 2), "t")  # 1 + 1 + 198 lines
    assert large_classes(cls(1, MAX_LINES - 1), "t")
    assert not large_classes(cls(1, 500, "BaseSettings").replace("class C", "class XSettings"),
                             "t")
    assert large_classes(cls(1, 500).replace("class C", "class XSettings"), "t")


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


def test_no_two_product_classes_share_a_name() -> None:
    """A name a newcomer meets twice (``Policy`` in waves and in budgets) is one they cannot
    tell apart in a traceback or a search."""
    where: dict[str, list[str]] = {}
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "gen" in path.relative_to(ROOT).parts:
                continue
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                if isinstance(node, ast.ClassDef):
                    where.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    twins = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not twins, twins
