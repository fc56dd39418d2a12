"""A results folder is data, never code (issue 57, item 1): a checkpoint's config names its model's code
(``code.model``), and a folder handed to the user may name a payload of its own. ``sample`` and ``analyze`` import it
only with the user's say on that command (``--trust-code``, or ``--model`` naming their own copy); without it
``sample`` refuses in one line naming both ways and ``analyze`` writes its report without samples, saying why.
lmtune's own model needs no consent. ``run --resume`` imports the sweep's code only when it is the very file the
sweep recorded at its start, unchanged (else ``--trust-code``).

The crafted folder: a sweep whose best trial's best.pt (the example model's weights) has a config naming
``trial/payload.py:Model`` (relative, as the folder's own), the payload the example's code plus a line writing a
marker file outside the folder, and the checkpoint's .sha256 recomputed as lmtune writes it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import (
    EXAMPLE,
    TINY,
    assert_one_line_error,
    assert_refused,
    disk_sweep,
    run_lmtune,
    set_args,
    snapshot,
    user_model,
)

from lmtune.sample import main as sample_main
from lmtune.training.checkpoint import checksum_path, load_checkpoint, save_checkpoint
from lmtune.training.config import budget_config
from lmtune.training.loop import train
from lmtune.training.metrics import write_metrics
from lmtune.usercode.consent import (
    NO_CONSENT,
    REFUSED_NOTE,
    CodeConsent,
    FolderCodeRefused,
    check_recorded_files,
    file_sha256,
    only_consented_code,
    recorded_files,
)
from lmtune.usercode.imports import load
from lmtune.usercode.spec import spec_for

PAYLOAD = "trial/payload.py:Model"
# The best trial of the crafted sweep: the lowest validation loss.
TRIALS = {"t1": (0.001, "completed", {10: 4.0}), "t2": (0.003, "completed", {10: 3.0}),
          "t3": (0.01, "diverged", {10: 9.0})}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, builtin_data) -> dict[str, Path]:
    """best.pt of a 10-step run of lmtune's model and of the example model."""
    root = tmp_path_factory.mktemp("trained")
    found = {}
    for name, code in (("lmtune", None), ("example", user_model("example"))):
        config = budget_config("quick", {**TINY, "steps": 10, "eval_interval": 5, "lr": 1e-2},
                               data_dir=str(builtin_data), code=code)
        train(config, root / name, spec=spec_for(config))
        found[name] = root / name / "checkpoints" / "best.pt"
    return found


@pytest.fixture
def crafted(tmp_path, trained) -> dict[str, Path]:
    """The hostile folder: {"root": what the test may look at, "sweep": the sweep, "best": its best trial's best.pt,
    "marker": the file the payload writes when it runs (outside the sweep)}."""
    sweep = disk_sweep(tmp_path, TRIALS)
    marker = tmp_path / "PAYLOAD_RAN"
    payload = sweep / "trial" / "payload.py"
    payload.parent.mkdir()
    example = Path(EXAMPLE.rpartition(":")[0]).read_text()
    payload.write_text(f"{example}\nfrom pathlib import Path as _P\n_P({str(marker)!r}).write_text('ran')\n"
                       "Model = TransformerLM\n")
    state = load_checkpoint(trained["example"])
    state["config"]["code"]["model"] = PAYLOAD
    best = next(sweep.glob("t2_*")) / "checkpoints" / "best.pt"
    best.parent.mkdir()
    save_checkpoint(state, best)  # the .sha256 sidecar recomputed, as lmtune writes it
    return {"root": tmp_path, "sweep": sweep, "best": best, "marker": marker}


def outside_report(root: Path) -> dict:
    """Every file under ``root`` but a sweep's report/ (its size and time): what analyze must leave as it was."""
    return {path: stat for path, stat in snapshot(root).items()
            if "/report" not in f"/{path}" and (root / path).is_file()}


# ---------------------------------------------------------------------------------------------
# sample


@pytest.mark.slow
def test_sample_of_the_crafted_checkpoint_refuses_in_one_line_and_runs_nothing(crafted):
    before = snapshot(crafted["root"])
    proc = run_lmtune("sample", str(crafted["best"].relative_to(crafted["sweep"])), cwd=crafted["sweep"])
    assert_one_line_error(proc.returncode, proc.stderr, PAYLOAD, "--model PATH:NAME", "--trust-code")
    assert not crafted["marker"].exists() and proc.stdout == ""
    assert snapshot(crafted["root"]) == before


@pytest.mark.slow
def test_sample_with_trust_code_imports_the_recorded_code(crafted):
    proc = run_lmtune("sample", str(crafted["best"].relative_to(crafted["sweep"])), "--trust-code",
                      "--max-tokens", "4", cwd=crafted["sweep"])
    assert proc.returncode == 0 and proc.stdout.startswith("Once upon a time"), proc.stderr[-2000:]
    assert crafted["marker"].read_text() == "ran"


