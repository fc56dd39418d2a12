"""lmtune sample: text from a run's checkpoint, lmtune's model or the user's (named again with --model), decoded
with the data's tokenizer (or another: a tokenizers JSON, a GPT-2-style vocab.json with merges.txt), token ids where
there is none."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import EXAMPLE, TINY, assert_refused, disk_sweep, run_lmtune, user_model

from lmtune.data.prepare import prepare_tokens
from lmtune.errors import LmtuneError
from lmtune.sample import main
from lmtune.sweep.record import ledger_path
from lmtune.training.checkpoint import checksum_path
from lmtune.training.config import budget_config
from lmtune.training.loop import train
from lmtune.training.sampling import SampleSettings, generate, next_token
from lmtune.usercode.spec import spec_for


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, builtin_data) -> dict[str, Path]:
    """best.pt of a short run of lmtune's model and of the example model on the built-in corpus."""
    root = tmp_path_factory.mktemp("sample")
    found = {}
    for name, code in (("lmtune", None), ("example", user_model("example"))):
        config = budget_config("quick", {**TINY, "lr": 1e-2}, data_dir=str(builtin_data), code=code)
        train(config, root / name, spec=spec_for(config))
        found[name] = root / name / "checkpoints" / "best.pt"
    return found


# The example's checkpoint names code: the user names it again (tests/test_results_folder_code.py: without it, none).
OWN_CODE = {"lmtune": [], "example": ["--model", EXAMPLE]}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lmtune", "example"])
def test_a_sample_continues_the_prompt_in_the_datas_own_words(checkpoints, name, capsys):
    assert main([str(checkpoints[name]), *OWN_CODE[name], "--prompt", "Once upon a time", "--max-tokens", "12"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("Once upon a time") and len(text.strip()) > len("Once upon a time")


def test_temperature_zero_gives_one_text_and_seeds_give_others(checkpoints, capsys):
    def sample(*args: str) -> str:
        assert main([str(checkpoints["example"]), *OWN_CODE["example"], "--max-tokens", "16", *args]) == 0
        return capsys.readouterr().out

    assert sample("--temperature", "0", "--seed", "1") == sample("--temperature", "0", "--seed", "2")
    assert sample("--seed", "3") == sample("--seed", "3")
    drawn = sample("--samples", "3", "--temperature", "1.5", "--top-p", "1")
    assert drawn.count("--- sample") == 3 and len(set(drawn.split("--- sample")[1:])) == 3


class Always(torch.nn.Module):
    """A stand-in model whose every next token is ``token``."""

    def __init__(self, vocab: int, token: int):
        super().__init__()
        self.vocab, self.token = vocab, token
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, ids):
        logits = torch.full((*ids.shape, self.vocab), -10.0)
        logits[..., self.token] = 10.0
        return logits


def test_generation_stops_before_the_end_of_text_token():
    assert generate(Always(8, 5), [1, 2], SampleSettings(max_tokens=10), context_length=4, stop_id=5) == []
    assert generate(Always(8, 3), [1, 2], SampleSettings(max_tokens=10), context_length=4, stop_id=5) == [3] * 10


def test_nucleus_sampling_draws_only_from_the_top_p_mass():
    logits = torch.log(torch.tensor([0.6, 0.35, 0.04, 0.01]))
    generator = torch.Generator().manual_seed(0)
    drawn = {next_token(logits, SampleSettings(temperature=1.0, top_p=0.9), generator) for _ in range(200)}
    assert drawn == {0, 1}


def test_a_gpt2_style_vocab_and_merges_decodes_as_the_datas_own_tokenizer(checkpoints, builtin_data, tmp_path,
                                                                          capsys):
    from tokenizers import Tokenizer

    Tokenizer.from_file(str(builtin_data / "tokenizer.json")).model.save(str(tmp_path))  # vocab.json, merges.txt
    args = [str(checkpoints["lmtune"]), "--max-tokens", "12", "--temperature", "0"]
    assert main(args) == 0
    own = capsys.readouterr().out
    assert main([*args, "--tokenizer", str(tmp_path / "vocab.json")]) == 0
    assert capsys.readouterr().out == own


def test_without_a_tokenizer_a_text_prompt_is_refused_and_ids_are_printed(tmp_path, capsys):
    tokens = np.random.default_rng(0).integers(0, 300, size=60_000, dtype=np.uint16)
    np.save(tmp_path / "ids.npy", tokens)
    data = prepare_tokens(tmp_path / "ids.npy", tmp_path / "data")
    config = budget_config("quick", {**TINY, "steps": 10}, data_dir=str(data))
    train(config, tmp_path / "run")
    best = str(tmp_path / "run" / "checkpoints" / "best.pt")
    assert_refused(main, [best], capsys, "no tokenizer to encode it", "--prompt-ids")
    assert main([best, "--prompt-ids", "3,4,5", "--max-tokens", "5"]) == 0
    out = capsys.readouterr().out
    assert "token ids (no tokenizer" in out and out.splitlines()[1].startswith("3 4 5 | ")


@pytest.mark.parametrize("args, fragment", [
    (["--max-tokens", "0"], "--max-tokens must be"), (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--temperature", "-1"], "--temperature must be"), (["--prompt-ids", "1,x"], "--prompt-ids"),
    (["--prompt-ids", "99999"], "every id must be in [0,"), (["--tokenizer", "/nonexistent.json"], "no such file")])
def test_bad_sampling_input_is_one_line(checkpoints, args, fragment, capsys):
    assert_refused(main, [str(checkpoints["lmtune"]), *args], capsys, fragment)


def test_a_file_that_is_no_checkpoint_is_one_line(tmp_path, capsys):
    (tmp_path / "best.pt").write_bytes(b"not a checkpoint")
    assert_refused(main, [str(tmp_path / "best.pt")], capsys, "is not a usable lmtune checkpoint")
    assert_refused(main, [str(tmp_path / "none.pt")], capsys, "no such checkpoint file")


@pytest.mark.slow
def test_the_console_script_samples_too(checkpoints):
    proc = run_lmtune("sample", str(checkpoints["example"]), *OWN_CODE["example"], "--max-tokens", "8")
    assert proc.returncode == 0 and proc.stdout.startswith("Once upon a time"), proc.stderr[-2000:]


def test_the_settings_refuse_what_no_sampler_can_use():
    with pytest.raises(LmtuneError):
        SampleSettings(max_tokens=10**9).validate()


def test_no_tokenizer_names_a_data_folder_not_found_from_here_not_token_ids(tmp_path, monkeypatch):
    """A run's data recorded as a relative path (lmtune train's default data/builtin), sampled from another folder:
    the line says the folder is not found from here, not that the data was prepared from token ids."""
    from lmtune.sample import no_tokenizer_why

    monkeypatch.chdir(tmp_path)
    why = no_tokenizer_why("data/builtin")
    assert "data/builtin is not found from" in why and "where the run was trained" in why
    (tmp_path / "ids").mkdir()
    assert no_tokenizer_why(str(tmp_path / "ids")) == "the run's data was prepared from token ids and has no " \
                                                      "tokenizer.json"


# ---------------------------------------------------------------------------------------------
# A sweep's or a trial's folder (issue 66 item 4): what `analyze` names, sampled without naming the file

# A sweep as it leaves its folder (conftest.disk_sweep): "full" trained its whole budget (30 steps), the best trial.
SWEEP = {"full": (0.001, "completed", {10: 4.0, 30: 2.5}), "cut": (0.0005, "stopped_early", {10: 3.9})}


def sweep_with_best(root: Path, checkpoint: Path) -> Path:
    """The disk sweep whose best trial ("full") kept ``checkpoint`` as its checkpoints/best.pt."""
    sweep = disk_sweep(root, SWEEP)
    kept = sweep / "full_lr=0.001" / "checkpoints" / "best.pt"
    kept.parent.mkdir()
    shutil.copy(checkpoint, kept)
    shutil.copy(checksum_path(checkpoint), checksum_path(kept))
    return sweep


def greedy(capsys, *args: str) -> str:
    """What ``sample ARGS`` prints at temperature 0 (one text: the checkpoint's alone)."""
    assert main([*args, "--temperature", "0", "--max-tokens", "8"]) == 0
    return capsys.readouterr().out


def test_a_sweeps_folder_samples_its_best_trials_checkpoint(checkpoints, tmp_path, capsys):
    sweep = sweep_with_best(tmp_path, checkpoints["lmtune"])
    assert greedy(capsys, str(sweep)) == greedy(capsys, str(checkpoints["lmtune"]))


def test_sampling_a_sweeps_folder_names_the_checkpoint_on_stderr(checkpoints, tmp_path, capsys):
    sweep = sweep_with_best(tmp_path, checkpoints["lmtune"])
    assert main([str(sweep), "--max-tokens", "4"]) == 0
    assert capsys.readouterr().err == f"sampling {sweep}/full_lr=0.001/checkpoints/best.pt: the best trial of " \
                                      f"{sweep} (full, lr 0.001)\n"


def test_a_trials_folder_samples_its_best_pt(checkpoints, tmp_path, capsys):
    sweep = sweep_with_best(tmp_path, checkpoints["lmtune"])
    assert greedy(capsys, str(sweep / "full_lr=0.001")) == greedy(capsys, str(checkpoints["lmtune"]))


def test_a_runs_folder_without_best_pt_samples_its_newest_periodic_checkpoint(checkpoints, tmp_path, capsys):
    run = shutil.copytree(checkpoints["lmtune"].parent.parent, tmp_path / "run")
    (run / "checkpoints" / "best.pt").unlink()
    newest = max((run / "checkpoints").glob("step_*.pt"))
    assert greedy(capsys, str(run)) == greedy(capsys, str(newest))


def test_a_sweep_whose_trials_all_stopped_before_the_budget_is_refused_naming_the_lowest(tmp_path, capsys):
    sweep = disk_sweep(tmp_path, {"a": (0.001, "stopped_early", {10: 4.0, 20: 2.5}),
                                  "b": (0.01, "stopped_early", {10: 3.9})})
    assert_refused(main, [str(sweep)], capsys, f"{sweep} has no best trial yet",
                   f"the lowest loss so far is {sweep}/a_lr=0.001's: give that folder to sample it anyway")


def test_a_sweep_whose_best_trial_kept_no_checkpoint_is_refused_in_one_line(tmp_path, capsys):
    sweep = disk_sweep(tmp_path, SWEEP)
    assert_refused(main, [str(sweep)], capsys, f"its best trial's folder {sweep}/full_lr=0.001 holds no checkpoint")


def test_a_trial_that_ended_before_any_validation_loss_names_the_keep_that_would_have_kept_one(tmp_path, capsys):
    sweep = disk_sweep(tmp_path, {"nan": (0.5, "diverged", {10: float("nan"), 20: float("nan")})})
    config = json.loads((sweep / "nan_lr=0.5" / "config.json").read_text())
    config["train"]["checkpoint_interval"] = 10  # (it wrote periodic checkpoints at steps 10 and 20)
    (sweep / "nan_lr=0.5" / "config.json").write_text(json.dumps(config))
    assert_refused(main, [str(sweep / "nan_lr=0.5")], capsys,
                   "it ended (diverged) before any finite validation loss, so it wrote no checkpoints/best.pt",
                   "the sweep's --keep best removed its periodic checkpoints when it ended (--keep last would have "
                   "kept its newest)")


def test_the_keep_hint_is_left_out_where_the_trial_wrote_no_periodic_checkpoint(tmp_path, capsys):
    sweep = disk_sweep(tmp_path, {"nan": (0.5, "diverged", {10: float("nan")})})  # (checkpoint_interval 1000)
    line = assert_refused(main, [str(sweep / "nan_lr=0.5")], capsys, "before any finite validation loss")
    assert "--keep" not in line


def test_a_running_trial_without_a_checkpoint_yet_is_refused_saying_so(tmp_path, capsys):
    sweep = disk_sweep(tmp_path, {"new": (0.001, "completed", {})})
    ledger_path(sweep).write_text("{}")  # (no ledger entry, no summary.json: still running)
    assert_refused(main, [str(sweep / "new_lr=0.001")], capsys, "it is still running and writes checkpoints/best.pt "
                   "at its first validation loss")


def test_a_folder_neither_a_sweeps_nor_a_runs_is_refused_naming_what_to_give(tmp_path, capsys):
    assert_refused(main, [str(tmp_path)], capsys, "neither a sweep's (no sweep.json) nor a run's (no config.json)",
                   "a trial's folder or a sweep's folder")


def test_a_trial_named_by_its_id_alone_is_refused_naming_its_folder(checkpoints, tmp_path, capsys):
    """The page's old command with the id analyze printed (best trial: full) in place of the trial's folder."""
    sweep = sweep_with_best(tmp_path, checkpoints["lmtune"])
    assert_refused(main, [str(sweep / "full" / "checkpoints" / "best.pt")], capsys,
                   f"the folder of trial full is {sweep}/full_lr=0.001", f"or give the sweep's folder {sweep}")
