"""Rewrite the golden summaries from today's analyze (only when a change of what they say is intended).

    python tests/golden/regenerate.py                        # shows what would move in every golden sweep
    python tests/golden/regenerate.py quick_horizon          # ... in the ones named
    python tests/golden/regenerate.py --accept [NAME ...]    # writes them

Without --accept nothing is written: each value that would change is printed (the same comparison the golden test
makes), so a regeneration is a decision taken with the differences in view, said in the commit and in README.md.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from test_golden_summary import GOLDEN, differences, machine_free  # noqa: E402

from lmtune.report.writer import analyze  # noqa: E402


def written_today(name: str) -> dict:
    """The summary today's analyze writes of golden sweep ``name``, machine-free."""
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp) / name
        shutil.copytree(HERE / name, sweep)
        analyze(sweep, out_dir=Path(tmp) / "report")
        return machine_free(json.loads((Path(tmp) / "report" / "summary.json").read_text()), sweep)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="golden sweeps (default all)")
    parser.add_argument("--accept", action="store_true", help="write the new summaries (default: only show them)")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(GOLDEN))
    if unknown:
        parser.error(f"no golden sweep {', '.join(unknown)}; choose from {', '.join(GOLDEN)}")
    moved = 0
    for name in args.names or GOLDEN:
        path = HERE / f"{name}.summary.json"
        new = written_today(name)
        found = differences(new, json.loads(path.read_text()))
        moved += bool(found)
        print(f"{name}: {len(found)} difference{'s' * (len(found) != 1)}" + "".join(f"\n  {d}" for d in found))
        if found and args.accept:
            path.write_text(json.dumps(new, indent=1) + "\n")
            print(f"wrote {path}")
    if moved and not args.accept:
        print("nothing written: run again with --accept to write them (and say what moved in tests/golden/README.md)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
