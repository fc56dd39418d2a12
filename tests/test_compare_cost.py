"""benchmarks/compare_cost.py's pure parts: the edge space it writes for each variant of a compare space, and the
tokens it sums from trial records (no sweep runs here)."""

from __future__ import annotations

import pandas as pd
import pytest
import yaml

from benchmarks.compare_cost import NO_VARIANT, Cost, costs, edge_space, in_basin
from lmtune.findings.stability import TrialRecord
from lmtune.sweep.spaces import load_space, resolve_space_path


def test_each_variant_of_quick_ablations_becomes_an_edge_space_with_the_settings_the_compare_gives_it(tmp_path):
    compare = yaml.safe_load(resolve_space_path("quick_ablations").read_text())
    for name, entry in compare["variants"].items():
        space = edge_space(compare, name)
        assert space["search"] == "edge" and "variants" not in space
        assert (space["budget"], space["scheduler"], space["edge"]) == (compare["budget"], compare["scheduler"],
                                                                        compare["edge"])
        assert space["set"] == {**compare["set"], **((entry or {}).get("set") or {})}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(space))
        assert load_space(str(path)).strategy.name == "edge"  # (a valid edge space, as lmtune.run reads it)


def test_a_batch_size_variants_steps_are_scaled_to_the_same_tokens_as_the_compare_search_scales_them():
    compare = {"search": "compare", "budget": "quick",
               "set": {"batch_size": 8, "steps": 32, "warmup_steps": 4, "eval_interval": 8, "context_length": 32},
               "variants": {"reference": {}, "big": {"batch_size": 32}}}
    space = edge_space(compare, "big")
    assert (space["set"]["batch_size"], space["set"]["steps"], space["set"]["warmup_steps"]) == (32, 8, 1)
    assert space["set"]["eval_interval"] == 2


def test_a_variant_with_its_own_model_is_refused_in_one_line():
    compare = {"search": "compare", "budget": "quick", "variants": {"reference": {}, "mine": {"model_set": {"x": 1}}}}
    with pytest.raises(SystemExit, match="variants.mine: model_set"):
        edge_space(compare, "mine")


def record(trial_id: str, tokens: list[int], stage: str, variant: str | None = None, continued: int = 0) -> TrialRecord:
    curve = pd.DataFrame({"step": range(1, len(tokens) + 1), "tokens": tokens})
    return TrialRecord(trial_id, 1e-3, {"lr": 1e-3}, "completed", curve=curve, stage=stage, variant=variant,
                       continued_from_tokens=continued)


def test_tokens_are_summed_per_variant_and_stage_as_the_report_counts_them():
    records = [record("a", [100, 200], "coarse", "reference"),
               record("b", [100, 400], "landscape", "reference", continued=200),  # its first 200 were "a"'s
               record("c", [300], "coarse", "no_norm"),
               record("d", [400], "at_reference", "no_norm")]
    by = costs(records, {"reference": 50, "no_norm": 60})
    assert by["reference"].stages == {"range": 50, "coarse": 200, "landscape": 200}
    assert (by["reference"].search, by["reference"].at_reference) == (450, 0)
    assert (by["no_norm"].search, by["no_norm"].at_reference, by["no_norm"].total) == (360, 400, 760)


def test_an_edge_searchs_trials_name_no_variant():
    by = costs([record("a", [100, 200], "coarse")], {None: 30})
    assert by[NO_VARIANT].total == 230 and set(by) == {NO_VARIANT}
    assert Cost().total == 0


def test_a_best_lr_is_in_a_basin_from_the_lr_below_it_to_the_one_above():
    basin = {"lrs": [0.01, 0.02], "low": [0.005, 0.01], "high": [0.02, 0.04]}
    assert in_basin(0.005, basin) and in_basin(0.04, basin) and in_basin(0.015, basin)
    assert not in_basin(0.0049, basin) and not in_basin(0.05, basin)
    assert in_basin(None, basin) is None and in_basin(0.01, None) is None
