"""What a hostile tester broke (part six, issue 57 items 2, 3, 5, 15, 16, 17 and 19) on the surfaces around a sweep: a
space file's duplicate keys, a report of a sweep still running, a storage URI with a wrong scheme, refusals naming a
flag their command lacks, ``bench --json`` of a model that prints, ``gpu_check.sh --system`` without torch, and
TuneConfig(mode="max") reaching lmtune's searcher in a user's own Tuner. Each written from the issue's description;
each also checks that nothing is written outside the sweep's folder or the test's own tmp dir."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import torch
from conftest import (
    BENCH_MODEL,
    REPO,
    USER_MODELS,
    assert_one_line_error,
    assert_refused,
    disk_sweep,
    set_args,
    snapshot,
    write_grid_space,
)

from lmtune import bench, sample
from lmtune import run as run_cli
from lmtune.analyze import main as analyze_main
from lmtune.sweep.record import ledger_path


def _written_under(root: Path, before: dict, inside: Path | None = None) -> list[str]:
    """What changed under ``root`` since ``before`` (a snapshot), leaving out ``inside``, what is under it and the
    folders above it (whose times change as it is written)."""
    after = snapshot(root)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    if inside is not None:
        changed = [k for k in changed if not ((root / k).is_relative_to(inside) or inside.is_relative_to(root / k))]
    return changed


def _refused_run(tmp_path, monkeypatch, capsys, argv: list[str], *fragments: str) -> str:
    """``run ARGV`` in this process, with tmp_path its working folder: one line naming each fragment, Ray not
    started, nothing written anywhere under tmp_path."""
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    line = assert_refused(run_cli.main, [*argv, "--no-dashboard"], capsys, *fragments)
    assert not ray.is_initialized()
    assert _written_under(tmp_path, before) == []
    return line


# ---------------------------------------------------------------------------------------------
# Item 2: a space file's duplicate keys, which PyYAML drops silently (the last one kept)

COMPARE_WITH_TWO_AS = """\
search: compare
budget: quick
set: {steps: 24, context_length: 32}
scheduler: {name: none}
variants:
  a: {}
  b: {set: {norm: none}}
  a: {set: {position: nope}}
"""

TWO_SETS = """\
search: grid
budget: quick
params:
  lr: [0.001, 0.003]
set:
  steps: 24
  context_length: 32
scheduler: {name: none}
set:
  steps: 400
  context_length: 128
