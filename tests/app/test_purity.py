"""Architecture rules checked on the source (the AST of every module, no import executed).

* The pure packages (``models``, ``elicitation``, ``gnn``) never import the web /
  database / settings stack.
* No import cycle among the production packages ``app models elicitation gnn
  inference_server``, counting every import: at module level, inside functions, under
  ``if TYPE_CHECKING``. ``from pkg import name`` is an import of ``pkg.name`` when that is
  a module, else of ``pkg``; relative imports are resolved.
* Imports run one way: no module under ``app/services`` imports ``app.routes`` or
  ``app.commands``; only the CLI (``app.cli``, ``app.commands.*``) imports ``app.cli`` or
  ``app.commands``.
* An import inside a function says why it is there: a comment on its line or the line
  above (one comment may head a block of imports, blank lines between them allowed). It is kept only for a
  heavy optional package, e.g. torch loaded by a CLI handler so that ``priorly --help``
  stays fast.
* The app never creates tables outside Alembic.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PURE_PACKAGES = ("models", "elicitation", "gnn")
PRODUCTION_PACKAGES = ("app", "models", "elicitation", "gnn", "inference_server")
FORBIDDEN = ("fastapi", "starlette", "sqlmodel", "sqlalchemy", "jinja2", "pydantic_settings", "app")
CLI_MODULES = ("app.cli", "app.commands")


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def forbidden_imports(root: Path) -> list[str]:
    """``path:line: module`` for every forbidden import under ``root``."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for lineno, module in _imports(tree):
            top = module.split(".")[0]
            if top in FORBIDDEN:
                bad.append(f"{path.relative_to(REPO_ROOT)}:{lineno}: {module}")
    return bad


# ----- the module graph --------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``path:line``; ``inner``: inside a function."""

    source: str
    target: str
    path: str
    line: int
    inner: bool


@dataclass(frozen=True)
class InnerImport:
    """An import statement inside a function, and whether a comment explains it."""

    path: str
    line: int
    text: str
    explained: bool


def _modules(root: Path, packages: tuple[str, ...]) -> dict[str, tuple[Path, bool]]:
    """``dotted name -> (file, is a package __init__)`` for every module of ``packages``."""
    found: dict[str, tuple[Path, bool]] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            found[".".join(parts)] = (path, is_package)
    return found


def _targets(
    module: str,
    is_package: bool,
    node: ast.Import | ast.ImportFrom,
    modules: dict[str, tuple[Path, bool]],
) -> list[str]:
    """The dotted names an import statement of ``module`` imports: ``from pkg import x``
    imports the module ``pkg.x`` when there is one, else (a name defined in) ``pkg``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        parent = ".".join([*base, node.module] if node.module else base)
    else:
        parent = node.module or ""
    return [
        f"{parent}.{alias.name}" if f"{parent}.{alias.name}" in modules else parent
        for alias in node.names
    ]


def _owner(name: str, modules: dict[str, tuple[Path, bool]]) -> str | None:
    """The longest known module that ``name`` is or lies in (``None`` outside)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _is_comment(line: str) -> bool:
    return line.strip().startswith("#")


def import_graph(
    root: Path, packages: tuple[str, ...] = PRODUCTION_PACKAGES
) -> tuple[list[Edge], list[InnerImport]]:
    """Every import edge between modules of ``packages`` and every import inside a
    function (explained or not)."""
    modules = _modules(root, packages)
    edges: list[Edge] = []
    inner: list[InnerImport] = []
    for module, (path, is_package) in modules.items():
        source = path.read_text(encoding="utf-8")
        lines = ["", *source.splitlines()]  # lines[n] is line n
        rel = str(path.relative_to(root))
        explained_ends: set[int] = set()  # last lines of explained inner imports
        found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []
        todo: list[tuple[ast.AST, bool]] = [(ast.parse(source, filename=rel), False)]
        while todo:
            node, in_function = todo.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.Import | ast.ImportFrom):
                    found.append((child, in_function))
                is_function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                todo.append((child, in_function or is_function))
        for node, in_function in sorted(found, key=lambda f: f[0].lineno):
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                continue
            for target in _targets(module, is_package, node, modules):
                owner = _owner(target, modules)
                if owner is not None and owner != module:
                    edges.append(Edge(module, owner, rel, node.lineno, in_function))
            if in_function:
                start, end = node.lineno, node.end_lineno or node.lineno
                previous = start - 1  # the last non-blank line before the statement
                while previous > 0 and not lines[previous].strip():
                    previous -= 1
                ok = (
                    "#" in "".join(lines[start : end + 1])
                    or _is_comment(lines[start - 1])
                    or previous in explained_ends
                )
                if ok:
                    explained_ends.add(end)
                inner.append(InnerImport(rel, start, lines[start].strip(), ok))
    return edges, inner


