"""μP's coordinate check (lmtune.training.coord_check): across widths, every layer's scales stay flat under μP and the
hidden and output updates grow under SP; the check's JSON round-trips and its CLI writes its files.

The thresholds come from measurements of this tiny model (head dim 16, 2 layers, context 32, batch 8 on the
built-in corpus) at widths 64-256, 5 steps at lr 3e-3, 3 seeds: μP's largest |slope| was 0.07 and SP's smallest
hidden or output update slope 0.97 (its logits' 1.48), so FLAT_TOLERANCE (0.25) and GROWS (0.6) both sit far
from what each parametrization measures, and each check fails the other parametrization."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import TINY_MODEL, assert_refused, set_args

from lmtune import bench
from lmtune.errors import LmtuneError
from lmtune.training.config import budget_config
from lmtune.training.coord_check import FLAT_TOLERANCE, CoordCheck, coord_check, read_checks, verdict

WIDTHS = [64, 128, 256]
# SP's update slopes of the hidden and output layers measured 0.97-1.48 here: "clearly growing" is above this.
GROWS = 0.6
# The tiny model (head dim 16) and batch of the measurements above, on CPU.
SHAPE = {**TINY_MODEL, "batch_size": 8, "device": "cpu"}


@pytest.fixture(scope="module")
def checks(builtin_data: Path) -> dict[str, CoordCheck]:
    base = budget_config("quick", SHAPE, data_dir=str(builtin_data))
    return {name: coord_check(base, WIDTHS, name, steps=5, lr=3e-3, seeds=3) for name in ("sp", "mup")}


def _slopes(check: CoordCheck) -> dict[str, tuple[float, float]]:
    return {layer.name: (layer.activation_slope, layer.update_slope) for layer in check.layers}


@pytest.mark.slow
def test_under_mup_every_layers_activation_and_update_scale_is_flat_across_width(checks):
    slopes = _slopes(checks["mup"])
    assert all(abs(s) < FLAT_TOLERANCE for pair in slopes.values() for s in pair), slopes
    assert verdict(checks["mup"]).flat, verdict(checks["mup"]).reason


def test_under_sp_the_hidden_and_output_updates_grow_with_width_and_fail_the_flatness_check(checks):
    slopes = _slopes(checks["sp"])
    growing = {name: update for name, (_, update) in slopes.items() if name != "embed"}
    assert min(growing.values()) > GROWS, slopes
    assert slopes["logits"][1] > GROWS
    judged = verdict(checks["sp"])
    assert not judged.flat and judged.slope > GROWS and judged.layer in judged.reason


def test_the_check_covers_the_embedding_each_blocks_attention_and_swiglu_and_the_logits(checks):
    names = [layer.name for layer in checks["mup"].layers]
    assert names == ["embed", "blocks.0.attn", "blocks.0.ffn", "blocks.1.attn", "blocks.1.ffn", "logits"]
    layer = checks["mup"].layer("logits")
    assert len(layer.activation) == len(WIDTHS) and all(len(row) == 6 for row in layer.update)
    assert all(row[0] == 0.0 and row[-1] > 0 for row in layer.update)


def test_a_check_round_trips_through_json(checks, tmp_path):
    for check in checks.values():
        assert CoordCheck.from_json(json.loads(json.dumps(check.to_json()))) == check


@pytest.mark.slow
def test_the_cli_prints_the_slopes_and_writes_the_json_and_the_figure(builtin_data, tmp_path, capsys):
    out = tmp_path / "coord"
    tiny = set_args({**TINY_MODEL, "context_length": 16})
    assert bench.main(["--coord-check", "--widths", "32,64", "--steps", "2", "--seeds", "1", "--device", "cpu",
                       "--data", str(builtin_data), "--out", str(out), *tiny]) == 0
    text = capsys.readouterr().out
    assert "sp update" in text and "mup update" in text and "logits" in text
    saved = read_checks(out / "coord_check.json")
    assert [c.parametrization for c in saved] == ["sp", "mup"] and saved[0].widths == (32, 64)
    assert (out / "coord_check.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("widths", "fragment"), [("64", "at least 2 different widths"),
                                                  ("32,40", "multiples of the head dimension 16"),
                                                  ("32,x", "positive integers")])
def test_the_cli_refuses_bad_widths_in_one_line_naming_the_fix(widths, fragment, tmp_path, capsys):
    argv = ["--coord-check", "--widths", widths, "--out", str(tmp_path / "coord"), *set_args(TINY_MODEL)]
    assert_refused(bench.main, argv, capsys, "--widths", fragment)
    assert not (tmp_path / "coord").exists()


def test_a_check_without_a_data_dir_is_refused_naming_the_fix():
    base = budget_config("quick", SHAPE)
    with pytest.raises(LmtuneError, match="give a prepared data dir"):
        coord_check(base, WIDTHS, "mup")
