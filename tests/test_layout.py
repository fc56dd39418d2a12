"""The house rules the code keeps: private Ray/torch names in one adapter module, metrics.csv in one
module, nothing that points outside the project, and functions short enough to read in one go."""

from __future__ import annotations

import ast
import functools
import json
import re
from pathlib import Path

import pytest
from conftest import DOC_FILES

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


@pytest.mark.slow
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
    texts = {p: p.read_text() for p in [*MODULES, *DOC_FILES, *sorted((REPO / "search_spaces").glob("*.yaml"))]}
    pattern = re.compile(r"REFERENCE\.md|\.\./shared|the seeds'")
    leaks = [str(p.relative_to(REPO)) for p, text in texts.items() if pattern.search(text)]
    assert not leaks, leaks


def test_every_function_is_shorter_than_100_lines():
    long = [f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, tree in _trees().items() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 99]
    assert not long, long


# A module a reader takes in at one sitting; beyond it, one concern has usually become two. Below the least, a module
# is a fragment of its neighbour's concern (a package's __init__ may be short).
MAX_MODULE_LINES, MIN_MODULE_LINES = 400, 40
# The layers, lowest first: a module imports only from its own layer or lower ones (the top-level modules, the
# commands, sit above all of them; errors, files and private_apis below). usercode/ (the user's code behind the
# training spec's protocols) sits on training and fused; findings/ (a sweep's trials as the report reads them, their
# summary, and what a search's part of the report is given) on the analysis; a search's folder, its report part
# included, on the findings; tools/ (what the diagnose and bench commands measure) on the sweep's records.
LAYERS = ("errors", "files", "private_apis", "data", "training", "fused", "usercode", "analysis", "findings",
          "searches", "sweep", "tools", "report")
# A search's part of the report: its folder's report modules (lmtune.searches.NAME.report*).
SEARCH_REPORT_PREFIX = "report"


def layer_of(module: str) -> int | None:
    """The layer of an lmtune module, by the package it lives in (None: a top-level module, a command)."""
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in LAYERS:
        return None
    return LAYERS.index(parts[1])


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


def _registered_report_part(tree: ast.Module, module: str) -> set[str]:
    """A search folder's own report module, where its ``__init__`` (the strategy, lmtune.searches.NAME) imports it
    inside a function, the report part lmtune.searches.STRATEGIES registers: imported when the report asks, never by
    a sweep (test_a_sweep_loads_no_search_report_part_nor_figure_code), so no cycle with the part, which imports the
    strategy it reports on."""
    if not re.fullmatch(r"lmtune\.searches\.\w+", module):
        return set()
    own = f"{module}.{SEARCH_REPORT_PREFIX}"
    return {name for function in tree.body if isinstance(function, ast.FunctionDef)
            for node in ast.walk(function) if isinstance(node, ast.ImportFrom) and node.module == own
            for name in (own, *(f"{own}.{alias.name}" for alias in node.names))}


@functools.cache  # parsed once per process: several tests read it, none changes it
def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in MODULES}
    graph = {}
    for name, path in modules.items():
        tree, package = ast.parse(path.read_text()), path.name == "__init__.py"
        outside_functions = ast.Module([n for n in tree.body if not isinstance(n, ast.FunctionDef)], [])
        lazy = _registered_report_part(tree, name) - _imports(outside_functions, name, package)
        targets = _imports(tree, name, package) - lazy
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


def test_no_module_but_a_packages_init_is_shorter_than_40_lines():
    short = [f"{p.relative_to(REPO)} ({n} lines)" for p in MODULES
             if p.name not in ("__init__.py", "__main__.py")  # (a package's entry points: a few lines by nature)
             and (n := len(p.read_text().splitlines())) < MIN_MODULE_LINES]
    assert not short, short


def test_no_module_imports_one_that_imports_it_back_not_even_for_typing():
    assert not import_cycles(import_graph())


def test_the_cycle_finder_finds_a_cycle_of_three():
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_layer_imports_a_layer_above_it():
    upward = [f"{m} imports {t}" for m, targets in import_graph().items() for t in sorted(targets)
              if layer_of(m) is not None and layer_of(t) is not None and layer_of(t) > layer_of(m)]
    assert not upward, upward


def test_no_two_packages_import_each_other():
    package = {m: m.split(".")[1] for m in import_graph() if len(m.split(".")) > 1}
    edges = {(package[m], package[t]) for m, targets in import_graph().items() for t in targets
             if m in package and t in package and package[m] != package[t]}
    assert edges, "the graph holds no import between packages"
    assert not sorted(tuple(sorted(pair)) for pair in edges if pair[::-1] in edges)


