"""docs/cs336.md, run as written at a tiny budget (issue 56 item 3, issue 66 item 2): a CS336 student's repository
as the handout lays it out (tests/cs336_repo.py: a package whose __init__ reads its installed version, relative imports,
a third-party import), installed into lmtune's environment as the page's way (b) says (`pip install --no-deps -e .`,
into an environment of its own layered on the tests' one), with the handout's files beside it (text and their own
BPE's token arrays); every `lmtune ...` line of the page run by that environment's python from the repository: the
data commands as they stand; the learning-rate sweep with a tiny model and a few steps set on top, interrupted and
resumed by the command it prints, its report and samples; the other sweeps planned (every variant built and checked,
as `lmtune run` does before any trial); and, in the release tier, both compare commands (ablations, batch sizes)
trained end to end and reported. Way (a), `uv add` into the repository's own project, is test_install.py's."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    TINY,
    assert_one_line_error,
    assert_real_picture,
    finish,
    run_command,
    snapshot,
    start_lmtune,
    trial_dirs,
    wait_until,
    write_grid_space,
)
from cs336_repo import PACKAGE, layered_venv, write_cs336_repo
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lmtune.data.corpus import stories
from lmtune.data.documents import EOT
from lmtune.searches.state import read_search_state
from lmtune.sweep.record import read_outcomes

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "cs336.md"
# The page's model at test size, and a budget of a few steps (every interval within it).
TINY_SETTINGS = {**TINY, "n_layers": 1, "steps": 24, "warmup_steps": 4, "log_interval": 4, "eval_interval": 4,
                 "eval_batches": 1, "checkpoint_interval": 4}


def page_lines() -> list[list[str]]:
    """Every line of the page's bash blocks, split as a shell would (comments dropped)."""
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S)
    return [shlex.split(line, comments=True) for block in blocks for line in block.splitlines() if line.strip()]


def page_commands() -> list[list[str]]:
    """Every `lmtune ...` line of the page's bash blocks."""
    return [line for line in page_lines() if line[0] == "lmtune"]


def install_commands() -> list[list[str]]:
    """The page's install lines of way (b): `source .../setup.sh runtime`, then the two `pip install`s."""
    return [line for line in page_lines() if line[0] in ("source", "pip")]


def command(name: str, key: str) -> list[str]:
    """The page's one `lmtune NAME` command whose sweep is named ``key`` (--name), or whose first argument is."""
    found = [c for c in page_commands() if c[1] == name and key in (c[2], sweep_name(c))]
    assert len(found) == 1, f"docs/cs336.md has {len(found)} `lmtune {name}` commands for {key}"
    return found[0]


def sweep_name(argv: list[str]) -> str | None:
    return argv[argv.index("--name") + 1] if "--name" in argv else None


def run_as_written(argv: list[str], student: Path, *extra: str, timeout: float | None = None):
    """The page's `lmtune ...` command, by the python of the student's environment (way (b)), from their repository."""
    proc = run_command([str(python_of(student)), "-m", *argv, *extra], cwd=student, timeout=timeout)
    assert proc.returncode == 0, f"{shlex.join(argv)}\n{proc.stderr[-3000:]}"
    return proc


def with_value(argv: list[str], option: str, value: str) -> list[str]:
    """A page command with ``option``'s value replaced (a single-value option takes one value: a second one is
    refused, not kept in place of the first)."""
    at = argv.index(option)
    return [*argv[:at + 1], value, *argv[at + 2:]]


def python_of(student: Path) -> Path:
    return student.parent / "env" / "bin" / "python"


def tiny(*, cpus: bool = True, steps: int = 24) -> list[str]:
    """The tiny model and budget on top of a command's own settings (``steps``: a budget every variant's batch
    divides: at batch 8, 32 steps leave batch 128 two)."""
    settings = {**TINY_SETTINGS, "steps": steps}
    return [*(f"--set={k}={v}" for k, v in settings.items()), *(["--num-cpus", "2"] if cpus else [])]


