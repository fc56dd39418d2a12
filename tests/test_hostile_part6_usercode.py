"""What a hostile tester broke (part six, issue 57 items 4, 6-14 and 18) in the user's own code: each hostile module
is written here into tmp_path, as the issue describes it, and every call into it (its import, its build, the checks,
the forward of ``sample`` and of a report's samples) ends in one line naming the user's file and line, or works as
documented. Every test runs from an empty folder of its own and asserts nothing was written there (nor, for a
refusal, the run's folder at all)."""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import math
import sys
import textwrap
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY, assert_one_line_error, assert_refused, run_lmtune, run_python, set_args

import lmtune
from lmtune.errors import LmtuneError
from lmtune.lr_find import main as lr_find_main
from lmtune.report.samples import best_samples
from lmtune.sample import main as sample_main
from lmtune.train import main as train_main
from lmtune.training.checkpoint import checksum_path, load_checkpoint, periodic_checkpoints
from lmtune.training.config import budget_config
from lmtune.training.loop import resolve_config, train
from lmtune.usercode.checks import check_code
from lmtune.usercode.config import UserCode
from lmtune.usercode.consent import CodeConsent
from lmtune.usercode.optim import user_schedule
from lmtune.usercode.spec import spec_for

SHORT = {**TINY, "steps": 10, "eval_interval": 5, "checkpoint_interval": 5, "log_interval": 5}

# A CS336-shaped causal model: an embedding's running mean, then a linear head; {forward} is its forward's body
# (ids -> logits), {init} more of its __init__, {top} lines at the top of the module.
MODEL = """
import sys
import torch
from torch import nn
{top}

class Model(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta, **extra):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.out = nn.Linear(d_model, vocab_size)
        self.context_length = context_length
        {init}

    def forward(self, ids):
        {forward}
"""
MEAN = "torch.arange(1, ids.shape[-1] + 1).unsqueeze(-1)"
PLAIN = f"return self.out(self.embed(ids).cumsum(1) / {MEAN})"


def _write(folder: Path, forward: str = PLAIN, init: str = "pass", top: str = "", name: str = "model") -> str:
    """A user's model module written into ``folder``; its file spec."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(MODEL.format(forward=forward, init=init, top=textwrap.dedent(top)))
    return f"{path}:Model"


def _line_of(spec: str, fragment: str) -> str:
    """FILE:LINE of the first line of ``spec``'s file holding ``fragment``: where the guard must point."""
    path = Path(spec.rpartition(":")[0])
    number = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if fragment in line)
    return f"{path.name}:{number}"


@pytest.fixture(autouse=True)
def workdir(tmp_path, monkeypatch):
    """Each test runs in an empty folder of its own, which must stay empty: nothing written beside the user."""
    here = tmp_path / "cwd"
    here.mkdir()
    monkeypatch.chdir(here)
    argv = list(sys.argv)
    yield here
    assert sorted(p.name for p in here.iterdir()) == []
    assert sys.argv == argv  # the import's sys.argv is put back


def _train_args(spec: str, out: Path, data: Path, *more: str, settings: dict | None = None) -> list[str]:
    return ["--model", spec, "--out", str(out), "--data", str(data), "--quiet", *set_args(settings or SHORT), *more]


def _config(make_tiny_config, spec: str = "", **code):
    config = make_tiny_config(code=UserCode(model=spec, **code), **SHORT)
    return resolve_config(config, Path(config.data_dir))


# ---------------------------------------------------------------------------------------------
# 4. An optimizer whose state holds a numpy scalar; a resume that can load no checkpoint

NUMPY_SGD = """
import numpy as np
import torch

class NumpySGD(torch.optim.Optimizer):
    def __init__(self, params, lr, betas, eps, weight_decay):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                state["count"] = state.get("count", np.float64(0.0)) + np.float32(1.0)
                state["size"] = np.int64(p.numel())
                p.add_(p.grad, alpha=-group["lr"])
"""


def test_an_optimizer_holding_numpy_scalars_writes_checkpoints_that_load_and_resume(tmp_path, make_tiny_config,
                                                                                      caplog):
    (tmp_path / "opt.py").write_text(NUMPY_SGD)
    config = make_tiny_config(code=UserCode(optimizer=f"{tmp_path / 'opt.py'}:NumpySGD"), **SHORT)
    check_code(resolve_config(config, Path(config.data_dir)))
    out = tmp_path / "run"
    train(config, out, spec=spec_for(config))
    newest = periodic_checkpoints(out / "checkpoints")[-1]
    state = load_checkpoint(newest)  # weights_only=True
    counts = [s["count"] for s in state["optimizer"]["state"].values()]
    assert counts and all(isinstance(c, float) and c == 10.0 for c in counts)
    caplog.set_level(logging.INFO, logger="lmtune")
    result = train(config, out, resume=True, spec=spec_for(config))
    assert result.status == "completed"
    assert any("resuming from" in r.getMessage() and newest.name in r.getMessage() for r in caplog.records)
    assert not any("skipping" in r.getMessage() for r in caplog.records)