def test_a_searchs_folder_report_part_included_imports_nothing_of_the_report_nor_of_the_sweep():
    """A search's part of the report is given all it reads (lmtune.findings.part.SweepInputs): it lives, and is
    layered, where its folder is."""
    parts = [m for m in import_graph() if m.startswith("lmtune.searches.") and m.split(".")[-1].startswith("report")]
    assert len(parts) >= 3, parts
    assert not [f"{m} imports {t}" for m, targets in import_graph().items() if m.startswith("lmtune.searches.")
                for t in targets if t.startswith(("lmtune.report", "lmtune.sweep", "lmtune.tools"))]


def test_every_package_and_every_top_level_module_has_a_layer_or_is_a_command():
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")} - {"search_spaces"}  # (data, no code)
    modules = {p.stem for p in PACKAGE.glob("*.py")}
    assert packages and packages <= set(LAYERS), sorted(packages - set(LAYERS))
    assert sorted(modules & set(LAYERS)) == ["errors", "files", "private_apis"]


def loaded_by_importing(modules: list[str], packages: tuple[str, ...] = (), prefixes: tuple[str, ...] = (),
                        names: tuple[str, ...] = ()) -> list[str]:
    """The modules a fresh interpreter has loaded after importing ``modules``, of those asked about: any of the
    top-level ``packages``, any name starting with one of ``prefixes``, any of ``names``."""
    import subprocess
    import sys

    code = (f"import json, sys, {', '.join(modules)}\n"
            f"print(json.dumps([n for n in sorted(sys.modules) if n.split('.')[0] in {packages!r} "
            f"or n.startswith({prefixes!r}) or n in {names!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def modules_of(package: str) -> list[str]:
    return sorted(_module_name(p) for p in MODULES if _module_name(p).startswith(package))


@pytest.mark.slow
def test_the_training_path_imports_nothing_of_the_sweep_or_the_report_nor_their_packages():
    """lmtune train runs where only torch, numpy and pyyaml are installed (a bare GPU box): importing it loads no
    Ray, pandas, matplotlib, optuna, tensorboardX or tokenizers, and no module of lmtune.sweep or lmtune.report."""
    assert loaded_by_importing(["lmtune.train", "lmtune.sample"], packages=(
        "ray", "pandas", "matplotlib", "optuna", "tensorboardX", "tokenizers", "scipy", "pyarrow"),
        prefixes=("lmtune.sweep", "lmtune.report")) == []


@pytest.mark.slow
def test_what_the_gpu_check_runs_on_a_bare_box_imports_only_torch_numpy_and_pyyaml():
    """The GPU check's steps on a box with only torch, numpy and pyyaml (diagnose, bench, lr_find) load none of the
    packages such a box lacks, scipy included (the analysis imports it where a distribution is asked for)."""
    assert loaded_by_importing(["lmtune.gpu_check", "lmtune.diagnose", "lmtune.bench", "lmtune.lr_find"], packages=(
        "ray", "pandas", "matplotlib", "optuna", "tensorboardX", "tokenizers", "scipy", "pyarrow")) == []


def test_the_analysis_imports_nothing_of_the_sweep_or_the_report_nor_ray_nor_files():
    """lmtune.analysis sits below both the sweep and the report: it takes typed runs and returns typed conclusions,
    so importing all of it loads no Ray, pandas or matplotlib and no module of lmtune.sweep or lmtune.report."""
    assert loaded_by_importing(modules_of("lmtune.analysis"), packages=("ray", "pandas", "matplotlib", "pyarrow"),
                               prefixes=("lmtune.sweep", "lmtune.report")) == []


def test_the_analysis_opens_no_file():
    """Runs come in typed and conclusions go out typed: no module of lmtune.analysis opens, reads or writes a file."""
    found = []
    for path in (p for p in MODULES if p.is_relative_to(PACKAGE / "analysis")):
        for node in ast.walk(ast.parse(path.read_text())):
            name = (node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
                    ) if isinstance(node, ast.Call) else None
            if name in ("open", "read_text", "write_text", "read_bytes", "write_bytes", "read_json_object"):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {name}")
    assert not found, found


def _defined_names(path: Path) -> set[str]:
    """The names a module defines or imports at its top level (what ``lmtune.mod.NAME`` may point at)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


PACKAGE_DATA = {"lmtune.search_spaces"}  # (YAML files and an __init__.py; search_spaces/ links to it)


def _named_path_is_real(name: str) -> bool:
    """``lmtune.a.b[.NAME[.attr]]`` or ``lmtune/a/b.py``: the longest module prefix exists, and the first name
    after it is one that module defines (a package's: one of its modules, or what its __init__ defines)."""
    if name in PACKAGE_DATA or any(part.isupper() for part in re.split(r"[./]", name)):  # (NAME: a placeholder)
        return True
    if "/" in name:
        return (REPO / name).exists()
    parts = name.split(".")
    if len(parts) == 2 and parts[1] in __import__("lmtune").__all__:  # lmtune.Sweep: imported on first use
        return True
    for cut in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
        if not module.exists():
            continue
        rest = parts[cut:]
        if not rest:
            return True
        return rest[0] in _defined_names(module) or (module.name == "__init__.py" and (base / rest[0]).exists())
    return False


def test_every_module_path_a_docstring_comment_or_the_readme_names_exists():
    """A moved or renamed module leaves no reader following a dead path: every ``lmtune.x.y`` and ``lmtune/x/y.py``
    the code's docstrings and comments, the README and benchmarks/README.md name is real."""
    pattern = re.compile(r"(?<![.\w/-])lmtune(?:\.[A-Za-z_]\w*)+|(?<![.\w/-])lmtune(?:/[A-Za-z_]\w*)+(?:\.py|/)")
    sources = [*MODULES, *DOC_FILES, REPO / "benchmarks" / "README.md"]
    dead = sorted({f"{path.relative_to(REPO)}: {name}" for path in sources
                   for name in pattern.findall(path.read_text())
                   if not _named_path_is_real(name.rstrip("/."))})
    assert not dead, dead


def _layout_rows() -> list[tuple[list[str], str]]:
    """The layout table of docs/contributing.md: each row's first-column paths (under lmtune/) and its whole text."""
    text = (REPO / "docs" / "contributing.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    return [(re.findall(r"`([^`]+)`", row.split("|")[1]), row) for row in rows]


def test_every_path_the_layout_table_names_exists():
    missing = [path for paths, _ in _layout_rows() for path in paths if not (PACKAGE / path).exists()]
    assert not missing, missing


def test_the_layout_table_lists_every_module():
    """A module is listed by its path, or by its name (or its path below the folder) in its folder's row."""
    rows = _layout_rows()
    listed = {path for paths, _ in rows for path in paths}

    def is_listed(module: str) -> bool:
        if module in listed:
            return True
        return any(module.startswith(folder) and f"`{module[len(folder):]}`" in row
                   for paths, row in rows for folder in paths if folder.endswith("/"))

    modules = [str(p.relative_to(PACKAGE)) for p in MODULES if p.name != "__init__.py"]
    unlisted = [m for m in modules if not is_listed(m)]
    assert not unlisted, unlisted


@pytest.mark.slow
def test_the_report_never_imports_the_sweeps_runtime():
    """The report reads a sweep's records (sweep.json, the ledger, trial.json, the searches' states) and the
    searches' Ray-free parts; importing all of it loads no Ray and none of the modules that run a sweep."""
    runtime = ("trainable", "experiment", "runner", "session", "stopping", "asha_scheduler", "reporting",
               "fused_trial", "placement", "preflight", "storage", "hooks", "searcher")
    search_parts = [m for m in modules_of("lmtune.searches") if m.split(".")[-1].startswith(SEARCH_REPORT_PREFIX)]
    assert loaded_by_importing(modules_of("lmtune.report") + search_parts, packages=("ray", "optuna"),
                               names=tuple(f"lmtune.sweep.{r}" for r in runtime)) == []


# What the report may import of the sweep: its records (sweep.json's plan and reader, the ledger and trial folders).
SWEEP_RECORDS = {"lmtune.sweep.record", "lmtune.sweep.sweep_file", "lmtune.sweep.plan"}


def test_the_report_imports_of_the_sweep_only_its_records():
    """The report imports, of lmtune.sweep, only the record readers (not even for typing); what a search decides
    comes from the search's own folder (whose report part imports nothing of the sweep's: it is given what it reads)."""
    report_layer = LAYERS.index("report")
    found = sorted(f"{m} imports {t}" for m, targets in import_graph().items() if layer_of(m) == report_layer
                   for t in targets if t.startswith("lmtune.sweep") and t not in SWEEP_RECORDS)
    assert not found, found


def test_every_list_of_searches_in_the_code_names_them_all():
    """A docstring or comment that lists the searches in parentheses — all of them, or those that decide as they
    go — names every registered one (a new search is not left out of the house's own descriptions)."""
    from lmtune.searches import STRATEGIES
    from lmtune.searches.base import DecidingDefaults

    every = set(STRATEGIES)
    deciding = {name for name, entry in STRATEGIES.items() if issubclass(entry.strategy, DecidingDefaults)}
    word = "|".join(sorted(every))
    pattern = re.compile(rf"\((?:[^()]*: )?((?:{word})(?:, (?:{word}))+)\)")
    short = []
    for path in MODULES:
        for listed in pattern.findall(path.read_text()):
            names = set(listed.split(", "))
            wanted = deciding if names <= deciding else every
            if names != wanted:
                short.append(f"{path.relative_to(REPO)}: ({listed}) lacks {', '.join(sorted(wanted - names))}")
    assert not short, short


def test_a_searchs_report_part_is_the_report_module_of_its_own_folder():
    """Each registered search with a part of its own keeps it in its folder (lmtune.searches.NAME.report, as
    SECTION) and registers it; every folder with a report module registers its part; the report lists none."""
    from lmtune.report.sections import section_for
    from lmtune.searches import STRATEGIES

    with_part = {name for name, entry in STRATEGIES.items() if entry.report is not None}
    with_module = {name for name, entry in STRATEGIES.items()
                   if (PACKAGE.parent / entry.strategy.__module__.replace(".", "/") / "report.py").exists()}
    assert with_part == with_module == {"horizon", "width", "compare"}
    for name in with_part:
        section = section_for(name)
        assert all(callable(getattr(section, part)) for part in ("summarize", "markdown", "figures", "headline"))
        assert type(section).__module__ == f"{STRATEGIES[name].strategy.__module__}.report"


def test_a_search_and_its_report_part_are_found_by_no_hook_or_module_name():
    """The registry names each search's parts: no ``__init_subclass__`` fills a strategy in, and nothing of the
    searches or the report imports a module by its name."""
    found = [f"{p.relative_to(REPO)}: {word}" for p in MODULES
             if p.is_relative_to(PACKAGE / "searches") or p.is_relative_to(PACKAGE / "report")
             for word in ("__init_subclass__", "importlib", "import_module") if word in p.read_text()]
    assert not found, found


@pytest.mark.slow
def test_a_sweep_loads_no_search_report_part_nor_figure_code():
    """The registry names each search's report part behind a function: running a sweep (its command, the runner,
    the trainable, the Tune adapter) imports none of them, nor matplotlib."""
    parts = loaded_by_importing(["lmtune.run", "lmtune.sweep.runner", "lmtune.sweep.trainable",
                                 "lmtune.sweep.searcher"], packages=("matplotlib",), prefixes=("lmtune.report",))
    reports = [m for m in loaded_by_importing(["lmtune.run", "lmtune.sweep.runner"], prefixes=("lmtune.searches",))
               if m.split(".")[-1].startswith(SEARCH_REPORT_PREFIX)]
    assert parts == reports == []


def test_no_search_class_subclasses_another_searchs():
    """horizon and width are siblings on the engine of lmtune.searches.axis: no registered search's decisions
    class is (or derives from) another registered search's."""
    from lmtune.searches import STRATEGIES

    classes = {name: e.strategy.search_class for name, e in STRATEGIES.items()
               if getattr(e.strategy, "search_class", None)}
    assert {"horizon", "width", "edge"} <= set(classes)
    derived = [(a, b) for a, ca in classes.items() for b, cb in classes.items() if a != b and issubclass(ca, cb)]
    assert not derived, derived


def test_a_deciding_strategy_states_what_its_decisions_are():
    """Each strategy that decides as it goes states in its own body (no hook copies it) its name, settings class,
    whole-budget rule and progress columns: its decisions' own, and its section among the keys it reads."""
    from lmtune.searches import STRATEGIES

    deciding = {name: e.strategy for name, e in STRATEGIES.items() if getattr(e.strategy, "search_class", None)}
    assert {"edge", "horizon", "width", "compare"} <= set(deciding)
    for name, strategy in deciding.items():
        search = strategy.search_class
        assert (strategy.name, strategy.settings_class) == (search.name, search.settings_class) == (
            name, strategy.settings_class), name
        assert (strategy.whole_budget_only, strategy.axis_columns) == (search.whole_budget_only, search.axis_columns)
        assert {strategy.section()[0], "params"} <= strategy.keys, name


# Folders of lmtune/searches/ that hold an engine several searches build on, not a registered search of their own.
ENGINE_FOLDERS = {"axis"}


def test_every_search_is_one_folder_of_lmtune_searches():
    """Every folder of lmtune/searches/ holds one registered search's strategy, but the named engine folders, which
    hold none."""
    from lmtune.searches import STRATEGIES

    folders = {p.name for p in (PACKAGE / "searches").iterdir() if (p / "__init__.py").exists()}
    assert ENGINE_FOLDERS <= folders
    assert {e.strategy.__module__ for e in STRATEGIES.values()} == {
        f"lmtune.searches.{f}" for f in folders - ENGINE_FOLDERS}
    assert all(e.strategy.name == name for name, e in STRATEGIES.items())
