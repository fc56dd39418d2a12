"""What a hostile tester tried (part three), each written against the behaviour before its fix: nothing a user
wrote is overwritten, ids and sizes that cannot fit are refused in one line, a resume refuses what it cannot
honour, and every printed command can be pasted back into a shell."""

from __future__ import annotations

import json
import math
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    TINY_MODEL,
    assert_one_line_error,
    assert_refused,
    disk_sweep,
    run_lmtune,
    run_printout,
    set_args,
    snapshot,
    start_lmtune,
)

from lmtune import bench, lr_find
from lmtune import prepare as prepare_cli
from lmtune import run as run_cli
from lmtune import train as train_cli
from lmtune.analyze import main as analyze_main
from lmtune.data import prepare as data_prepare
from lmtune.data.batches import BatchSampler
from lmtune.data.tokenizer import MAX_PIECE_BYTES
from lmtune.errors import LmtuneError
from lmtune.searches.grid import settings as grid
from lmtune.sweep.options import SweepOptions
from lmtune.sweep.spaces import load_space

TINY_RUN = set_args({**TINY_MODEL, "batch_size": 4, "steps": 4, "warmup_steps": 1, "eval_interval": 2,
                     "log_interval": 2, "eval_batches": 1, "checkpoint_interval": 2})


# ---------------------------------------------------------------------------------------------
# 1. analyze --out never overwrites what it did not write