@pytest.fixture(scope="module")
def student(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A student's CS336 repository, installed as the page's way (b) says into an environment of its own, with the
    handout's two text files, their own BPE (vocab.json + merges.txt) and the token arrays it wrote, and the page's
    ablation space copied in."""
    root = write_cs336_repo(tmp_path_factory.mktemp("cs336") / "assignment1-basics")
    python = layered_venv(root.parent / "env")
    install = install_commands()[-2]  # pip install --no-deps -e . (setuptools from the environment: no index)
    proc = run_command([str(python), "-m", *install[:2], "--no-build-isolation", *install[2:]], cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.copy(REPO / "examples" / "cs336_ablations_own_model.yaml", root)
    train_docs, valid_docs = list(stories.generate_stories(300, seed=0)), list(stories.generate_stories(40, seed=1))
    for name, docs in (("train", train_docs), ("valid", valid_docs)):
        (root / f"TinyStoriesV2-GPT4-{name}.txt").write_text("".join(f"{d}\n{EOT}\n" for d in docs))
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(train_docs, trainers.BpeTrainer(
        vocab_size=500, special_tokens=[EOT], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    (root / "my_bpe").mkdir()
    tokenizer.model.save(str(root / "my_bpe"))
    eot = tokenizer.token_to_id(EOT)
    for name, docs in (("train", train_docs), ("valid", valid_docs)):
        ids = [i for d in docs for i in [*tokenizer.encode(d).ids, eot]]
        np.save(root / f"tinystories_{name}.npy", np.array(ids, dtype=np.uint16))
    return root


def test_the_page_holds_a_command_for_each_problem_it_maps():
    names = [(c[1], sweep_name(c) if c[1] == "run" else c[2]) for c in page_commands()]
    assert names == [("prepare", "--input"), ("prepare", "--tokens"), ("run", "quick_edge"), ("run", "lr_edge_small"),
                     ("run", "lr_edge"), ("analyze", "results/lr_edge"), ("run", "batch"), ("run", "ablations"),
                     ("sample", "results/lr_edge")]


def test_the_page_opens_with_both_ways_to_install_beside_the_assignment():
    sections = re.findall(r"^## (.+)$", PAGE.read_text(), re.M)
    assert sections[0] == "Install beside your assignment"
    assert ["uv", "add", "lmtune @ git+URL"] in page_lines()
    assert install_commands() == [["source", "PATH/TO/lmtune/scripts/setup.sh", "runtime"],
                                  ["pip", "install", "--no-deps", "-e", "."], ["pip", "install", "einops", "jaxtyping"]]


@pytest.fixture(scope="module")
def prepared(student: Path) -> Path:
    run_as_written(command("prepare", "--input"), student)
    return student / "data" / "tinystories"


def test_prepare_with_the_handouts_validation_file_records_it_as_the_split(prepared: Path):
    meta = json.loads((prepared / "meta.json").read_text())
    assert "TinyStoriesV2-GPT4-valid.txt" in json.dumps(meta["validation"])


def test_prepare_from_the_students_own_token_arrays_and_tokenizer(student: Path):
    run_as_written(command("prepare", "--tokens"), student)
    out = student / "data" / "tinystories_ids"
    assert (out / "tokenizer.json").is_file()
    assert "tinystories_valid.npy" in json.dumps(json.loads((out / "meta.json").read_text())["validation"])


def as_sweep(argv: list[str], space: str, name: str) -> list[str]:
    """A page command with its --space and --name (or results/NAME folder) replaced."""
    out = [space if argv[i - 1] == "--space" else name if argv[i - 1] == "--name" else word
           for i, word in enumerate(argv)]
    return [f"results/{name}" if word.startswith("results/") else word for word in out]


# The student's own small grid (four LRs of the tiny model): the per-push sweep of the student's package.
STUDENT_GRID = [1e-3, 3e-3, 1e-2, 3e-2]


@pytest.fixture(scope="module")
def mine(student: Path, prepared: Path) -> dict:
    """The page's learning-rate command, from the student's repository, with their package's model, optimizer and
    schedule, on a small grid space of their own (STUDENT_GRID): Ctrl-C once two trials have ended; the command it
    printed run once with the student's model.py edited (refused: code changed since the sweep started) and once as
    it was (resumed); then the page's analyze and sample commands on it. (The per-push sweep of a user's package; the
    page's edge search as written is the release tier's, below.)"""
    python, sweep = python_of(student), student / "results" / "mine"
    write_grid_space(student / "mine.yaml", STUDENT_GRID, **TINY_SETTINGS)
    argv = as_sweep(command("run", "lr_edge"), "mine.yaml", "mine")
    proc = start_lmtune(argv[1], *argv[2:], "--num-cpus", "1", python=python, cwd=student)
    wait_until(lambda: len(read_outcomes(sweep)) >= 2, proc, 120, "two ended trials", poll_s=0.05)
    os.killpg(proc.pid, signal.SIGINT)
    interrupted = finish(proc, 60)
    ended = {t: e["outcome"] for t, e in read_outcomes(sweep).items()}
    printed = re.search(r"resume it with: python (-m lmtune\.run .*)$", interrupted, re.M)
    assert printed, interrupted[-3000:]
    resume = [str(python), *shlex.split(printed.group(1))]
    model, before = student / PACKAGE / "model.py", snapshot(sweep)
    original = model.read_text()
    model.write_text(original + "\n# edited\n")
    refused = run_command(resume, cwd=student)
    written = snapshot(sweep) != before
    model.write_text(original)
    resumed = run_command(resume, cwd=student)
    analyze = run_as_written(as_sweep(command("analyze", "results/lr_edge"), "", "mine"), student)
    summary = json.loads((sweep / "report" / "summary.json").read_text())
    sample = as_sweep(command("sample", "results/lr_edge"), "", "mine")
    sampled = run_as_written(with_value(sample, "--max-tokens", "16"), student)
    return {"dir": sweep, "interrupted": (proc.returncode, interrupted), "ended_before": ended, "resumed": resumed,
            "refused": refused, "written_by_refused": written, "analyze": analyze, "summary": summary,
            "sampled": sampled, "model": f"{student}/{PACKAGE}/model.py:TransformerLM"}


@pytest.mark.slow
def test_the_students_sweep_interrupted_resumes_by_the_command_it_prints_and_finishes(mine: dict):
    code, out = mine["interrupted"]
    assert code == 130, out[-3000:]
    assert mine["resumed"].returncode == 0, mine["resumed"].stderr[-3000:]
    ledger = read_outcomes(mine["dir"])
    assert len(ledger) == len(STUDENT_GRID) and all(e["outcome"] == "completed" for e in ledger.values()), ledger
    assert all(ledger[t]["outcome"] == o for t, o in mine["ended_before"].items())  # decided: not rerun
    for folder in trial_dirs(mine["dir"]).values():
        assert json.loads((folder / "config.json").read_text())["code"]["model"] == mine["model"]


@pytest.mark.slow
def test_a_resume_after_the_students_model_changed_is_refused_in_one_line_and_writes_nothing(mine: dict):
    assert_one_line_error(mine["refused"].returncode, mine["refused"].stderr, "changed since the sweep started",
                          "--trust-code")
    assert not mine["written_by_refused"]


@pytest.mark.slow
def test_the_report_names_the_students_model_and_says_what_is_estimated_and_not_measured(mine: dict):
    model = mine["summary"]["model"]
    assert model["name"] == mine["model"] and model["flops_counted"] and not model["attention_logits_measured"]
    text = (mine["dir"] / "report" / "lr_sweep_analysis.md").read_text()
    assert f"your `{mine['model']}`" in text and "Its attention logits are not measured for this model" in text
    assert "counted by torch's FlopCounterMode" in text
    assert "best lr" in mine["analyze"].stdout
    assert f"  checkpoint: {mine['summary']['best_checkpoint']}" in mine["analyze"].stdout.splitlines()


@pytest.mark.slow
def test_the_report_shows_the_best_lrs_samples_and_curves_against_wall_clock_time(mine: dict):
    summary = mine["summary"]
    assert [s["seed"] for s in summary["samples"]] == [0, 1], summary["samples_note"]
    assert all(s["prompt"] == "Once upon a time" and s["tokens"] > 0 for s in summary["samples"])
    text = (mine["dir"] / "report" / "lr_sweep_analysis.md").read_text()
    assert "## Samples from the best LR's model" in text and "> Once upon a time" in text
    assert_real_picture(mine["dir"] / "report" / "lr_sweep_comparison_wall.png")
    assert "`lr_sweep_comparison_wall.png`" in text


@pytest.mark.slow
def test_the_page_sample_command_samples_the_best_checkpoint(mine: dict):
    sampled = mine["sampled"]
    assert sampled.stdout.strip() and sampled.stderr.startswith(f"sampling {mine['summary']['best_checkpoint']}: ")


@pytest.mark.slow
@pytest.mark.release  # (the page's command as written: the release tier)
def test_the_learning_rate_problem_as_written_searches_the_edge_reports_the_target_and_samples(student: Path,
                                                                                               prepared: Path):
    run_as_written(command("run", "lr_edge"), student, *tiny())
    sweep = student / "results" / "lr_edge"
    assert read_search_state(sweep, "edge")["finished"]
    analyze = run_as_written(command("analyze", "results/lr_edge"), student)
    report = (sweep / "report" / "lr_sweep_analysis.md").read_text()
    assert "## Edge of stability" in report and "## Target" in report and "| top of the useful range |" in report
    summary = json.loads((sweep / "report" / "summary.json").read_text())
    assert "best lr" in analyze.stdout and f"  checkpoint: {summary['best_checkpoint']}" in analyze.stdout.splitlines()
    sampled = run_as_written(with_value(command("sample", "results/lr_edge"), "--max-tokens", "16"), student)
    assert sampled.stdout.strip() and sampled.stderr.startswith(f"sampling {summary['best_checkpoint']}: ")


# What `lmtune run` would start, worked out in the student's environment (their package imports only there): for each
# command given (a JSON list of argument lists), in one process.
PLAN = """
import json, sys
from lmtune.run import build_parser, sweep_options
from lmtune.sweep.experiment import plan_sweep
out = []
for args in json.loads(sys.argv[1]):
    plan = plan_sweep(sweep_options(build_parser().parse_args(args), args))
    out.append({"search": plan.space.strategy.name, "model": plan.base.code.model, "tokens": plan.base.total_tokens,
                "variants": [v.name for v in getattr(plan.space.strategy.settings, "variants", ())]})
