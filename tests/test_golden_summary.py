"""summary.json is the report's public interface (README: users' scripts read it): restructuring the report's
code must leave its keys and values as they were on the same sweep records (tests/golden/README.md)."""

import json
import math
import shutil
from pathlib import Path

import pytest

from lmtune.report.writer import analyze

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
GOLDEN = ("quick_edge", "quick_horizon")
# Values that name the machine or the moment, not the sweep's results.
MACHINE_KEYS = ("sweep_dir", "best_trial_dir", "best_checkpoint", "generated")


def machine_free(summary: dict, sweep_dir: Path) -> dict:
    """The summary without the moment it was written, with paths relative to the sweep's folder."""
    kept = {k: v for k, v in summary.items() if k != "generated"}
    for key in ("sweep_dir", "best_trial_dir", "best_checkpoint"):
        if isinstance(kept.get(key), str):
            kept[key] = kept[key].replace(str(sweep_dir.resolve()), "<sweep>")
    return kept


def differences(got, want, where: str = "summary") -> list[str]:
    """Where two JSON values differ; floats equal to 7 significant digits: a sum taken in another order moves the
    12th, and an iterative fit's optimum (scipy.optimize.least_squares, the horizon surface) the 9th between scipy
    and numpy releases (a fresh environment of 2026-11-29 moved quick_horizon's β from 0.30745836218 to
    0.30745836037); a change of meaning moves far more."""
    if isinstance(want, dict) and isinstance(got, dict):
        found = [f"{where}: key {k!r} {'added' if k in got else 'missing'}" for k in sorted(set(got) ^ set(want))]
        return found + [d for k in sorted(set(got) & set(want)) for d in differences(got[k], want[k], f"{where}.{k}")]
    if isinstance(want, list) and isinstance(got, list):
        if len(got) != len(want):
            return [f"{where}: {len(got)} items, expected {len(want)}"]
        return [d for i, (g, w) in enumerate(zip(got, want, strict=True)) for d in differences(g, w, f"{where}[{i}]")]
    both_numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (got, want))
    if both_numbers and (isinstance(got, float) or isinstance(want, float)):
        return [] if math.isclose(got, want, rel_tol=1e-7, abs_tol=1e-300) else [f"{where}: {got!r} != {want!r}"]
    return [] if got == want and type(got) is type(want) else [f"{where}: {got!r} != {want!r}"]


@pytest.mark.slow
@pytest.mark.parametrize("name", GOLDEN)
def test_summary_json_of_a_shipped_search_keeps_every_key_and_value(name: str, tmp_path: Path) -> None:
    sweep = tmp_path / name
    shutil.copytree(GOLDEN_DIR / name, sweep)
    analyze(sweep, out_dir=tmp_path / "report")
    written = machine_free(json.loads((tmp_path / "report" / "summary.json").read_text()), sweep)
    expected = json.loads((GOLDEN_DIR / f"{name}.summary.json").read_text())
    assert not differences(written, expected), "\n".join(differences(written, expected)[:20])


def test_the_comparison_finds_a_changed_value_and_a_missing_key() -> None:
    want = {"best_lr": 0.0107, "ranking": [{"lr": 0.01, "mean": 1.5}], "spiked": []}
    got = {"best_lr": 0.0107, "ranking": [{"lr": 0.01, "mean": 1.6}]}
    assert differences(got, want) == ["summary: key 'spiked' missing", "summary.ranking[0].mean: 1.6 != 1.5"]