"""


@pytest.mark.parametrize(("text", "key", "first", "second"), [(COMPARE_WITH_TWO_AS, "'a'", 6, 8),
                                                              (TWO_SETS, "'set'", 5, 9)],
                         ids=["two variants named a", "a second set"])
def test_a_space_files_duplicate_key_is_refused_naming_the_key_and_both_lines(
        tmp_path, monkeypatch, capsys, builtin_data, text, key, first, second):
    space = tmp_path / "space.yaml"
    space.write_text(text)
    line = _refused_run(tmp_path, monkeypatch, capsys, ["--space", str(space), "--name", "dup", "--data",
                                                        str(builtin_data)],
                        f"{space}: line {second}: duplicate key {key} (first at line {first})")
    assert "merge" in line or "rename" in line


# ---------------------------------------------------------------------------------------------
# Item 3: analyze of a sweep with a trial still running

# b (0.003) leads; c (0.01) is still running (no ledger entry, no summary.json, no finished result.json).
RUNNING = {"a": (0.001, "completed", {10: 5.0, 20: 4.5, 30: 4.0}),
           "b": (0.003, "completed", {10: 4.8, 20: 4.2, 30: 3.5}),
           "c": (0.01, "running", {10: 4.9})}


def _ledger_without(sweep: Path, trial_id: str) -> None:
    """The sweep as it is while ``trial_id`` runs: the ledger has no entry for it yet."""
    ledger = json.loads(ledger_path(sweep).read_text())
    del ledger[trial_id]
    ledger_path(sweep).write_text(json.dumps(ledger))


@pytest.fixture
def running_sweep(tmp_path: Path) -> Path:
    sweep = disk_sweep(tmp_path, RUNNING)
    _ledger_without(sweep, "c")
    return sweep


def _analyze(sweep: Path, capsys) -> str:
    code = analyze_main([str(sweep), "--samples", "0"])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    return out


def test_analyze_of_a_running_sweep_marks_the_headline_and_every_verdict_unfinished(
        running_sweep, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    lines = _analyze(running_sweep, capsys).splitlines()
    assert lines[0].startswith("sweep disk: unfinished (1 trial running): 3 trials"), lines[0]
    verdicts = [line for line in lines[1:] if not line.startswith(("report:", "note:"))]
    assert verdicts and all(line.startswith("[unfinished] ") for line in verdicts), lines
    assert any("best lr 0.003" in line for line in verdicts)
    assert _written_under(tmp_path, before, inside=running_sweep / "report") == []


def test_the_report_of_a_running_sweep_says_unfinished_at_its_top_and_in_summary_json(running_sweep, capsys):
    _analyze(running_sweep, capsys)
    report = running_sweep / "report"
    summary = json.loads((report / "summary.json").read_text())
    assert summary["unfinished"] == {"running": 1}
    markdown = (report / "lr_sweep_analysis.md").read_text().splitlines()
    assert markdown[0].endswith("(unfinished (1 trial running))")
    assert markdown[2].startswith("**Unfinished (1 trial running):**")
    headings = [line for line in markdown if line.startswith("## ")]
    assert headings and all(line.endswith("(unfinished (1 trial running))") for line in headings)


@pytest.mark.slow
def test_analyze_of_the_finished_sweep_replaces_the_unfinished_report_with_an_unmarked_one(running_sweep, capsys):
    _analyze(running_sweep, capsys)
    ledger = json.loads(ledger_path(running_sweep).read_text())
    ledger["c"] = {"outcome": "stopped_early", "reason": "stopped_early"}  # c ended: the sweep has finished
    ledger_path(running_sweep).write_text(json.dumps(ledger))
    out = _analyze(running_sweep, capsys)
    report = running_sweep / "report"
    assert "unfinished" not in out
    assert "unfinished" not in json.loads((report / "summary.json").read_text())
    assert "nfinished" not in (report / "lr_sweep_analysis.md").read_text()


def _figure_marks(monkeypatch) -> dict[str, list[str]]:
    """Every figure saved from now on, by file name: the texts it carries besides its axes' (fig.text, suptitle)."""
    from matplotlib.figure import Figure

    saved: dict[str, list[str]] = {}
    save = Figure.savefig

    def recording(fig, target, *args, **kwargs):
        saved[f"figure {len(saved)}"] = [text.get_text() for text in fig.texts]
        return save(fig, target, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording)
    return saved


UNFINISHED_FIGURE = "sweep unfinished (1 of 3 trials running): re-run analyze when it ends"


def test_every_figure_of_a_running_sweeps_report_is_marked_unfinished(running_sweep, monkeypatch, capsys):
    saved = _figure_marks(monkeypatch)
    _analyze(running_sweep, capsys)
    drawn = list((running_sweep / "report").glob("*.png"))
    assert drawn and len(saved) == len(drawn), (saved, drawn)
    assert all(UNFINISHED_FIGURE in texts for texts in saved.values()), saved


def test_the_figures_of_the_finished_sweep_carry_no_unfinished_mark(running_sweep, monkeypatch, capsys):
    ledger = json.loads(ledger_path(running_sweep).read_text())
    ledger["c"] = {"outcome": "stopped_early", "reason": "stopped_early"}
    ledger_path(running_sweep).write_text(json.dumps(ledger))
    saved = _figure_marks(monkeypatch)
    _analyze(running_sweep, capsys)
    assert saved and not any("unfinished" in text for texts in saved.values() for text in texts), saved


# ---------------------------------------------------------------------------------------------
# Item 5: a storage URI's scheme


@pytest.mark.parametrize(("storage", "fragment"), [
    ("s3:/bad", "give s3://BUCKET/PREFIX"), ("gs:x", "give gs://BUCKET/PREFIX"), ("S3://x", "give s3://x")])
