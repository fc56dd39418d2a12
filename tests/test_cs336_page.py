"""docs/cs336.md, run as written at a tiny budget (issue 56 item 3): a CS336 student's folder with the handout's
files (text and their own BPE's token arrays) and examples/cs336_model.py; the data commands as they stand, the
learning-rate sweep and its report and samples with a tiny model and a few steps set on top, the batch-size and
ablation spaces planned (every variant built and checked, as `lmtune run` does before any trial), and both compare
commands (ablations, batch sizes) trained end to end and reported."""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY, run_lmtune, trial_dirs
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from lmtune.data.corpus import stories
from lmtune.data.documents import EOT
from lmtune.run import build_parser, sweep_options
from lmtune.searches.state import read_search_state
from lmtune.sweep.experiment import plan_sweep

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "cs336.md"
# The page's model at test size, and a budget of a few steps (every interval within it).
TINY_SETTINGS = {**TINY, "n_layers": 1, "steps": 24, "warmup_steps": 4, "log_interval": 4, "eval_interval": 4,
                 "eval_batches": 1, "checkpoint_interval": 4}


def page_commands() -> list[list[str]]:
    """Every `lmtune ...` line of the page's bash blocks, split as a shell would."""
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S)
    return [shlex.split(line) for block in blocks for line in block.splitlines() if line.startswith("lmtune ")]


def command(name: str, first: str) -> list[str]:
    found = [c for c in page_commands() if c[1] == name and (len(c) < 3 or first in c)]
    assert len(found) == 1, f"docs/cs336.md has {len(found)} `lmtune {name}` commands naming {first}"
    return found[0]


def run_as_written(argv: list[str], folder: Path, *extra: str, timeout: float = 600):
    proc = run_lmtune(argv[1], *argv[2:], *extra, cwd=folder, timeout=timeout)
    assert proc.returncode == 0, f"{shlex.join(argv)}\n{proc.stderr[-3000:]}"
    return proc


def tiny(*, cpus: bool = True, steps: int = 24) -> list[str]:
    """The tiny model and budget on top of a command's own settings (``steps``: a budget every variant's batch
    divides: at batch 8, 32 steps leave batch 128 two)."""
    settings = {**TINY_SETTINGS, "steps": steps}
    return [*(f"--set={k}={v}" for k, v in settings.items()), *(["--num-cpus", "2"] if cpus else [])]


@pytest.fixture(scope="module")
def student(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A student's folder: the handout's two text files, their own BPE (vocab.json + merges.txt) and the token arrays
    it wrote, and examples/ (the page's stand-in for their model)."""
    root = tmp_path_factory.mktemp("cs336")
    shutil.copytree(REPO / "examples", root / "examples")
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
    names = [(c[1], c[2] if c[1] != "run" else c[c.index("--space") + 1]) for c in page_commands()]
    assert names == [("prepare", "--input"), ("prepare", "--tokens"), ("run", "lr_edge"),
                     ("analyze", "results/lr_edge"), ("run", "cs336_batch"),
                     ("run", "examples/cs336_ablations_own_model.yaml"),
                     ("sample", "results/lr_edge")]


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


@pytest.mark.slow
def test_the_learning_rate_problem_sweeps_reports_the_target_and_samples(student: Path, prepared: Path):
    run_as_written(command("run", "lr_edge"), student, *tiny(), timeout=900)
    proc = run_as_written(command("analyze", "results/lr_edge"), student, timeout=600)
    report = (student / "results" / "lr_edge" / "report" / "lr_sweep_analysis.md").read_text()
    assert "## Edge of stability" in report and "## Target" in report and "| top of the useful range |" in report
    assert "best lr" in proc.stdout
    summary = json.loads((student / "results" / "lr_edge" / "report" / "summary.json").read_text())
    assert f"  checkpoint: {summary['best_checkpoint']}" in proc.stdout.splitlines()  # (what the page points to)
    sampled = run_as_written(command("sample", "results/lr_edge"), student, "--max-tokens", "16")
    assert sampled.stdout.strip() and sampled.stderr.startswith(f"sampling {summary['best_checkpoint']}: ")


@pytest.mark.parametrize("space", ["cs336_batch", "examples/cs336_ablations_own_model.yaml"])
def test_the_compare_problems_plan_every_variant_on_the_students_model(space: str, student: Path, prepared: Path,
                                                                      monkeypatch: pytest.MonkeyPatch):
    plan = plan_of(space, student, monkeypatch)
    variants = [v.name for v in plan.space.strategy.settings.variants]
    assert len(variants) >= 2 and plan.base.code.model.endswith("examples/cs336_model.py:TransformerLM")


def plan_of(space: str, student: Path, monkeypatch: pytest.MonkeyPatch, steps: int = 128):
    """The sweep `lmtune run` would start for the page's command of ``space`` with the tiny settings on top."""
    monkeypatch.chdir(student)
    args = [*command("run", space)[2:], *tiny(cpus=False, steps=steps)]
    return plan_sweep(sweep_options(build_parser().parse_args(args), args))


# Each compare command trains end to end as written, with the tiny model on top, at 32 base steps: a budget the batch
# sizes 1 to 128 all divide (batch 1 trains 256 steps, batch 128 two). Measured alone on this 2-core machine: the
# ablation command's two variants 108 s, the batch command's six (about 115 trials) 373 s; at 128 base steps the
# batch command took 923 s, batch 1's 1,024 steps the longest.
COMPARE_STEPS = 32


@pytest.mark.slow
@pytest.mark.parametrize(("space", "name"), [("examples/cs336_ablations_own_model.yaml", "ablations"),
                                             ("cs336_batch", "batch")])
def test_the_compare_problems_train_every_variant_and_report_each_at_its_own_best_lr(
        space: str, name: str, student: Path, prepared: Path, monkeypatch: pytest.MonkeyPatch):
    """As written on the page, at a tiny budget: the search finishes, every trial trains the student's model for one
    of the planned variants, and the report's comparison gives each variant's best LR."""
    planned = [v.name for v in plan_of(space, student, monkeypatch, COMPARE_STEPS).space.strategy.settings.variants]
    run_as_written(command("run", space), student, *tiny(steps=COMPARE_STEPS), timeout=1800)
    sweep = student / "results" / name
    assert read_search_state(sweep, "compare")["finished"]
    trained = set()
    for folder in trial_dirs(sweep).values():
        trained.add(json.loads((folder / "trial.json").read_text())["params"]["variant"])
        assert json.loads((folder / "config.json").read_text())["code"]["model"].endswith(
            "examples/cs336_model.py:TransformerLM")
    assert trained == set(planned)
    run_as_written(["lmtune", "analyze", f"results/{name}"], student, timeout=600)
    rows = json.loads((sweep / "report" / "summary.json").read_text())["compare"]
    assert [row["name"] for row in rows] == planned and all(row["best_lr"] for row in rows)