def test_an_optimizer_whose_state_no_checkpoint_can_hold_is_refused_before_training(tmp_path, builtin_data, capsys):
    (tmp_path / "opt.py").write_text(NUMPY_SGD.replace('np.int64(p.numel())', 'np.array([1, 2])'))
    out = tmp_path / "run"
    line = assert_refused(train_main, ["--optimizer", f"{tmp_path / 'opt.py'}:NumpySGD", "--out", str(out),
                                       "--data", str(builtin_data), *set_args(SHORT)], capsys,
                          "--optimizer", "its state holds numpy.ndarray,", "a checkpoint cannot hold")
    assert "weights_only=True" in line and not out.exists()


def test_a_resume_that_can_load_no_checkpoint_says_so_and_does_not_restart(tmp_path, builtin_data, capsys):
    out = tmp_path / "run"
    assert train_main(["--out", str(out), "--data", str(builtin_data), "--quiet", *set_args(SHORT)]) == 0
    capsys.readouterr()
    for path in periodic_checkpoints(out / "checkpoints"):  # as an earlier lmtune wrote a numpy scalar's state
        state = torch.load(path, weights_only=True)
        state["best_val_loss"] = np.float64(state["best_val_loss"])
        buffer = io.BytesIO()
        torch.save(state, buffer)
        path.write_bytes(buffer.getvalue())
        checksum_path(path).write_text(hashlib.sha256(buffer.getvalue()).hexdigest() + "\n")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (out / "checkpoints").iterdir())
    code = train_main(["--out", str(out), "--resume", "--quiet"])
    captured = capsys.readouterr()
    assert_one_line_error(code, captured.err, "--resume: none of the 2 checkpoint(s)", "step_00000010.pt",
                          "another --out")
    assert "completed" not in captured.out
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (out / "checkpoints").iterdir()) == before


# ---------------------------------------------------------------------------------------------
# 6. A file beside the model named as a standard module


