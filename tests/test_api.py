"""lmtune from a Ray Tune user's own script (lmtune.api): the README's example, run as written."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import EXAMPLE, TINY_TRIAL, USER_MODELS, docs_text, run_python

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example(marker: str = "python-api-example") -> str:
    """The Python block after the <!-- MARKER --> marker of the docs (docs/python-api.md, docs/your-model.md)."""
    match = re.search(rf"<!-- {marker} -->\s*```python\n(.*?)```", docs_text(), re.S)
    assert match, f"the docs lost their Python example {marker}"
    return match.group(1)


def test_the_package_exports_the_api_without_importing_ray_up_front():
    proc = run_python("-c", "import sys, lmtune; print('ray' in sys.modules, sorted(lmtune.__all__))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "False"
    assert "Sweep" in proc.stdout and "trainable" in proc.stdout


@pytest.mark.parametrize(("model", "reuses"), [(None, True), (EXAMPLE, True),
                                               (f"{USER_MODELS / 'shared_rope.py'}:CachedRopeLM", False)])
def test_a_sweeps_trials_share_worker_processes_unless_the_users_model_builds_share_a_module(builtin_data, model,
                                                                                              reuses):
    from lmtune import Sweep

    space = {"search": "grid", "budget": "quick", "params": {"lr": [1e-3]}, "set": TINY_TRIAL}
    assert Sweep(space, data=builtin_data, model=model).reuse_actors is reuses


@pytest.mark.slow
def test_the_readmes_python_example_runs_and_tune_names_the_best_lr_the_report_does(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(readme_example())
    proc = run_python(str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tune_lr, report_lr = re.search(r"best lr (\S+) \(Tune\); (\S+) \(the report\)", proc.stdout).groups()
    assert tune_lr == report_lr
    sweep = tmp_path / "results" / "edge"
    for name in ("sweep.json", "decisions/trial_outcomes.json", "decisions/edge_search.json",
                 "report/summary.json", "report/lr_sweep_analysis.md"):
        assert (sweep / name).is_file(), name
    from lmtune.report.writer import summarize_sweep

    again = summarize_sweep(sweep).summary  # the CLI's reader reads what the example left
    assert f"{again.best_lr:.4g}" == report_lr
    assert again.status_counts.get("stopped_early", 0) >= 1  # ASHA cut the coarse grid


# (the documentation's example as written: the release tier; per push, the README's first example is the Python API's
# end-to-end test, and test_cs336_page.py's sweep the user's model's)
@pytest.mark.release
@pytest.mark.slow
def test_the_readmes_python_example_of_a_users_model_runs_and_its_report_names_the_model(tmp_path):
    shutil.copytree(README.parent / "examples", tmp_path / "examples")  # a folder holding examples/, as the README's
    script = tmp_path / "mine.py"
    script.write_text(readme_example("python-api-model-example"))
    proc = run_python(str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    model = str((tmp_path / "examples" / "cs336_model.py").resolve())
    assert re.search(rf"{re.escape(model)}:TransformerLM \(use_rope=True\): best lr \S+", proc.stdout), \
        proc.stdout[-2000:]
    summary = json.loads((tmp_path / "results" / "mine" / "report" / "summary.json").read_text())
    assert summary["model"]["user_model"] and len(summary["samples"]) == 2


def test_a_compare_sweeps_searcher_gives_a_batch_size_variant_its_steps_at_the_budgets_tokens(builtin_data):
    """The Tuner of the user's gets the plan's search, as lmtune run does: a batch-size variant's trials train the
    reference's tokens in their own steps."""
    from lmtune import Sweep

    sweep = Sweep("quick_batch", data=builtin_data)
    searcher = sweep.searcher()
    searcher.set_max_concurrency(6)
    orders = [searcher.suggest(f"t{k}") for k in range(3)]  # each variant's range test
    by_variant = {order["variant"]: order for order in orders}
    assert by_variant["batch_48"]["batch_size"] == 48 and by_variant["batch_48"]["steps"] == 54
    assert "steps" not in by_variant["batch_16"]