@pytest.mark.slow
def test_analyze_refuses_an_out_folder_holding_a_users_summary_json_and_leaves_it(quick_sweep, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.json").write_text('{"mine": true}')
    before = snapshot(mine)
    assert_refused(analyze_main, [str(quick_sweep), "--out", str(mine)], capsys, "already holds", "empty or new")
    assert snapshot(mine) == before and (mine / "summary.json").read_text() == '{"mine": true}'


@pytest.mark.slow
def test_analyze_refuses_a_trial_folder_as_out_and_keeps_the_trials_own_summary(quick_sweep, capsys):
    trial = next(p for p in quick_sweep.iterdir() if (p / "summary.json").is_file() and (p / "metrics.csv").is_file())
    before = snapshot(trial)
    assert_refused(analyze_main, [str(quick_sweep), "--out", str(trial)], capsys, "already holds")
    assert snapshot(trial) == before


@pytest.mark.slow
def test_analyze_may_rewrite_its_own_report_of_the_same_sweep(quick_sweep, tmp_path, capsys):
    out = tmp_path / "report"
    assert analyze_main([str(quick_sweep), "--out", str(out)]) == 0
    assert analyze_main([str(quick_sweep), "--out", str(out)]) == 0
    assert json.loads((out / "summary.json").read_text())["best_trial"]


# ---------------------------------------------------------------------------------------------
# 2-3, 9, 11. prepare: ids that do not fit, vocabularies out of range, text without whitespace


def test_prepare_refuses_a_token_id_beyond_32_bits_and_writes_nothing(tmp_path, capsys):
    src = tmp_path / "ids.npy"
    np.save(src, np.array([1, 2, 2**40, 3], dtype=np.int64))
    assert_refused(prepare_cli.main, ["--tokens", str(src), "--out", str(tmp_path / "out")], capsys,
                   str(2**40), "32-bit")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("vocab", ["0", "257", "1000000000"])
def test_prepare_refuses_a_bpe_vocabulary_it_cannot_train(vocab, tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("hello world\n" * 50)
    assert_refused(prepare_cli.main, ["--input", str(text), "--out", str(tmp_path / "out"), "--vocab-size", vocab],
                   capsys, f"--vocab-size {vocab}", "258")
    assert not (tmp_path / "out").exists()


def test_text_without_whitespace_is_pre_tokenised_into_bounded_pieces(tmp_path):
    rng = np.random.default_rng(0)
    text = tmp_path / "run_on.txt"
    text.write_text("".join(rng.choice(list("abcdefghij"), size=200_000)) + "\nsome ordinary words here\n")
    out = data_prepare.prepare_text([text], tmp_path / "data", vocab_size=300)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    pieces = tok.pre_tokenizer.pre_tokenize_str("x" * 5000 + " ordinary words")
    assert max(len(p) for p, _ in pieces) == MAX_PIECE_BYTES
    assert [p for p, _ in pieces[-2:]] == ["Ġordinary", "Ġwords"]  # ordinary words are split as before
    assert tok.decode(tok.encode("x" * 1000 + " words").ids) == "x" * 1000 + " words"


def _edited_meta(builtin_data: Path, tmp: Path) -> Path:
    """The built-in corpus (ids up to ~3800) with a meta.json claiming a vocabulary of 100."""
    data = tmp / "edited"
    shutil.copytree(builtin_data, data)
    meta = json.loads((data / "meta.json").read_text())
    meta.update(vocab_size=100, max_token_id=99)
    (data / "meta.json").write_text(json.dumps(meta))
    return data


def test_train_refuses_data_whose_ids_exceed_its_meta_json_without_leaving_a_folder(builtin_data, tmp_path, capsys):
    out = tmp_path / "out"
    assert_refused(train_cli.main, ["--data", str(_edited_meta(builtin_data, tmp_path)), "--out", str(out),
                                    *TINY_RUN], capsys, "holds token id", "meta.json says the largest is 99")
    assert not out.exists()


def test_run_refuses_data_whose_ids_exceed_its_meta_json_before_ray_starts(builtin_data, tmp_path, capsys):
    import ray

    space = tmp_path / "grid.yaml"
    space.write_text("search: grid\nbudget: quick\nparams:\n  lr: [1.0e-3, 3.0e-3]\n")
    assert_refused(run_cli.main, ["--space", str(space), "--data", str(_edited_meta(builtin_data, tmp_path)),
                                  "--results", str(tmp_path / "results"), "--no-dashboard", "--quiet"],
                   capsys, "meta.json says the largest is 99")
    assert not ray.is_initialized() and not (tmp_path / "results").exists() or \
        not any((tmp_path / "results").iterdir())


def test_a_batch_holding_an_id_beyond_the_vocabulary_is_refused_not_an_index_error():
    tokens = np.zeros(1000, dtype=np.uint16)
    tokens[::7] = 500
    with pytest.raises(LmtuneError, match="token id 500 .* vocab_size 100"):
        BatchSampler(tokens, 4, 16, seed=0, vocab_size=100).batch(1)


# ---------------------------------------------------------------------------------------------
# 8. bench: worker counts the machine cannot hold


@pytest.mark.parametrize("flag", ["--fuse", "--concurrency"])
def test_bench_refuses_more_workers_than_the_machine_holds_before_starting_any(flag, capsys):
    assert_refused(bench.main, ["--config", "quick", flag, "1000000"], capsys, f"{flag}: K=1000000", "use K <=")


def test_bench_refuses_a_fused_group_larger_than_memory(capsys):
    assert_refused(bench.main, ["--config", "quick", "--fuse", "2", "--set", "d_model=65536", "--set",
                                "n_heads=16"], capsys, "GiB")


# ---------------------------------------------------------------------------------------------
# 10. search spaces: grids beyond a stated size


def test_a_grid_larger_than_the_cap_is_refused_in_one_line(tmp_path):
    path = tmp_path / "huge.yaml"
    cap = grid.MAX_GRID_TRIALS
    lrs = ", ".join(f"{1e-5 * (1 + i / cap):.10e}" for i in range(cap + 1))
    path.write_text(f"search: grid\nbudget: quick\nparams:\n  lr: [{lrs}]\n")
    with pytest.raises(LmtuneError, match=f"{cap + 1:,} values; a grid runs at most"):
        load_space(str(path))


def test_a_space_file_over_a_megabyte_is_refused_before_it_is_parsed(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("search: grid\nbudget: quick\nparams:\n  lr: [1.0e-3]\n" + "#" * (1 << 20))
    with pytest.raises(LmtuneError, match="a search space is at most"):
        load_space(str(path))


def test_duplicates_in_a_long_grid_are_still_named(tmp_path):
    path = tmp_path / "dup.yaml"
    lrs = [f"{1e-5 * (1 + i / 5000):.10e}" for i in range(5000)] + ["0.001", "1.0e-3"]
    path.write_text(f"search: grid\nbudget: quick\nparams:\n  lr: [{', '.join(lrs)}]\n")
    with pytest.raises(LmtuneError, match=r"0\.001 listed more than once"):
        load_space(str(path))


# ---------------------------------------------------------------------------------------------
# 12, 14. train: seeds, LRs and models that cannot run; no folder left by a refusal

BAD_RUNS = {
    "negative-seed": (["--set", "seed=-1"], ["seed must be an integer in [0, 2**32 - 1]"]),
    "seed-beyond-numpy": (["--set", f"seed={2**32}"], ["seed must be an integer"]),
    "absurd-lr": (["--lr", "1e300"], ["lr must be a positive finite number at most"]),
    "model-beyond-memory": (["--set", "d_model=100000", "--set", "n_heads=16"], ["GiB", "smaller d_model"]),
}


@pytest.mark.parametrize("case", list(BAD_RUNS), ids=list(BAD_RUNS))
def test_train_refuses_runs_that_cannot_train_in_one_line_leaving_no_folder(case, builtin_data, tmp_path, capsys):
    extra, fragments = BAD_RUNS[case]
    out = tmp_path / "out"
    assert_refused(train_cli.main, ["--data", str(builtin_data), "--out", str(out), "--set", "steps=5",
                                    "--set", "warmup_steps=1", *extra], capsys, *fragments)
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# 7. one writer of a training run


@pytest.mark.slow
def test_a_second_train_into_a_running_trains_out_is_refused_naming_the_holder(builtin_data, tmp_path):
    out = tmp_path / "out"
    long_run = set_args({**TINY_MODEL, "batch_size": 4, "steps": 100000, "warmup_steps": 1})
    first = start_lmtune("train", "--data", str(builtin_data), "--out", str(out), *long_run, "--quiet")
    try:
        from conftest import wait_until

        wait_until(lambda: (out / "metrics.csv").exists(), first, 120, "the first run's metrics")
        second = run_lmtune("train", "--data", str(builtin_data), "--out", str(out), "--resume", *long_run,
                            timeout=120)
        assert_one_line_error(second.returncode, second.stderr, "being written by another lmtune training run",
                              f"(pid {first.pid})")
        assert first.poll() is None
    finally:
        first.kill()
        first.communicate()


# ---------------------------------------------------------------------------------------------
# 13, 16. resume: what it cannot honour is refused; printed commands paste back


@pytest.mark.parametrize("flags", [["--set", "steps=999"], ["--budget", "full"], ["--time-budget", "1h"],
                                   ["--max-failures", "5"], ["--fuse", "2"]])
def test_resume_refuses_the_options_it_cannot_honour_naming_them(flags, tmp_path, capsys):
    line = assert_refused(run_cli.main, ["--name", "x", "--resume", "--results", str(tmp_path), *flags], capsys,
                          flags[0], "cannot change it")
    assert "sweep.json" in line


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--space", "--data"])
def test_resume_refuses_another_space_or_data_than_the_sweep_ran(flag, quick_sweep, builtin_data, tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(quick_sweep, results / "quick", ignore=shutil.ignore_patterns(".lmtune.lock"))
    other = {"--space": "lr_grid", "--data": str(tmp_path)}[flag]
    before = snapshot(results)
    assert_refused(run_cli.main, ["--name", "quick", "--resume", "--results", str(results), flag, other,
                                  "--no-dashboard", "--quiet"], capsys, f"{flag} {other} is not the")
    assert snapshot(results) == before


def test_printed_resume_and_analyze_commands_survive_spaces_and_non_ascii(tmp_path):
    results = tmp_path / "my results ü"
    command = run_cli.resume_command(SweepOptions(space="quick", name="s1", results=results))
    assert shlex.split(command) == ["python", "-m", "lmtune.run", "--name", "s1", "--resume", "--results",
                                    str(results)]


# ---------------------------------------------------------------------------------------------
# 15. lr_find: the data's vocabulary, as train resolves it


@pytest.mark.slow
def test_lr_find_starts_at_the_loss_of_the_datas_vocabulary(builtin_data, tmp_path, capsys):
    vocab = json.loads((builtin_data / "meta.json").read_text())["vocab_size"]
    out = tmp_path / "find"
    tiny = set_args({**TINY_MODEL, "batch_size": 4})
    assert lr_find.main(["--data", str(builtin_data), "--out", str(out), "--steps", "10", "--quiet", *tiny]) == 0
    capsys.readouterr()
    first_loss = float((out / "range_test.csv").read_text().splitlines()[1].split(",")[2])
    # A fresh model's loss is about ln(vocabulary): ln 3801 = 8.24 for the data's, ln 10000 = 9.21 for the default.
    assert abs(first_loss - math.log(vocab)) < 0.3, first_loss


# ---------------------------------------------------------------------------------------------
# 18. one count of trials everywhere


def test_run_and_analyze_count_a_probe_an_interruption_made_the_search_rerun_alike(tmp_path, capsys):
    from lmtune.analysis.runs import INTERRUPTED
    from lmtune.analyze import headline
    from lmtune.report.writer import write_report
    from lmtune.searches.state import search_state_path
    from lmtune.sweep.record import ledger_path

    sweep_dir = disk_sweep(tmp_path, {t: (lr, "completed", {10: 4.0, 30: loss}) for t, lr, loss in
                                      (("a", 0.001, 2.6), ("b", 0.002, 2.5), ("again", 0.002, 2.4))})
    ledger = json.loads(ledger_path(sweep_dir).read_text())
    del ledger["again"]  # Ray never recorded its first run: the search planned it again
    ledger_path(sweep_dir).write_text(json.dumps(ledger))
    search_state_path(sweep_dir, "edge").write_text(json.dumps({"interrupted": {"again": INTERRUPTED}}))
    _, out = run_printout(sweep_dir, 2, capsys)  # Tune recorded 2 trials: "again"'s first run was lost with the driver
    printed = next(line for line in out.splitlines() if " trials: " in line)
    report = write_report(sweep_dir, out_dir=tmp_path / "report")
    assert printed == "3 trials: 2 completed, 1 ended"
    assert headline(report)[0].endswith("3 trials (2 completed, 1 ended)")
