"""The house rules the code keeps: private Ray/torch names in one adapter module, metrics.csv in one
module, nothing that points outside the project, and functions short enough to read in one go."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "lmtune"
ADAPTER = PACKAGE / "private_apis.py"
MODULES = sorted(PACKAGE.rglob("*.py"))


def _trees() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(), filename=str(path)) for path in MODULES}


def _own_private_names(trees: dict[Path, ast.Module]) -> set[str]:
    """Underscore names lmtune itself defines: its functions and classes, and attributes it assigns."""
    names = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return {n for n in names if n.startswith("_")}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_private_ray_and_torch_names_appear_in_the_adapter_module_only():
    trees = _trees()
    own = _own_private_names(trees)
    found = []
    for path, tree in trees.items():
        if path == ADAPTER:
            continue
        for node in ast.walk(tree):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("ray", "torch"):
                if any(_is_private(part) for part in node.module.split(".")):
                    found.append(f"{where}: from {node.module} import ...")
                found += [f"{where}: import {a.name}" for a in node.names if _is_private(a.name)]
            elif isinstance(node, ast.Import):
                found += [f"{where}: import {a.name}" for a in node.names
                          if a.name.split(".")[0] in ("ray", "torch") and any(map(_is_private, a.name.split(".")))]
            elif isinstance(node, ast.Attribute) and _is_private(node.attr) and node.attr not in own:
                found.append(f"{where}: .{node.attr}")
    assert not found, found


def test_the_adapter_module_says_why_for_each_private_name():
    tree = ast.parse(ADAPTER.read_text())
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            doc = " ".join((ast.get_docstring(node) or "").split())
            if "Why private" in doc:
                assert "Public API to move to" in doc, node.name


def test_metrics_csv_is_opened_by_the_metrics_module_only():
    opens = ("open", "read_csv", "read_text", "write_text", "DictReader", "DictWriter", "atomic_write_text")
    names, opened = set(), set()
    for path, tree in _trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value == "metrics.csv":
                names.add(path.relative_to(REPO).as_posix())
            if isinstance(node, ast.Call):
                func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                code = ast.unparse(node)
                if func in opens and ("METRICS_FILE" in code or "metrics.csv" in code):
                    opened.add(path.relative_to(REPO).as_posix())
    assert names == {"lmtune/training/metrics.py"}, names
    assert opened <= {"lmtune/training/metrics.py"}, opened


def test_nothing_the_user_gets_points_outside_the_project():
    texts = {p: p.read_text() for p in [*MODULES, REPO / "README.md", *sorted((REPO / "search_spaces").glob("*"))]}
    pattern = re.compile(r"REFERENCE\.md|\.\./shared|the seeds'")
    leaks = [str(p.relative_to(REPO)) for p, text in texts.items() if pattern.search(text)]
    assert not leaks, leaks


def test_every_function_is_shorter_than_100_lines():
    long = [f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, tree in _trees().items() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 99]
    assert not long, long