@pytest.mark.slow
def test_sample_with_model_builds_the_users_own_copy_and_not_the_recorded_code(crafted):
    before = snapshot(crafted["root"])
    proc = run_lmtune("sample", str(crafted["best"]), "--model", EXAMPLE, "--max-tokens", "4", cwd=crafted["sweep"])
    assert proc.returncode == 0 and proc.stdout.startswith("Once upon a time"), proc.stderr[-2000:]
    assert not crafted["marker"].exists() and snapshot(crafted["root"]) == before


def test_sample_of_the_crafted_trials_folder_refuses_in_one_line_and_runs_nothing(crafted, capsys, monkeypatch):
    """A trial's folder names its checkpoint as a file does (issue 66 item 4): its code is as gated."""
    monkeypatch.chdir(crafted["sweep"])  # (where the payload's relative path would import, were it allowed)
    before = snapshot(crafted["root"])
    assert_refused(sample_main, [str(crafted["best"].parents[1])], capsys, PAYLOAD, "--model PATH:NAME", "--trust-code")
    assert not crafted["marker"].exists() and snapshot(crafted["root"]) == before


def test_sample_of_the_crafted_sweeps_folder_refuses_in_one_line_and_runs_nothing(crafted, capsys, monkeypatch):
    """A sweep's folder is read for its best trial by the report's reader, which imports nothing; the checkpoint it
    names is then as gated as a file."""
    trial = crafted["best"].parents[1]  # (its best trial trained the whole budget: 30 steps of 500 tokens)
    write_metrics(trial / "metrics.csv", [{"step": step, "tokens": step * 500, "train_loss": 3.5, "val_loss": loss}
                                          for step, loss in ((10, 3.0), (30, 2.5))])
    monkeypatch.chdir(crafted["sweep"])
    before = snapshot(crafted["root"])
    assert_refused(sample_main, [str(crafted["sweep"])], capsys, PAYLOAD, "--model PATH:NAME", "--trust-code")
    assert not crafted["marker"].exists() and snapshot(crafted["root"]) == before


def test_a_checkpoint_of_lmtunes_own_model_samples_without_any_flag(trained, capsys):
    before = snapshot(trained["lmtune"].parents[2])
    assert sample_main([str(trained["lmtune"]), "--max-tokens", "4"]) == 0
    assert capsys.readouterr().out.startswith("Once upon a time")
    assert snapshot(trained["lmtune"].parents[2]) == before


def test_model_given_for_a_checkpoint_of_lmtunes_own_model_is_one_line(trained, capsys):
    assert sample_main([str(trained["lmtune"]), "--model", EXAMPLE]) == 2
    assert_one_line_error(2, capsys.readouterr().err, "trained lmtune's own model", "drop --model")


# ---------------------------------------------------------------------------------------------
# analyze