print(json.dumps(out))
"""


def plans_of(student: Path, *requests: tuple[str, list[str]]) -> list[dict]:
    """The sweeps the page's commands for sweeps ``name`` would start, each with its ``extra`` settings on top."""
    commands = [[*command("run", name)[2:], *extra] for name, extra in requests]
    proc = run_command([str(python_of(student)), "-c", PLAN, json.dumps(commands)], cwd=student)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# The page's sweeps, planned: the CPU-sized edge searches as written, the compare problems with the tiny model on top.
PLANNED = {"quick_edge": [], "lr_edge_small": [], "batch": tiny(cpus=False, steps=128),
           "ablations": tiny(cpus=False, steps=128)}


@pytest.fixture(scope="module")
def plans(student: Path, prepared: Path) -> dict[str, dict]:
    return dict(zip(PLANNED, plans_of(student, *PLANNED.items()), strict=True))


@pytest.mark.parametrize(("name", "tokens"), [("quick_edge", 16 * 64 * 162), ("lr_edge_small", 16 * 128 * 500)])
def test_the_cpu_sized_commands_plan_the_edge_search_on_the_students_model_at_the_budget_the_page_says(
        name: str, tokens: int, student: Path, plans: dict[str, dict]):
    plan = plans[name]
    assert plan["search"] == "edge" and plan["tokens"] == tokens
    assert plan["model"] == f"{student}/{PACKAGE}/model.py:TransformerLM"


