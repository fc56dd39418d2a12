"""How many lmtune functions the horizon summary calls, and how often its call stack crosses between lmtune.report
and lmtune.sweep: a profile of one summary of a horizon sweep (default: the golden quick_horizon fixture).

    python scripts/call_walk.py [SWEEP_DIR] [--list]
    PYTHONPATH=/tmp/lmtune-old python scripts/call_walk.py   # the same walk on another checkout of lmtune

Reading the sweep folder happens before the walk; the walk is the summary alone: lmtune.report.writer's
horizon_sweep_summary where a checkout has it (the report before issue 31), else the horizon report section's
summarize (lmtune.report.sections). Counted, on every call of an lmtune function (comprehensions, generator
expressions and lambdas are part of the function they are written in, and a generator resumed is not called again):
- calls: every call; functions: the distinct functions called (module and qualified name);
- crossings: calls from a function of lmtune.report to one of lmtune.sweep or back (the caller is the nearest
  lmtune function up the stack); crossing edges: the distinct (caller, callee) pairs among them.
"""

from __future__ import annotations

import inspect
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SWEEP = ROOT / "tests" / "golden" / "quick_horizon"


def _group(module: str) -> str | None:
    for group in ("lmtune.report", "lmtune.sweep"):
        if module == group or module.startswith(group + "."):
            return group
    return "lmtune" if module.startswith("lmtune") else None


def _function(frame) -> tuple[str, str] | None:
    """(module, qualified name) of an lmtune function's frame; None for others and for <listcomp>, <lambda>, ..."""
    module = frame.f_globals.get("__name__", "")
    name = frame.f_code.co_qualname
    if _group(module) is None or frame.f_code.co_name.startswith("<"):
        return None
    return module, name


class Walk:
    def __init__(self) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()
        self.crossings: Counter[tuple[tuple[str, str], tuple[str, str]]] = Counter()
        self._generators: set = set()  # generator frames already entered (a resumption is not a call)

    def __call__(self, frame, event, arg) -> None:
        if event != "call":
            return
        callee = _function(frame)
        if callee is None:
            return
        if frame.f_code.co_flags & 0x20:  # CO_GENERATOR
            if frame in self._generators:
                return
            self._generators.add(frame)
        self.calls[callee] += 1
        caller_frame = frame.f_back
        while caller_frame is not None and _function(caller_frame) is None:
            caller_frame = caller_frame.f_back
        if caller_frame is None:
            return
        caller = _function(caller_frame)
        groups = {_group(caller[0]), _group(callee[0])}
        if groups == {"lmtune.report", "lmtune.sweep"}:
            self.crossings[(caller, callee)] += 1


def kind(function: tuple[str, str]) -> str:
    """"construction" (a dataclass's generated __init__), "property read", or "call"."""
    module, name = function
    if name.endswith("<locals>.__init__"):
        return "construction"
    owner, _, attribute = name.rpartition(".")
    cls = sys.modules.get(module)
    for part in owner.split(".") if owner else []:
        cls = getattr(cls, part, None)
    if owner and isinstance(inspect.getattr_static(cls, attribute, None), property):
        return "property read"
    return "call"


def horizon_summary_call(sweep_dir: Path):
    """The summary to walk, with its inputs read beforehand: (a function of no arguments, which API)."""
    from lmtune.report import writer
    from lmtune.report.reader import load_sweep

    record, trials = load_sweep(sweep_dir)
    if hasattr(writer, "horizon_sweep_summary"):  # the report before issue 31
        settings = writer.horizon_settings(getattr(record, "plan", None) or record.space)
        return (lambda: writer.horizon_sweep_summary(record, trials, settings, None)), "writer.horizon_sweep_summary"
    from lmtune.report.reader import load_range_test
    from lmtune.findings.part import SweepInputs
    from lmtune.report.sections.lookup import search_of, section_for
    from lmtune.report.sweep_facts import sweep_budget, vocab_size

    range_test = load_range_test(sweep_dir)
    inputs = SweepInputs(record, trials, sweep_dir, None, sweep_budget(record, trials), vocab_size(record),
                         range_test.tokens if range_test is not None else None)
    section = section_for(search_of(record))
    return (lambda: section.summarize(inputs)), f"{type(section).__name__}.summarize"


def main(argv: list[str]) -> None:
    flags = [a for a in argv if a.startswith("--")]
    argv = [a for a in argv if not a.startswith("--")]
    sweep_dir = Path(argv[0]) if argv else DEFAULT_SWEEP
    summarize, entry = horizon_summary_call(sweep_dir)
    summarize()  # once before the walk: first-call imports and caches are not the summary's calls
    walk = Walk()
    sys.setprofile(walk)
    try:
        summarize()
    finally:
        sys.setprofile(None)
    by_group = Counter(_group(module) for module, _ in walk.calls)
    print(f"entry: {entry} ({sweep_dir.name})")
    print(f"lmtune functions called: {len(walk.calls)} distinct ({sum(walk.calls.values())} calls): "
          + ", ".join(f"{n} in {g}" for g, n in sorted(by_group.items())))
    plain = [f for f in walk.calls if kind(f) == "call"]
    print(f"  of which {len(plain)} functions and methods, the rest property reads and dataclass constructions")
    kinds = Counter(kind(callee) for _, callee in walk.crossings)
    print(f"report <-> sweep crossings: {len(walk.crossings)} distinct caller->callee edges "
          f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))}), {sum(walk.crossings.values())} calls")
    for (caller, callee), n in sorted(walk.crossings.items(), key=lambda item: (item[0][0], item[0][1])):
        print(f"  {caller[0]}.{caller[1]} -> {callee[0]}.{callee[1]}: {n} ({kind(callee)})")
    if "--list" in flags:
        print("functions called:")
        for (module, name), n in sorted(walk.calls.items()):
            print(f"  {module}.{name}: {n}")


if __name__ == "__main__":
    main(sys.argv[1:])