def test_a_storage_uri_with_a_malformed_scheme_is_refused_and_no_folder_of_its_name_is_made(
        tmp_path, monkeypatch, capsys, builtin_data, storage, fragment):
    grid = write_grid_space(tmp_path / "grid.yaml", [1e-3, 3e-3])
    _refused_run(tmp_path, monkeypatch, capsys, ["--space", str(grid), "--name", "n", "--data", str(builtin_data),
                                                 "--storage", storage], f"--storage '{storage}'", fragment)
    assert not any(p.name.lower().startswith(("s3:", "gs:")) for p in tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------
# Item 15: each refusal names only flags of the command it came from


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine with CUDA has the device asked for")
def test_sample_on_a_device_this_machine_lacks_names_sample_s_own_device_flag(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    line = assert_refused(sample.main, [str(tmp_path / "best.pt"), "--device", "cuda"], capsys, "CUDA is not available",
                          "--device cpu")
    assert "--set" not in line
    assert _written_under(tmp_path, before) == []


def test_a_storage_path_that_is_a_file_is_refused_naming_storage_not_results(
        tmp_path, monkeypatch, capsys, builtin_data):
    grid = write_grid_space(tmp_path / "grid.yaml", [1e-3, 3e-3])
    (tmp_path / "afile").write_text("not a folder")
    line = _refused_run(tmp_path, monkeypatch, capsys, ["--space", str(grid), "--name", "n", "--data",
                                                        str(builtin_data), "--storage", "afile"],
                        f"{tmp_path / 'afile'} is a file, not a folder", "--storage")
    assert "--results" not in line


def test_a_refused_storage_folder_leaves_no_built_in_corpus_behind(tmp_path, monkeypatch, capsys):
    """Without --data the sweep would prepare the built-in corpus in ./data/builtin: a --storage refused at the
    start leaves nothing there (the results folder is checked before planning prepares any data)."""
    grid = write_grid_space(tmp_path / "grid.yaml", [1e-3, 3e-3])
    (tmp_path / "afile").write_text("not a folder")
    _refused_run(tmp_path, monkeypatch, capsys, ["--space", str(grid), "--name", "n", "--storage", "afile"],
                 "is a file, not a folder", "--storage")
    assert not (tmp_path / "data").exists()


def test_a_model_switch_beside_a_users_model_is_refused_without_the_unrelated_mup_note(capsys):
    from lmtune import train

    line = assert_refused(train.main, ["--set", "norm=post", "--model", f"{USER_MODELS / 'gpt_style.py'}:make",
                                       "--budget", "quick"], capsys, "norm='post'", "--model-set")
    assert "μP" not in line


# ---------------------------------------------------------------------------------------------
# Item 16: bench --json of a model module that prints at import


def test_bench_json_of_a_model_that_prints_at_import_keeps_stdout_pure_json(tmp_path, monkeypatch, capsys):
    model = tmp_path / "printing_model.py"
    model.write_text((USER_MODELS / "gpt_style.py").read_text() + "\nprint('loading printing_model: hello')\n")
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    code = bench.main(["--config", "quick", "--batch-size", "2", "--steps", "1", "--repeats", "1", "--warmup", "1",
                       "--device", "cpu", "--no-eval", "--no-naive", *set_args(BENCH_MODEL), "--model",
                       f"{model}:make", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err[-3000:]
    assert json.loads(out)["model"] == f"{model}:make"  # the whole of stdout is the JSON
    assert "loading printing_model: hello" in err
    assert _written_under(tmp_path, before) == []


# ---------------------------------------------------------------------------------------------
# Item 17: scripts/gpu_check.sh --system with a python3 that has no torch


def test_gpu_check_system_with_a_python_without_torch_names_torch_and_how_to_install_it(tmp_path):
    bare = tmp_path / "python3"  # this interpreter without its site-packages: no torch, numpy or yaml
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    bare.chmod(0o755)
    before = snapshot(tmp_path)
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--system", "--out",
                           str(tmp_path / "gpu.json")], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHON": str(bare)}, stdin=subprocess.DEVNULL)
    line = assert_one_line_error(proc.returncode, proc.stderr, "has no torch", "pip install torch")
    assert "Traceback" not in proc.stdout + proc.stderr and "without --system" in line
    assert _written_under(tmp_path, before) == []


# ---------------------------------------------------------------------------------------------
# Item 19: TuneConfig(mode="max") in a user's Tuner with lmtune's edge searcher and no lmtune scheduler: one script
# with the other user's-Tuner checks, test_hostile_sweeps.py's users_tuner.