@pytest.mark.parametrize(("name", "variants"), [
    ("batch", ["batch_32", "batch_1", "batch_8", "batch_64", "batch_128", "batch_largest"]),
    ("ablations", ["reference", "no_pos_emb"])])
def test_the_compare_problems_plan_every_variant_on_the_students_model(name: str, variants: list[str],
                                                                      student: Path, plans: dict[str, dict]):
    plan = plans[name]
    assert plan["variants"] == variants and plan["model"] == f"{student}/{PACKAGE}/model.py:TransformerLM"


# Each compare command trains end to end as written, with the tiny model on top, at 32 base steps: a budget the batch
# sizes 1 to 128 all divide (batch 1 trains 256 steps, batch 128 two). Measured alone on this 2-core machine: the
# ablation command's two variants 108 s, the batch command's six (about 115 trials) 373 s; at 128 base steps the
# batch command took 923 s, batch 1's 1,024 steps the longest.
COMPARE_STEPS = 32


@pytest.mark.slow
@pytest.mark.release  # (the documentation's commands trained as written: the release tier)
@pytest.mark.timeout(1500)  # (the batch command alone took 373 s on a quiet day, and days vary 1.8x)
@pytest.mark.parametrize("name", ["ablations", "batch"])
def test_the_compare_problems_train_every_variant_and_report_each_at_its_own_best_lr(name: str, student: Path,
                                                                                     prepared: Path):
    """As written on the page, at a tiny budget: the search finishes, every trial trains the student's model for one
    of the planned variants, and the report's comparison gives each variant's best LR."""
    (planned,) = (plan["variants"] for plan in plans_of(student, (name, tiny(cpus=False, steps=COMPARE_STEPS))))
    run_as_written(command("run", name), student, *tiny(steps=COMPARE_STEPS))
    sweep = student / "results" / name
    assert read_search_state(sweep, "compare")["finished"]
    trained = set()
    for folder in trial_dirs(sweep).values():
        trained.add(json.loads((folder / "trial.json").read_text())["params"]["variant"])
        assert json.loads((folder / "config.json").read_text())["code"]["model"] == \
            f"{student}/{PACKAGE}/model.py:TransformerLM"
    assert trained == set(planned)
    run_as_written(["lmtune", "analyze", f"results/{name}"], student)
    rows = json.loads((sweep / "report" / "summary.json").read_text())["compare"]
    assert [row["name"] for row in rows] == planned and all(row["best_lr"] for row in rows)
