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


# A module a reader takes in at one sitting; beyond it, one concern has usually become two.
MAX_MODULE_LINES = 400
# The layers, lowest first: a module imports only from its own layer or lower ones (the top-level modules, the
# commands, sit above all of them; errors, files and private_apis below).
LAYERS = ("errors", "files", "private_apis", "data", "training", "fused", "sweep", "report")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """Every lmtune module ``module`` imports anywhere: at the top, inside a function, or only for typing."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # a relative import, resolved against this module's package
                package = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join([*package, base] if base else package)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("lmtune")}


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in MODULES}
    graph = {}
    for name, path in modules.items():
        targets = _imports(ast.parse(path.read_text()), name, path.name == "__init__.py")
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of a module graph (each strongly connected set of more than one module, as a list)."""
    index, low, stack, on_stack, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return cycles


def test_no_module_is_longer_than_400_lines():
    lengths = {p: len(p.read_text().splitlines()) for p in MODULES}
    long = [f"{p.relative_to(REPO)} ({n} lines)" for p, n in lengths.items() if n > MAX_MODULE_LINES]
    assert not long, long


def test_no_module_imports_one_that_imports_it_back_not_even_for_typing():
    assert not import_cycles(import_graph())


def test_the_cycle_finder_finds_a_cycle_of_three():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_layer_imports_a_layer_above_it():
    def layer(module: str) -> int | None:
        part = module.split(".")[1] if "." in module else None
        return LAYERS.index(part) if part in LAYERS else None

    upward = [f"{m} imports {t}" for m, targets in import_graph().items() for t in sorted(targets)
              if layer(m) is not None and layer(t) is not None and layer(t) > layer(m)]
    assert not upward, upward


def test_the_training_path_imports_nothing_of_the_sweep_or_the_report_nor_their_packages():
    """lmtune train runs where only torch, numpy and pyyaml are installed (a bare GPU box): importing it loads no
    Ray, pandas, matplotlib, optuna, tensorboardX or tokenizers, and no module of lmtune.sweep or lmtune.report."""
    import subprocess
    import sys

    code = ("import sys, lmtune.train, lmtune.sample\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in "
            "('ray', 'pandas', 'matplotlib', 'optuna', 'tensorboardX', 'tokenizers', 'scipy', 'pyarrow') "
            "or n.startswith(('lmtune.sweep', 'lmtune.report'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout
