"""Architecture rules checked on the source: the pure packages never import the web /
database / settings stack, and the app never creates tables outside Alembic."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PURE_PACKAGES = ("models", "elicitation", "gnn")
FORBIDDEN = ("fastapi", "starlette", "sqlmodel", "sqlalchemy", "jinja2", "pydantic_settings", "app")


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


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_pure_package_imports(package: str) -> None:
    assert forbidden_imports(REPO_ROOT / package) == []


def test_the_checker_finds_violations(tmp_path: Path) -> None:
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


def test_app_never_calls_create_all() -> None:
    calls = []
    for path in sorted((REPO_ROOT / "app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "create_all":
                calls.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert calls == []
