"""The compare search as a user runs it, on a user's own model (lmtune's example, CS336's TransformerLM): real Ray
Tune on a local cluster, real training of a tiny model in three variants (the reference; the model without any
position embedding, its own flag use_rope: false as `model_set:` passes it to the model's callable; and a batch four
times larger at the same tokens), each its own edge search under an ASHA of its own in one sweep, then the report:
the variants' table and both figures, and the batch sizes read together, the ablation left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import EXAMPLE, TINY_TRIAL, assert_real_picture, run_lmtune, run_space_and_analyze, trial_dirs

from lmtune.searches.state import read_search_state

pytestmark = pytest.mark.slow

# 32 steps of batch 8 (the reference and nope); the batch-32 variant trains the same tokens in 8 steps. The edge
# searches are cut to the bone: a short range test, a coarse grid 8x apart under ASHA (rungs at a quarter of the
# tokens and then every tripling) with no extension, an 8x bracket, one seed.
TINY_COMPARE = f"""\
description: a user's model compared with and without its own RoPE, and at a batch four times larger
search: compare
budget: quick
model: {EXAMPLE}
set: {json.dumps({**TINY_TRIAL, "steps": 32, "warmup_steps": 4, "eval_interval": 8, "log_interval": 4,
                         "checkpoint_interval": 32})}
scheduler: {{name: asha, grace_period: 0.25, reduction_factor: 3}}
variants:
  reference: {{}}
  nope: {{model_set: {{use_rope: false}}}}
  batch_32: {{batch_size: 32}}
edge: {{range_steps: 16, coarse_ratio: 8, max_extensions: 0, tolerance: 8, edge_seeds: 1, refine_points: 0, seeds: 1,
        seed_lrs: 1}}
"""


@pytest.fixture(scope="module")
def compare_sweep(builtin_data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_space_and_analyze(TINY_COMPARE, "compare", tmp_path_factory.mktemp("compare"), builtin_data,
                                 timeout=900)


def test_the_search_finishes_and_each_trial_trains_its_own_variant_with_its_own_model_arguments(compare_sweep):
    assert compare_sweep["run"].returncode == 0, compare_sweep["run"].stderr[-3000:]
    assert read_search_state(compare_sweep["dir"], "compare")["finished"]
    seen = set()
    for folder in trial_dirs(compare_sweep["dir"]).values():
        params = json.loads((folder / "trial.json").read_text())["params"]
        config = json.loads((folder / "config.json").read_text())
        variant = params["variant"]
        seen.add(variant)
        assert config["code"]["model"] == EXAMPLE
        assert config["code"]["model_args"] == ({"use_rope": False} if variant == "nope" else {})
        train = config["train"]
        assert (train["batch_size"], train["steps"]) == ((32, 8) if variant == "batch_32" else (8, 32))
    assert seen == {"reference", "nope", "batch_32"}


def test_each_variants_coarse_grid_is_judged_by_an_asha_of_its_own(compare_sweep):
    """Each variant's rung records hold that variant's trials only (one ASHA would cut a variant's LRs against
    another variant's losses), in a state file of its own beside the sweep's."""
    variant_of = {trial_id: json.loads((folder / "trial.json").read_text())["params"]["variant"]
                  for trial_id, folder in trial_dirs(compare_sweep["dir"]).items()}
    recorded = {}
    for state in sorted((compare_sweep["dir"] / "decisions").glob("asha_state.*.json")):
        brackets = json.loads(state.read_text())["brackets"]
        recorded[state.stem.split(".", 1)[1]] = {t for rung in brackets[0] for t in rung["recorded"]}
    assert set(recorded) == {"reference", "nope", "batch_32"}
    for variant, trials in recorded.items():
        assert trials and {variant_of[t] for t in trials} == {variant}, (variant, trials)


def test_the_report_compares_every_variant_with_the_reference_at_its_own_best_lr(compare_sweep):
    assert compare_sweep["analyze"].returncode == 0, compare_sweep["analyze"].stderr[-3000:]
    rows = {row["name"]: row for row in compare_sweep["summary"]["compare"]}
    assert list(rows) == ["reference", "nope", "batch_32"]
    reference_lr = rows["reference"]["best_lr"]
    for name in ("nope", "batch_32"):
        assert rows[name]["best_lr"] and rows[name]["difference"]["verdict"]
        assert rows[name]["at_reference"]["lr"] == pytest.approx(reference_lr)
    report = compare_sweep["dir"] / "report"
    markdown = (report / "lr_sweep_analysis.md").read_text()
    assert "## The variants, each at its own best LR" in markdown and "| nope | use_rope=False |" in markdown
    assert_real_picture(report / "compare_loss_vs_lr.png")
    assert_real_picture(report / "compare_curves.png")
    assert "compare search: 3 variants" in compare_sweep["analyze"].stdout
    assert compare_sweep["summary"]["range_test"]["variant"] == "reference"  # the reference's range test, named


def test_the_report_reads_the_batch_size_variants_together_leaving_the_ablation_out(compare_sweep):
    batch = compare_sweep["summary"]["compare_batch"]
    assert [(p["variant"], p["batch_size"]) for p in batch["points"]] == [("reference", 8), ("batch_32", 32)]
    assert all(p["tokens_per_s"] > 0 for p in batch["points"])
    markdown = (compare_sweep["dir"] / "report" / "lr_sweep_analysis.md").read_text()
    assert "### Batch size" in markdown and "| 32 | batch_32 |" in markdown
    assert_real_picture(compare_sweep["dir"] / "report" / "compare_batch.png")


def test_a_batch_size_variant_too_large_for_memory_is_refused_in_one_line_before_any_trial(builtin_data, tmp_path):
    """The 17M model at batch 3,200 x 256 tokens needs about 260 GiB: refused naming the batch and the fix, before
    Tune starts a trial (no trial folder)."""
    space = tmp_path / "huge.yaml"
    space.write_text("search: compare\nbudget: low-resource\nscheduler: {name: none}\n"
                     "variants: {reference: {}, huge: {batch_size: 3200}}\n")
    proc = run_lmtune("run", "--space", str(space), "--name", "huge", "--results", str(tmp_path / "results"),
                      "--data", str(builtin_data), "--num-cpus", "1", "--no-dashboard", "--quiet")
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "batch_size 3200" in errors[0] and "GiB" in errors[0], proc.stderr[-2000:]
    assert not (tmp_path / "results" / "huge").exists() or not trial_dirs(tmp_path / "results" / "huge")
