"""Rewrite the golden summaries from today's analyze (only when a change of what they say is intended).

    python tests/golden/regenerate.py               # every golden sweep
    python tests/golden/regenerate.py quick_horizon # only the ones named
"""

import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from test_golden_summary import GOLDEN, machine_free  # noqa: E402

from lmtune.report.writer import analyze  # noqa: E402

for name in sys.argv[1:] or GOLDEN:
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp) / name
        shutil.copytree(HERE / name, sweep)
        analyze(sweep, out_dir=Path(tmp) / "report")
        summary = json.loads((Path(tmp) / "report" / "summary.json").read_text())
    (HERE / f"{name}.summary.json").write_text(json.dumps(machine_free(summary, sweep), indent=1) + "\n")
    print(f"wrote {HERE / f'{name}.summary.json'}")