@pytest.mark.slow
def test_a_sibling_named_as_a_standard_module_shadows_nothing_and_is_warned_of(tmp_path):
    folder = tmp_path / "code"
    spec = _write(folder)
    marker = tmp_path / "SHADOW_RAN"
    (folder / "profile.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (folder / "helper.py").write_text("VALUE = 3\n")
    script = (f"import logging; logging.basicConfig()\nfrom lmtune.usercode.imports import load\n"
              f"load({spec!r}, '--model')\nimport cProfile, profile, helper\nprint(profile.__file__, helper.VALUE)")
    proc = run_python("-c", script, cwd=tmp_path / "cwd")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert str(folder) not in proc.stdout and proc.stdout.strip().endswith(" 3")  # the standard one; neighbours work
    assert not marker.exists()
    warnings = [line for line in proc.stderr.splitlines() if "profile.py" in line]
    assert len(warnings) == 1 and "standard module" in warnings[0] and "rename" in warnings[0], proc.stderr


# ---------------------------------------------------------------------------------------------
# 7. A model that trains, then fails in sample and in a report's samples

CACHED_ARANGE = """if not hasattr(self, "positions"):  # the first call's length: any shorter window works
            self.positions = torch.arange(1, ids.shape[-1] + 1).unsqueeze(-1)
        return self.out(self.embed(ids).cumsum(1) / self.positions[:ids.shape[-1]])"""


@pytest.fixture
def cached_arange_run(tmp_path, make_tiny_config) -> tuple[str, Path]:
    spec = _write(tmp_path / "code", CACHED_ARANGE)
    config = make_tiny_config(code=UserCode(model=spec), **{**SHORT, "context_length": 16})
    check_code(resolve_config(config, Path(config.data_dir)))
    train(config, tmp_path / "trial", spec=spec_for(config))
    return spec, tmp_path / "trial"


def test_sample_of_a_model_whose_forward_fails_is_one_line_naming_its_line(cached_arange_run, capsys):
    spec, trial = cached_arange_run
    best = str(trial / "checkpoints" / "best.pt")
    line = assert_refused(sample_main, [best, "--trust-code", "--max-tokens", "4"], capsys, "--model",
                          "while sampling", "raised RuntimeError", _line_of(spec, "/ self.positions"))
    assert "fix it and run again" in line


def test_the_reports_samples_of_a_model_whose_forward_fails_say_why(cached_arange_run):
    spec, trial = cached_arange_run
    samples, why = best_samples(str(trial), 2, CodeConsent(trust=True))
    assert samples == () and why.startswith("not drawn: --model") and _line_of(spec, "/ self.positions") in why


# ---------------------------------------------------------------------------------------------
# 8. The gradient check: a forward on T-1 tokens, a module-level cache, an in-place op that breaks backward

BROKEN_BACKWARD = {
    "fixed-length positions": (
        "self.positions = nn.Parameter(torch.zeros(context_length, self.embed.embedding_dim))",
        "return self.out(self.embed(ids) + self.positions)", "+ self.positions"),
    "module-level cache": (
        "pass", """global CACHE
        if CACHE is None:
            CACHE = torch.arange(1, ids.shape[-1] + 1).unsqueeze(-1)
        return self.out(self.embed(ids).cumsum(1) / CACHE)""", "/ CACHE"),
    "in-place op": (
        "pass", """h = torch.sigmoid(self.embed(ids).cumsum(1))
        h.mul_(2)
        return self.out(h)""", None),
}


@pytest.mark.parametrize("kind", list(BROKEN_BACKWARD))
def test_the_gradient_check_of_a_model_that_breaks_is_one_line_naming_its_line(kind, tmp_path, builtin_data, capsys):
    init, forward, fragment = BROKEN_BACKWARD[kind]
    spec = _write(tmp_path / "code", forward, init, top="CACHE = None")
    out = tmp_path / "run"
    fix = "use its out-of-place form" if kind == "in-place op" else "lmtune feeds windows"
    line = assert_refused(train_main, _train_args(spec, out, builtin_data), capsys, f"--model {spec}",
                          "the gradient check", fix)
    if fragment:
        assert _line_of(spec, fragment) in line
    else:  # (autograd's long message, cut at a word's end, and no advice about windows)
        assert "lmtune feeds windows" not in line and " …;" in line
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# 9. sys.exit and argparse at import


@pytest.mark.parametrize("main", [train_main, lr_find_main], ids=["train", "lr_find"])
def test_a_module_calling_sys_exit_at_import_is_one_line_naming_its_line(main, tmp_path, builtin_data, capsys):
    spec = _write(tmp_path / "code", top="sys.exit(0)")
    out = tmp_path / "run"
    line = assert_refused(main, ["--model", spec, "--out", str(out), "--data", str(builtin_data)], capsys,
                          "running model.py called sys.exit(0)", _line_of(spec, "sys.exit(0)"))
    assert line.startswith(f"error: --model {spec}") and not out.exists()


def test_a_module_parsing_arguments_at_import_sees_none_of_lmtunes(tmp_path, make_tiny_config, capsys):
    spec = _write(tmp_path / "code", top="""
        import argparse
        ARGS = argparse.ArgumentParser().parse_args()
        """)
    saved, lmtunes = sys.argv, ["lmtune", "train", "--budget", "quick"]
    sys.argv = lmtunes
    try:
        assert check_code(_config(make_tiny_config, spec)).parameters > 0
        assert sys.argv is lmtunes  # put back after the import
    finally:
        sys.argv = saved
    assert "unrecognized arguments" not in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# 10. Dropout always on


def test_a_nondeterministic_forward_is_named_so_not_non_causal(tmp_path, make_tiny_config):
    spec = _write(tmp_path / "code", "return self.out(torch.nn.functional.dropout(self.embed(ids).cumsum(1) / "
                                     f"{MEAN}, 0.5, training=True))")
    with pytest.raises(LmtuneError, match="not deterministic in eval mode") as refused:
        check_code(_config(make_tiny_config, spec))
    assert "causal" not in str(refused.value) and "training=self.training" in str(refused.value)


# ---------------------------------------------------------------------------------------------
# 11. A schedule's number: numpy's, a Fraction


@pytest.mark.parametrize("value, accepted", [
    ("np.float32(lr)", True), ("Fraction(lr).limit_denominator(10**9)", True), ("np.float64(lr)", True),
    ("np.int64(0) if it else lr", True), ("np.float32('nan')", False), ("-Fraction(lr)", False),
    ("complex(lr, 0)", False), ("str(lr)", False)])
def test_a_schedule_may_return_any_finite_real_number_at_least_zero(value, accepted, tmp_path, make_tiny_config):
    (tmp_path / "sched.py").write_text(f"import numpy as np\nfrom fractions import Fraction\n\n"
                                       f"def schedule(it, lr, lo, warmup, cycle):\n    return {value}\n")
    config = _config(make_tiny_config, schedule=f"{tmp_path / 'sched.py'}:schedule")
    if accepted:
        table = user_schedule(config)
        assert math.isclose(table(0), config.train.lr, rel_tol=1e-6) and isinstance(table(1), float)
    else:
        with pytest.raises(LmtuneError, match="a learning rate is a finite number >= 0"):
            user_schedule(config)
    assert Fraction(1, 2) == 0.5  # (the module's Fraction is the standard one)


# ---------------------------------------------------------------------------------------------
# 12. lr_find --schedule


def test_lr_find_refuses_a_schedule_it_would_ignore(tmp_path, builtin_data, capsys):
    (tmp_path / "sched.py").write_text("def schedule(it, lr, lo, warmup, cycle):\n    return lr\n")
    out = tmp_path / "find"
    assert_refused(lr_find_main, ["--schedule", f"{tmp_path / 'sched.py'}:schedule", "--out", str(out), "--data",
                                  str(builtin_data)], capsys, "lr_find: --schedule", "ramps the LR itself",
                   "drop --schedule")
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# 13, 14, 18. sample: a moved model file, a seed out of range, a pickle payload


@pytest.fixture(scope="module")
def user_checkpoint(tmp_path_factory, builtin_data) -> Path:
    """best.pt of a 10-step run of a user's model whose file was then moved away."""
    root = tmp_path_factory.mktemp("moved")
    spec = _write(root / "code")
    config = budget_config("quick", SHORT, data_dir=str(builtin_data), code=UserCode(model=spec))
    train(config, root / "run", spec=spec_for(config))
    Path(spec.rpartition(":")[0]).rename(root / "elsewhere.py")
    return root / "run" / "checkpoints" / "best.pt"


@pytest.mark.slow
def test_sample_of_a_checkpoint_whose_model_file_moved_names_samples_own_flag(user_checkpoint):
    proc = run_lmtune("sample", str(user_checkpoint), "--trust-code")
    line = assert_one_line_error(proc.returncode, proc.stderr, "the checkpoint's model", "no file",
                                 "give --model PATH:NAME")
    assert "install your code" not in line and proc.stdout == ""
    moved = user_checkpoint.parents[2] / "elsewhere.py"
    proc = run_lmtune("sample", str(user_checkpoint), "--model", f"{moved}:Model", "--max-tokens", "3")
    assert proc.returncode == 0 and proc.stdout.startswith("Once upon a time"), proc.stderr[-2000:]


def test_sample_refuses_a_seed_out_of_range_in_one_line(user_checkpoint, capsys):
    assert_refused(sample_main, [str(user_checkpoint), "--seed", "99999999999999999999"], capsys,
                   f"--seed must be from 0 to {2**64 - 1}")
    assert_refused(sample_main, [str(user_checkpoint), "--seed", str(2**64 - 1), "--samples", "2"], capsys,
                   "--seed must be from 0 to")


def test_a_pickle_payload_checkpoint_is_one_line_and_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "PAYLOAD_RAN"

    class Payload:
        def __reduce__(self):
            return (Path.write_text, (marker, "ran"))

    path = tmp_path / "best.pt"
    buffer = io.BytesIO()
    torch.save({"model": Payload(), "config": {}}, buffer)
    path.write_bytes(buffer.getvalue())
    checksum_path(path).write_text(hashlib.sha256(buffer.getvalue()).hexdigest() + "\n")
    assert_refused(sample_main, [str(path)], capsys,
                   "is not a usable lmtune checkpoint (torch.load(weights_only=True) refused it: ")
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# 18. The Python API: a model's instance, a functools.partial


def test_a_model_instance_is_refused_in_one_line_without_its_repr(tmp_path):
    spec = _write(tmp_path / "code")
    from lmtune.usercode.imports import load

    instance = load(spec, "--model")(vocab_size=10, context_length=8, d_model=4, num_layers=1, num_heads=1, d_ff=8,
                                     rope_theta=1e4)
    with pytest.raises(LmtuneError) as refused:
        lmtune.Sweep("quick", model=instance)
    text = str(refused.value)
    assert "\n" not in text and "Model instance" in text and "give its class (Model)" in text


def test_a_partial_of_a_model_class_is_accepted_and_checked(tmp_path, make_tiny_config):
    spec = _write(tmp_path / "code", init="self.scale = extra['scale']",
                  forward=f"return self.scale * self.out(self.embed(ids).cumsum(1) / {MEAN})")
    from lmtune.api import user_code
    from lmtune.usercode.imports import load

    code = user_code(model=functools.partial(load(spec, "--model"), scale=2.0))
    assert code.model.startswith("python:Model")
    config = make_tiny_config(code=code, **SHORT)
    assert check_code(resolve_config(config, Path(config.data_dir))).parameters > 0
