"""The README stays a short front door and the docs link only to files inside the repository."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MAX_README_LINES = 250

# The layers of docs/architecture.md, top to bottom; packages on one layer are siblings.


def contract_layers(name_start: str) -> list[list[str]]:
    """The layers of the import-linter contract whose name starts with ``name_start``, top first
    (what `make lint` enforces)."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contract = next(c for c in contracts["contracts"] if c["name"].startswith(name_start))
    return [[name.strip() for name in layer.split("|")] for layer in contract["layers"]]


LAYERS = contract_layers("Top-level packages")

# [text](target) and ![alt](target), with an optional "title"; reference definitions too.
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def strip_code(text: str) -> str:
    """``text`` without fenced code blocks, then without inline code (in that order: a fence's
    backticks would otherwise pair up as inline code)."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def links(path: Path) -> list[str]:
    """Every link target in ``path``, code left out."""
    text = strip_code(path.read_text(encoding="utf-8"))
    return INLINE.findall(text) + REFERENCE.findall(text)


def relative_links() -> list[tuple[Path, str]]:
    return [(path, target) for path in markdown_files() for target in links(path)
            if target and not EXTERNAL.match(target) and not target.startswith("#")]


def where(path: Path, target: str) -> str:
    return f"{path.relative_to(ROOT)}: {target}"


def test_the_readme_is_at_most_250_lines() -> None:
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines (at most {MAX_README_LINES}): move detail into docs/")


def test_the_readme_shows_the_two_commands_a_newcomer_needs() -> None:
    text = README.read_text(encoding="utf-8")
    missing = [command for command in ("make up", "make test") if command not in text]
    assert not missing, f"README.md does not show {missing}"


def test_no_link_climbs_out_of_its_folder_or_the_repository() -> None:
    escaping = []
    for path, target in relative_links():
        file = target.split("#", 1)[0]
        resolved = (path.parent / file).resolve()
        if file.startswith(("../", "/")) or not resolved.is_relative_to(ROOT):
            escaping.append(where(path, target))
    assert not escaping, "links leaving their folder or the repository:\n" + "\n".join(escaping)


def test_every_relative_link_resolves_to_a_file_in_the_repository() -> None:
    broken = []
    for path, target in relative_links():
        file = target.split("#", 1)[0]
        if file and not (path.parent / file).resolve().exists():
            broken.append(where(path, target))
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_the_link_checker_sees_links_and_skips_code() -> None:
    text = ("[a](a.md) ![b](b.png \"t\") [c](https://x.org) `[d](d.md)`\n"
            "```\n[e](e.md)\n```\n[f]: f.md\n")
    assert INLINE.findall(strip_code(text)) == ["a.md", "b.png", "https://x.org"]
    assert REFERENCE.findall(strip_code(text)) == ["f.md"]


def top_level_packages() -> set[str]:
    return {init.parent.name for init in ROOT.glob("*/__init__.py")} - {"tests"}


def layer_block() -> list[list[str]]:
    """The fenced block of docs/architecture.md's "Layers" section, one layer a line."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("\n## Layers", 1)
    assert len(section) == 2, "docs/architecture.md has no '## Layers' section"
    block = re.search(r"^```\n(.*?)^```", section[1], re.MULTILINE | re.DOTALL)
    assert block, "the 'Layers' section of docs/architecture.md has no fenced block of layers"
    return [[name.strip() for name in line.split("|")]
            for line in block.group(1).splitlines() if line.strip()]


def test_architecture_names_every_top_level_package_in_the_layering_order() -> None:
    assert ARCHITECTURE.exists(), "docs/architecture.md is missing"
    layers = layer_block()
    assert [sorted(layer) for layer in layers] == [sorted(layer) for layer in LAYERS], (
        f"docs/architecture.md gives the layers as {layers}, expected {LAYERS} (top first)")
    named = {name for layer in layers for name in layer}
    assert top_level_packages() <= named, (
        f"packages missing from the layers: {sorted(top_level_packages() - named)}")


# `serving.dataplane.DataPlane`, ``edge/pipeline.py``: names of code in the docs and docstrings
DOTTED = re.compile(r"`{1,2}((?:serving|edge|center|registry|sync|tiered|examples|nginx|bench"
                    r"|harness)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")
PATH = re.compile(r"`{1,2}((?:[A-Za-z0-9_.-]+/)+[A-Za-z0-9_.-]+"
                  r"\.(?:py|proto|sh|lua|toml|yml|hcl|template))`")
# dotted names that are files, hosts or span attributes, not code
NOT_CODE = {"json", "sqlite3", "pem", "invalid", "proto", "template", "v1"}
ALWAYS_CODE = ("serving.", "edge.", "center.", "sync.", "harness.", "bench.")


def code_texts() -> list[Path]:
    packages = ("serving", "edge", "center", "registry", "sync", "tiered", "examples", "nginx",
                "bench", "harness")
    files = [README, *sorted((ROOT / "docs").rglob("*.md"))]
    for package in packages:
        files += [p for p in sorted((ROOT / package).rglob("*.py")) if "gen" not in p.parts]
    return files


def defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """The names a module or class body binds: functions, classes, assignments, imports."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if isinstance(leaf, ast.Name):
                        names[leaf.id] = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, optional imports
            names |= defined([*node.body, *getattr(node, "orelse", [])])
    return names


def resolves(name: str) -> bool:
    """``name`` is a module of the repository, or a name a module binds (a class, and its
    methods). Read from the source, never imported: a test process may hold clashing stubs."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:cut])
        source = next((f for f in (base / "__init__.py", base.with_suffix(".py")) if f.exists()),
                      None)
        if source is None:
            continue
        if cut == 1 and len(parts) > 1 and not name.startswith(ALWAYS_CODE):
            return True  # `tiered.request_id`, `registry.sqlite3`: not a name of code
        body = ast.parse(source.read_text(encoding="utf-8")).body
        for attribute in parts[cut:]:
            found = defined(body).get(attribute)
            if found is None:
                return False
            body = found.body if isinstance(found, ast.ClassDef) else []
        return True
    return False


def test_every_module_and_file_the_docs_name_exists() -> None:
    missing = []
    for path in code_texts():
        text = path.read_text(encoding="utf-8")
        for match in DOTTED.finditer(text):
            name = match.group(1)
            if name.rsplit(".", 1)[-1] not in NOT_CODE and not resolves(name):
                missing.append(f"{path.relative_to(ROOT)}: {name}")
        for match in PATH.finditer(text):
            file = match.group(1)
            if not ((ROOT / file).exists() or (path.parent / file).exists()):
                missing.append(f"{path.relative_to(ROOT)}: {file}")
    assert not missing, "names of code that do not exist:\n" + "\n".join(missing)


def test_the_name_checker_tells_real_names_from_stale_ones() -> None:
    assert resolves("serving.dataplane.PARSE_INLINE_BYTES")
    assert resolves("edge.pipeline.EdgeService.infer")
    assert not resolves("serving.app")  # a module that moved
    assert not resolves("edge.pipeline.EdgeService.gone")
    assert resolves("tiered.request_id")  # a span attribute, not code