@pytest.mark.slow
def test_analyze_of_the_crafted_sweep_writes_its_report_without_samples_and_says_why(crafted):
    before = outside_report(crafted["root"])
    proc = run_lmtune("analyze", ".", "--samples", "1", cwd=crafted["sweep"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stdout.splitlines() if REFUSED_NOTE in line]
    assert len(said) == 1 and PAYLOAD in said[0] and "--model PATH:NAME" in said[0] and "--trust-code" in said[0]
    summary = json.loads((crafted["sweep"] / "report" / "summary.json").read_text())
    assert summary["samples"] == [] and summary["samples_note"].startswith(REFUSED_NOTE)
    assert f"No samples: {REFUSED_NOTE}" in (crafted["sweep"] / "report" / "lr_sweep_analysis.md").read_text()
    assert not crafted["marker"].exists()
    assert outside_report(crafted["root"]) == before


@pytest.mark.slow
def test_analyze_with_trust_code_draws_the_samples_by_the_recorded_code(crafted):
    proc = run_lmtune("analyze", ".", "--samples", "1", "--trust-code", cwd=crafted["sweep"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((crafted["sweep"] / "report" / "summary.json").read_text())
    assert [s["seed"] for s in summary["samples"]] == [0], summary["samples_note"]
    assert crafted["marker"].read_text() == "ran" and REFUSED_NOTE not in proc.stdout


def test_while_a_folder_is_read_no_code_it_names_is_imported_by_any_part_of_lmtune(crafted, monkeypatch):
    """The guard under the samples and --sharpness alike: lmtune.usercode.imports.load itself refuses."""
    monkeypatch.chdir(crafted["sweep"])
    with only_consented_code(NO_CONSENT), pytest.raises(FolderCodeRefused, match="--trust-code"):
        load(PAYLOAD, "--model")
    with only_consented_code(CodeConsent(model=EXAMPLE)), pytest.raises(FolderCodeRefused):
        load(PAYLOAD, "--model")
    assert not crafted["marker"].exists()


# ---------------------------------------------------------------------------------------------
# run --resume: the sweep's own code, the very file recorded


@pytest.fixture
def own_code(tmp_path) -> tuple[str, dict]:
    """A model file of the user's and what sweep.json records of it at the sweep's start."""
    model = tmp_path / "model.py"
    model.write_text("def Model(**kwargs):\n    raise SystemExit('not to be run by this test')\n")
    spec = f"{model}:Model"
    return spec, recorded_files([spec])


def test_a_resume_imports_the_sweeps_code_when_it_is_the_file_recorded_unchanged(own_code):
    spec, recorded = own_code
    assert recorded[spec]["path"] == spec.rpartition(":")[0]
    check_recorded_files([spec], recorded, trust=False)  # (no refusal)


def test_a_resume_with_changed_code_asks_for_trust_code_in_one_line(own_code):
    spec, recorded = own_code
    Path(spec.rpartition(":")[0]).write_text("def Model(**kwargs):\n    pass\n")
    with pytest.raises(FolderCodeRefused, match="changed since the sweep started.*--trust-code"):
        check_recorded_files([spec], recorded, trust=False)
    check_recorded_files([spec], recorded, trust=True)


def test_a_resume_of_a_sweep_that_recorded_no_file_asks_for_trust_code(own_code):
    spec, _ = own_code
    with pytest.raises(FolderCodeRefused, match="records no file and hash.*--trust-code"):
        check_recorded_files([spec], {}, trust=False)


def test_a_resume_whose_record_points_at_another_file_asks_for_trust_code(own_code, tmp_path):
    spec, recorded = own_code
    other = tmp_path / "elsewhere.py"
    other.write_text(Path(spec.rpartition(":")[0]).read_text())
    moved = {spec: {**recorded[spec], "path": str(other)}}
    with pytest.raises(FolderCodeRefused, match="not the file the sweep started with"):
        check_recorded_files([spec], moved, trust=False)


def test_the_checksum_the_crafted_folder_carries_is_lmtunes_own(crafted):
    """The attack's premise: the edited checkpoint verifies (so only consent stands between it and its code)."""
    assert load_checkpoint(crafted["best"])["config"]["code"]["model"] == PAYLOAD
    assert checksum_path(crafted["best"]).is_file()


def test_a_sweep_records_its_codes_files_and_its_resume_refuses_them_changed(builtin_data, tmp_path):
    """The record a resume checks: sweep.json's code_files, written at the start, read back, compared before any
    import (lmtune.sweep.experiment.check_resumed_code)."""
    from lmtune.api import Sweep
    from lmtune.sweep.experiment import check_resumed_code, plan_record
    from lmtune.sweep.sweep_file import SweepRecord

    model = tmp_path / "model.py"
    model.write_text(Path(EXAMPLE.rpartition(":")[0]).read_text())
    spec = f"{model}:TransformerLM"
    sweep = Sweep("lr_grid", data=builtin_data, model=spec, **TINY)
    (tmp_path / "mine").mkdir()
    plan_record(sweep.plan, "mine").write(tmp_path / "mine")
    record = SweepRecord.read(tmp_path / "mine")
    assert record.code_files == {spec: {"path": str(model), "sha256": file_sha256(model)}}
    check_resumed_code(record)  # (the very file: imported as the sweep did)
    model.write_text(model.read_text() + "\n# edited\n")
    with pytest.raises(FolderCodeRefused, match=f"{model.name}.*changed since the sweep started.*--trust-code"):
        check_resumed_code(record)
    check_resumed_code(record, trust_code=True)


def test_trust_code_without_resume_is_one_line(capsys):
    from lmtune import run as run_cli

    assert_one_line_error(run_cli.main(["--trust-code"]), capsys.readouterr().err, "--trust-code applies to --resume")


# lmtune run --resume of the user's own sweep, end to end (the file it started with resumes; edited, it is refused
# in one line, nothing written): test_cs336_page.py's lr_edge, on the student's package.


# ---------------------------------------------------------------------------------------------
# train --resume: a run folder handed over names code too (config.json's code), and is data all the same


def _train_argv(data: Path, out: Path, *extra: str) -> list[str]:
    """``lmtune train`` of the tiny model, 10 steps of which the run trains the first 5 (a resume trains the rest)."""
    return ["--data", str(data), "--out", str(out), "--quiet",
            *set_args({**TINY, "steps": 10, "run_steps": 5, "eval_interval": 5, "checkpoint_interval": 5}), *extra]


def _files(root: Path) -> dict:
    """Every file under ``root`` (its size and time): a refused resume leaves them as they were (its folder's time
    may change: --out's writability probe comes first)."""
    return {path: stat for path, stat in snapshot(root).items() if (root / path).is_file()}


@pytest.fixture(scope="module")
def example_run(tmp_path_factory, builtin_data) -> Path:
    """A run of the example model trained by ``lmtune train`` to step 5 of 10 (code_files.json recorded)."""
    from lmtune.train import main as train_main

    out = tmp_path_factory.mktemp("example_run") / "run"
    assert train_main(_train_argv(builtin_data, out, "--model", EXAMPLE)) == 0
    return out


@pytest.fixture
def handed_run(tmp_path, example_run, builtin_data) -> dict[str, Path]:
    """The hostile run folder: the example run copied, its config.json naming ``payload.py:Model`` (a payload in the
    folder that writes a marker outside it), and a code_files.json forged to vouch for the payload's path and hash
    where the folder lands: {"run", "marker", "root", "argv" (of train --resume)}."""
    import shutil

    from lmtune.usercode.consent import RUN_RECORD

    run = tmp_path / "run"
    shutil.copytree(example_run, run)
    marker = tmp_path / "PAYLOAD_RAN"
    example = Path(EXAMPLE.rpartition(":")[0]).read_text()
    payload = run / "payload.py"
    payload.write_text(f"{example}\nfrom pathlib import Path as _P\n_P({str(marker)!r}).write_text('ran')\n"
                       "Model = TransformerLM\n")
    config = json.loads((run / "config.json").read_text())
    config["code"]["model"] = "payload.py:Model"
    (run / "config.json").write_text(json.dumps(config))
    (run / RUN_RECORD).write_text(json.dumps({"payload.py:Model": {"path": str(payload),
                                                                   "sha256": file_sha256(payload)}}))
    argv = ["train", "--resume", "--out", ".", "--data", str(builtin_data), "--set", "run_steps=10"]
    return {"run": run, "marker": marker, "root": tmp_path, "argv": argv}


@pytest.mark.slow
@pytest.mark.parametrize("record", ["forged", "none"])
def test_train_resume_of_a_handed_over_run_refuses_in_one_line_and_runs_nothing(handed_run, record):
    from lmtune.usercode.consent import RUN_RECORD

    if record == "none":
        (handed_run["run"] / RUN_RECORD).unlink()
    before = _files(handed_run["root"])
    proc = run_lmtune(*handed_run["argv"], cwd=handed_run["run"])
    why = "lies in the run's own folder" if record == "forged" else "records no file and hash"
    assert_one_line_error(proc.returncode, proc.stderr, "payload.py:Model", why, "--model payload.py:Model again",
                          "--trust-code")
    assert not handed_run["marker"].exists() and proc.stdout == ""
    assert _files(handed_run["root"]) == before


@pytest.mark.slow
def test_train_resume_of_a_handed_over_run_with_trust_code_imports_it_and_resumes(handed_run):
    proc = run_lmtune(*handed_run["argv"], "--trust-code", cwd=handed_run["run"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("completed: 10 steps"), proc.stdout
    assert handed_run["marker"].read_text() == "ran"


def test_train_resume_of_the_users_own_run_needs_no_flag_and_asks_once_its_code_changed(tmp_path, builtin_data,
                                                                                           capsys):
    """The common case: the run resumed where it was trained, its model file unchanged, imports as before; the file
    edited, the resume asks for --model again (or --trust-code), and with --model it resumes."""
    from lmtune.train import main as train_main

    model = tmp_path / "model.py"
    model.write_text(Path(EXAMPLE.rpartition(":")[0]).read_text())
    spec, out = f"{model}:TransformerLM", tmp_path / "run"
    assert train_main(_train_argv(builtin_data, out, "--model", spec)) == 0
    resume = ["--resume", "--out", str(out), "--set", "run_steps=8", "--quiet"]
    assert train_main(resume) == 0 and "completed: 8 steps" in capsys.readouterr().out
    model.write_text(model.read_text() + "\n# edited\n")
    before = _files(out)
    assert_refused(train_main, [*resume[:-2], "run_steps=10", "--quiet"], capsys, "changed since the run started",
                   f"--model {spec} again", "--trust-code")
    assert _files(out) == before
    assert train_main([*resume[:-2], "run_steps=10", "--quiet", "--model", spec]) == 0
    assert "completed: 10 steps" in capsys.readouterr().out


def test_trust_code_on_a_new_training_run_is_one_line(tmp_path, capsys):
    from lmtune.train import main as train_main

    assert_refused(train_main, ["--trust-code", "--out", str(tmp_path / "new")], capsys,
                   "--trust-code applies to --resume")
    assert not (tmp_path / "new").exists()