def import_cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:  # recursion depth <= number of modules (a few hundred)
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(components)


def _in(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


@pytest.fixture(scope="module")
def graph() -> tuple[list[Edge], list[InnerImport]]:
    return import_graph(REPO_ROOT)


# ----- the rules ---------------------------------------------------------------------------


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_pure_package_imports(package: str) -> None:
    assert forbidden_imports(REPO_ROOT / package) == []


def test_no_import_cycles(graph: tuple[list[Edge], list[InnerImport]]) -> None:
    edges, _ = graph
    cycles = import_cycles(edges)
    within = [
        f"{e.path}:{e.line}: {e.source} -> {e.target}"
        for cycle in cycles
        for e in edges
        if e.source in cycle and e.target in cycle
    ]
    assert cycles == [], "\n".join(within)


def test_services_import_no_routes_or_commands(
    graph: tuple[list[Edge], list[InnerImport]],
) -> None:
    edges, _ = graph
    bad = [
        f"{e.path}:{e.line}: {e.target}"
        for e in edges
        if _in(e.source, ("app.services",)) and _in(e.target, ("app.routes", "app.commands"))
    ]
    assert bad == []


def test_only_the_cli_imports_the_cli(graph: tuple[list[Edge], list[InnerImport]]) -> None:
    edges, _ = graph
    bad = [
        f"{e.path}:{e.line}: {e.target}"
        for e in edges
        if _in(e.target, CLI_MODULES) and not _in(e.source, CLI_MODULES)
    ]
    assert bad == []


def test_imports_inside_functions_are_explained(
    graph: tuple[list[Edge], list[InnerImport]],
) -> None:
    _, inner = graph
    bad = [f"{i.path}:{i.line}: {i.text}" for i in inner if not i.explained]
    assert bad == [], "\n".join(bad)


def test_the_checkers_find_violations(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import fastapi\nfrom sqlalchemy.orm import Session\n")
    (tmp_path / "b.py").write_text(
        "def f():\n    from app.tables import Study\n    import jinja2\n"
    )
    (tmp_path / "c.py").write_text("import numpy\nfrom . import app\nimport application\n")
    global REPO_ROOT
    saved, REPO_ROOT = REPO_ROOT, tmp_path
    try:
        assert forbidden_imports(tmp_path) == [
            "a.py:1: fastapi",
            "a.py:2: sqlalchemy.orm",
            "b.py:2: app.tables",
            "b.py:3: jinja2",
        ]
    finally:
        REPO_ROOT = saved

    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from p.sub import b\n")
    (pkg / "sub" / "b.py").write_text(
        "def f():\n"
        "    # heavy: loaded when called\n"
        "    import json\n"
        "\n"
        "    from .. import c\n"
        "\n"
        "def g():\n"
        "    import os\n"
        "    x = 1  # a comment on another statement explains nothing\n"
        "    import sys\n"
    )
    (pkg / "c.py").write_text("from .a import *\n")
    (pkg / "d.py").write_text("from p import a\n")
    edges, inner = import_graph(tmp_path, ("p",))
    assert {(e.source, e.target, e.inner) for e in edges} == {
        ("p.a", "p.sub.b", False),
        ("p.sub.b", "p.c", True),
        ("p.c", "p.a", False),
        ("p.d", "p.a", False),
    }
    assert import_cycles(edges) == [["p.a", "p.c", "p.sub.b"]]
    assert [(i.line, i.explained) for i in inner] == [(3, True), (5, True), (8, False), (10, False)]


def test_app_never_calls_create_all() -> None:
    calls = []
    for path in sorted((REPO_ROOT / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "create_all":
                calls.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert calls == []


def test_the_web_app_loads_without_torch_geometric() -> None:
    """torch_geometric takes seconds to import (it loads transformers and torch._dynamo):
    the server and the job worker load it only for GNN work."""
    code = "import sys, app.main, app.jobs.tasks; print('torch_geometric' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
