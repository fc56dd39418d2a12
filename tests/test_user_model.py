"""The user's own model, optimizer and schedule (lmtune.usercode): imported and built as CS336's constructor is called,
checked before any step trains (each problem one line, nothing written), trained by lmtune's loop with everything
it measures, resumed exactly. The models are tests/user_models' (other names, argument orders, outputs) and
lmtune's example (examples/cs336_model.py)."""

from __future__ import annotations

import logging
import math
import re
import shutil
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import EXAMPLE, TINY, USER_MODELS, assert_refused, user_model

from lmtune.errors import LmtuneError, UserCodeError
from lmtune.train import main as train_main
from lmtune.training.lm import block_parameters
from lmtune.training.loop import resolve_config, train
from lmtune.training.memory import check_fits, measured_activations
from lmtune.training.metrics import read_metrics
from lmtune.training.model import TransformerLM, count_parameters
from lmtune.training.model_config import ModelConfig
from lmtune.usercode.checks import check_code, fusing_refusal
from lmtune.usercode.config import UserCode, normalized
from lmtune.usercode.guard import guarded
from lmtune.usercode.imports import load
from lmtune.usercode.model import build_user_model
from lmtune.usercode.spec import model_size, spec_for

CPU = torch.device("cpu")


def build_model(config):
    """The model of ``config`` on the CPU, as its training spec builds it."""
    return spec_for(config).model.build(config, CPU)
TINY_SETS = [arg for k, v in TINY.items() for arg in ("--set", f"{k}={v}")]


def _module(tmp_path: Path, name: str, source: str) -> str:
    """A user's module written into tmp_path; its file spec's folder part."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    return str(path)


# A model of the tests' own, written inline: CALLABLE(vocab_size, ...) -> a causal running mean of embeddings.
RUNNING_MEAN = """
    import torch
    from torch import nn

    class Mean(nn.Module):
        def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta, **extra):
            super().__init__()
            self.embed = nn.Embedding(vocab_size, d_model)
            self.out = nn.Linear(d_model, vocab_size)
            {init}

        def forward(self, ids):
            x = self.embed(ids).cumsum(1) / torch.arange(1, ids.shape[-1] + 1).unsqueeze(-1)
            return {output}
"""


def _inline(tmp_path: Path, make_tiny_config, output: str = "self.out(x)", init: str = "pass", name: str = "inline"):
    spec = _module(tmp_path, name, RUNNING_MEAN.format(output=output, init=init))
    return resolve_config(make_tiny_config(code=UserCode(f"{spec}:Mean")), Path(make_tiny_config().data_dir))


# ---------------------------------------------------------------------------------------------
# Naming the code


def test_a_file_spec_is_made_absolute_so_a_trial_in_another_folder_finds_it(monkeypatch):
    monkeypatch.chdir(EXAMPLE.rpartition("/examples/")[0])
    assert normalized("examples/cs336_model.py:TransformerLM", "--model") == EXAMPLE


@pytest.mark.parametrize("spec, fragment", [
    ("nosuchfile.py:Model", "no file"), ("model.py", "give MODULE:NAME"), ("a b:Model", "neither a module name"),
    ("examples/cs336_model.py:1Bad", "give MODULE:NAME")])
def test_a_malformed_spec_is_one_line_naming_the_form(spec, fragment):
    with pytest.raises(LmtuneError, match=fragment):
        normalized(spec, "--model")


def test_a_module_is_imported_from_the_current_directory(tmp_path, monkeypatch):
    _module(tmp_path, "mymodel_here", "class Model:\n    pass\n")
    monkeypatch.chdir(tmp_path)
    assert load("mymodel_here:Model", "--model").__name__ == "Model"


def test_a_missing_module_says_where_it_was_looked_for_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LmtuneError, match="no module named 'not_a_module_anywhere'.*PYTHONPATH.*give the file"):
        load("not_a_module_anywhere:Model", "--model")


def test_an_error_inside_the_users_module_names_its_file_and_line(tmp_path):
    spec = _module(tmp_path, "broken_at_import", "import math\n\nraise RuntimeError('boom')\n")
    with pytest.raises(LmtuneError, match=r"RuntimeError: boom \(broken_at_import.py:3\)"):
        load(f"{spec}:Model", "--model")


def test_a_missing_name_lists_the_classes_and_functions_the_file_defines():
    with pytest.raises(LmtuneError, match="cs336_model.py has no 'Transformer'.*TransformerLM"):
        load(EXAMPLE.replace(":TransformerLM", ":Transformer"), "--model")


# ---------------------------------------------------------------------------------------------
# Building it


def test_the_callable_gets_cs336s_arguments_from_the_config_and_device_and_dtype(tmp_path, make_tiny_config):
    spec = _module(tmp_path, "recorder", """
        import torch
        seen = {}
        def make(**kwargs):
            seen.update(kwargs)
            return torch.nn.Linear(1, 1)
    """)
    config = make_tiny_config(code=UserCode(f"{spec}:make", {"flag": True}))
    build_user_model(config.code, config.model, CPU)
    seen = load(f"{spec}:seen", "test")
    m = config.model
    assert seen == {"vocab_size": m.vocab_size, "context_length": m.context_length, "d_model": m.d_model,
                    "num_layers": m.n_layers, "num_heads": m.n_heads, "d_ff": m.d_ff, "rope_theta": m.rope_theta,
                    "flag": True, "device": CPU, "dtype": torch.float32}


def test_a_constructor_of_other_names_is_refused_naming_the_argument_and_the_factory(make_tiny_config):
    with pytest.raises(LmtuneError, match="takes no argument 'vocab_size'.*it takes: cfg.*write a factory"):
        check_code(make_tiny_config(code=user_model("gpt_style.py:GPT")))


def test_a_constructor_requiring_an_argument_lmtune_does_not_pass_is_refused_naming_it(tmp_path, make_tiny_config):
    spec = _module(tmp_path, "needs_more", """
        def make(vocab_size, context_len, d_model, num_layers, num_heads, d_ff, rope_theta, **rest):
            raise AssertionError("never called")
    """)
    with pytest.raises(LmtuneError, match="requires 'context_len'.*write a factory"):
        check_code(make_tiny_config(code=UserCode(f"{spec}:make")))


def test_model_set_passes_the_users_own_arguments(make_tiny_config):
    config = make_tiny_config(code=user_model("example", use_rope=False))
    model = build_model(config)
    assert all(layer.attn.rope is None for layer in model.layers)
    assert all(layer.attn.rope is not None for layer in build_model(make_tiny_config(code=user_model("example")))
               .layers)


@pytest.mark.parametrize("args, fragment", [({"use_rop": False}, "takes no argument 'use_rop'"),
                                            ({"d_model": 64}, "lmtune passes d_model itself")])
def test_model_set_refuses_an_argument_the_callable_lacks_or_lmtune_sets(make_tiny_config, args, fragment):
    with pytest.raises(LmtuneError, match=fragment):
        check_code(make_tiny_config(code=user_model("example", **args)))


@pytest.mark.parametrize("setting", [{"parametrization": "mup"}, {"qk_norm": True}, {"norm_eps": 1e-6}])
def test_lmtunes_own_model_switches_are_refused_for_a_users_model(make_tiny_config, setting):
    with pytest.raises(LmtuneError, match="is a switch of lmtune's model.*--model-set"):
        make_tiny_config(code=user_model("example"), **setting)


def test_a_model_that_ignores_its_dtype_is_converted_and_told_once(tmp_path, make_tiny_config, caplog):
    config = _inline(tmp_path, make_tiny_config, init="self.double()", name="float64_model")
    with caplog.at_level(logging.WARNING):
        first, second = build_model(config), build_model(config)
    assert {p.dtype for p in [*first.parameters(), *second.parameters()]} == {torch.float32}
    assert sum("other than torch.float32" in r.getMessage() for r in caplog.records) == 1


def test_a_model_that_ignores_its_device_is_moved_there_and_told(tmp_path, make_tiny_config, caplog):
    config = _inline(tmp_path, make_tiny_config, name="cpu_only_model")  # (its constructor takes no device)
    with caplog.at_level(logging.WARNING):
        model = build_user_model(config.code, config.model, torch.device("meta"))
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert any("lmtune moved them there" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------------------------
# The checks before training: one line each, nothing written


@pytest.mark.parametrize("model, fragment", [
    ("softmax_output.py:ProbabilityLM", "returns probabilities"),
    ("bidirectional.py:BidirectionalLM", "is not causal"),
    ("gpt_style.py:GPT", "write a factory")])
def test_a_model_that_would_train_wrong_is_refused_by_train_in_one_line_writing_nothing(model, fragment, tmp_path,
                                                                                        capsys):
    out = tmp_path / "run"
    assert_refused(train_main, ["--model", str(USER_MODELS / model), "--out", str(out), *TINY_SETS], capsys, fragment)
    assert not out.exists()


@pytest.mark.parametrize("output, fragment", [
    ("torch.log_softmax(self.out(x), -1)", "returns log-probabilities"),
    ("(self.out(x), None)", "returned a tuple, not a tensor of logits"),
    ("self.out(x)[..., :-1]", "lmtune needs floating-point logits of shape"),
    ("self.out(x) * float('nan')", "non-finite logits"),
    ("self.out(x.flip(1))", "is not causal")])
def test_each_wrong_output_is_refused_naming_what_lmtune_needs(tmp_path, make_tiny_config, output, fragment):
    with pytest.raises(LmtuneError, match=fragment):
        check_code(_inline(tmp_path, make_tiny_config, output, name=f"out_{abs(hash(output))}"))


# A model whose forward raises what a GPU out of memory raises (torch.cuda.OutOfMemoryError), or the same words as a
# RuntimeError of its own.
RAISES_IN_FORWARD = """
    import torch
    from torch import nn

    class Raises(nn.Module):
        def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta, **extra):
            super().__init__()
            self.embed = nn.Embedding(vocab_size, d_model)

        def forward(self, ids):
            raise {error}("CUDA out of memory. Tried to allocate 2.00 GiB")
"""


def test_a_gpu_out_of_memory_error_passes_the_guard_unchanged_where_other_errors_become_the_users_codes(
        tmp_path, make_tiny_config):
    """The guard around the user's code leaves torch.cuda.OutOfMemoryError as it is (lmtune.training.memory says
    what to lower); the same words raised as a RuntimeError are the user's code's error, one line naming its line."""
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(torch.cuda.OutOfMemoryError) as passed, guarded("--model", "m.py:LM", "its forward"):
        raise oom
    assert passed.value is oom

    def checked(error: str) -> pytest.ExceptionInfo:
        spec = _module(tmp_path, f"raises_{error.rpartition('.')[2]}", RAISES_IN_FORWARD.format(error=error))
        config = resolve_config(make_tiny_config(code=UserCode(f"{spec}:Raises")), Path(make_tiny_config().data_dir))
        with pytest.raises((torch.cuda.OutOfMemoryError, UserCodeError)) as raised:
            check_code(config)
        return raised

    raised = checked("torch.cuda.OutOfMemoryError")  # (check_code's forward, under the guard)
    assert type(raised.value) is torch.cuda.OutOfMemoryError
    assert str(raised.value) == "CUDA out of memory. Tried to allocate 2.00 GiB"
    raised = checked("RuntimeError")
    assert type(raised.value) is UserCodeError and "\n" not in str(raised.value)
    assert "raised RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (raises_RuntimeError.py:11)" in \
        str(raised.value)


def test_parameters_the_loss_gives_no_gradient_are_named_in_a_warning(tmp_path, make_tiny_config, caplog):
    config = _inline(tmp_path, make_tiny_config, init="self.unused = nn.Linear(3, 3)", name="with_unused")
    with caplog.at_level(logging.WARNING):
        found = check_code(config)
    assert found.no_gradient == ("unused.weight", "unused.bias")
    assert any("get no gradient" in r.getMessage() and "unused.weight" in r.getMessage() for r in caplog.records)


def test_a_fresh_model_far_above_the_uniform_loss_is_warned_about(tmp_path, make_tiny_config, caplog):
    config = _inline(tmp_path, make_tiny_config, "self.out(x) * 100", name="overconfident")
    with caplog.at_level(logging.WARNING):
        check_code(config)
    assert any("far above ln(vocab)" in r.getMessage() for r in caplog.records)


def test_a_model_sharing_a_module_between_builds_trains_alone_but_cannot_fuse(make_tiny_config, tmp_path):
    config = resolve_config(make_tiny_config(code=user_model("shared_rope.py:CachedRopeLM")),
                            Path(make_tiny_config().data_dir))
    found = check_code(config)
    assert found.shared and all(".rope." in name for name in found.shared)
    with pytest.raises(LmtuneError, match="--fuse 2: two builds of --model .* share .*module-level cache"):
        check_code(config, fuse=2)
    assert train(config, tmp_path / "alone", spec=spec_for(config)).status == "completed"


def test_a_model_vmap_cannot_run_is_refused_for_fusing_naming_why(tmp_path, make_tiny_config):
    config = _inline(tmp_path, make_tiny_config, "self.out(x) if float(x.sum()) > -1e30 else self.out(x)",
                     name="data_dependent")
    check_code(config)  # alone it trains
    assert "torch.func.vmap cannot run" in fusing_refusal(config)


def test_the_example_and_a_factory_built_model_fuse(make_tiny_config):
    for name in ("example", "gpt_style.py:make"):
        assert fusing_refusal(resolve_config(make_tiny_config(code=user_model(name)),
                                             Path(make_tiny_config().data_dir))) is None


# ---------------------------------------------------------------------------------------------
# Trained by lmtune's loop


def test_a_factory_built_model_trains_with_every_metric_lmtune_can_measure_of_it(make_tiny_config, tmp_path):
    config = make_tiny_config(code=user_model("gpt_style.py:make"), steps=20, lr=3e-3)
    result = train(config, tmp_path / "run", spec=spec_for(config))
    rows = read_metrics(tmp_path / "run" / "metrics.csv")
    assert result.status == "completed" and rows[-1]["train_loss"] < rows[0]["train_loss"]
    assert all(math.isfinite(r["grad_norm"]) and r["output_logit_max"] > 0 for r in rows)
    assert all(r.get("attn_logit_max") is None for r in rows)  # not exposed by this model: not measured
    assert {"update_ratio_l0", "update_ratio_l1"} <= rows[-1].keys() and "update_ratio_l2" not in rows[-1]
    summary = result.summary
    assert summary["flops_counted"] and not summary["flops_estimated"]  # FlopCounterMode counted them
    assert summary["model"].endswith("gpt_style.py:make")


def test_the_estimated_size_of_lmtunes_own_model_is_its_exact_count(tmp_path, make_tiny_config):
    spec = _module(tmp_path, "lmtune_as_user", """
        from lmtune.training.model_config import ModelConfig
        from lmtune.training.model import TransformerLM

        def make(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
            return TransformerLM(ModelConfig(vocab_size, context_length, d_model, d_ff, num_layers, num_heads,
                                             rope_theta))
    """)
    config = make_tiny_config(code=UserCode(f"{spec}:make"))
    estimated, exact = model_size(config, count_flops=False), model_size(replace(config, code=UserCode()))
    assert estimated.estimated and not exact.estimated
    assert (estimated.total, estimated.non_embedding, estimated.flops_per_token) == \
        (exact.total, exact.non_embedding, exact.flops_per_token) == \
        (count_parameters(config.model)["total"], count_parameters(config.model)["non_embedding"],
         exact.flops_per_token)
    counted = model_size(config)  # FlopCounterMode's count of the same model: within 1% of its exact formula
    assert counted.counted and counted.flops_per_token == pytest.approx(exact.flops_per_token, rel=0.01)


def test_blocks_are_found_by_layer_index_else_one_per_top_level_module():
    lmtune_model = TransformerLM(ModelConfig(vocab_size=50, d_model=16, d_ff=32, n_layers=3, n_heads=2))
    assert [len(b) for b in block_parameters(lmtune_model)] == [len(list(b.parameters())) for b in lmtune_model.blocks]
    flat = torch.nn.Sequential()
    flat.add_module("embed", torch.nn.Embedding(5, 4))
    flat.add_module("head", torch.nn.Linear(4, 5))
    assert [len(b) for b in block_parameters(flat)] == [1, 2]


def test_the_examples_optimizer_and_schedule_train_at_the_schedules_lrs(make_tiny_config, tmp_path):
    get_lr_cosine_schedule = load(f"{EXAMPLE.rpartition(':')[0]}:get_lr_cosine_schedule", "test")
    code = replace(user_model("example"), optimizer=f"{EXAMPLE.rpartition(':')[0]}:AdamW",
                   schedule=f"{EXAMPLE.rpartition(':')[0]}:get_lr_cosine_schedule")
    config = make_tiny_config(code=code, steps=20)
    check_code(config)
    result = train(config, tmp_path / "run", spec=spec_for(config))
    t = config.train
    assert result.status == "completed"
    for row in read_metrics(tmp_path / "run" / "metrics.csv"):
        want = get_lr_cosine_schedule(row["step"] - 1, t.lr, t.lr * t.min_lr_ratio, t.warmup_steps, t.steps - 1)
        assert row["lr"] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("source, spec, fragment", [
    ("import torch\nclass OwnLR(torch.optim.SGD):\n"
     "    def __init__(self, params, lr, betas, eps, weight_decay):\n        super().__init__(params, lr=lr)\n"
     "        self.mine = lr\n    def step(self, closure=None):\n        for g in self.param_groups:\n"
     "            for p in g['params']:\n                p.data.add_(p.grad, alpha=-self.mine)\n",
     "optimizer:OwnLR", "changed the parameters at param_group['lr'] = 0"),
    ("class NotOne:\n    pass\n", "optimizer:NotOne", "not a subclass of torch.optim.Optimizer"),
    ("import torch\nclass TwoArgs(torch.optim.SGD):\n    def __init__(self, params, lr):\n"
     "        super().__init__(params, lr=lr)\n", "optimizer:TwoArgs", "give it that signature"),
    ("def closure(max_lr):\n    return lambda it: max_lr\n", "schedule:closure",
     "lmtune calls f(it, max_learning_rate"),
    ("def nested(it, a, b, c, d):\n    return lambda: a\n", "schedule:nested", "returned a function"),
    ("def half(it, a, b, c, d):\n    return a / 2\n", "schedule:half", "peaks at"),
    ("def negative(it, a, b, c, d):\n    return -a if it else a\n", "schedule:negative", "a finite number >= 0")])
def test_an_optimizer_or_schedule_lmtune_cannot_drive_is_refused_in_one_line(tmp_path, make_tiny_config, source,
                                                                              spec, fragment):
    field, _, name = spec.partition(":")
    path = _module(tmp_path, f"{field}_{name}", source)
    with pytest.raises(LmtuneError, match=re.escape(fragment)):
        check_code(make_tiny_config(code=UserCode(**{field: f"{path}:{name}"})))


def test_a_schedule_of_the_users_own_replaces_lmtunes_so_wsd_is_refused(make_tiny_config):
    code = UserCode(schedule=f"{EXAMPLE.rpartition(':')[0]}:get_lr_cosine_schedule")
    with pytest.raises(LmtuneError, match="schedule=wsd picks one of lmtune's schedules"):
        make_tiny_config(code=code, schedule="wsd")


# ---------------------------------------------------------------------------------------------
# Resume


@pytest.mark.slow
def test_a_users_model_optimizer_and_schedule_resume_to_the_uninterrupted_run(make_tiny_config, tmp_path):
    folder = EXAMPLE.rpartition(":")[0]
    code = replace(user_model("example"), optimizer=f"{folder}:AdamW", schedule=f"{folder}:get_lr_cosine_schedule")
    spec = spec_for(make_tiny_config(code=code))
    whole = train(make_tiny_config(code=code), tmp_path / "whole", spec=spec)
    train(make_tiny_config(code=code, run_steps=20), tmp_path / "parts", spec=spec)
    resumed = train(make_tiny_config(code=code), tmp_path / "parts", resume=True, spec=spec)
    losses = [[(r["step"], r["train_loss"], r["val_loss"]) for r in read_metrics(d / "metrics.csv")]
              for d in (tmp_path / "whole", tmp_path / "parts")]
    assert losses[0] == losses[1]
    assert resumed.summary["best_val_loss"] == whole.summary["best_val_loss"]


def test_a_resume_whose_model_code_changed_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    copy = tmp_path / "code" / "changing_model.py"
    copy.parent.mkdir()
    shutil.copy(EXAMPLE.rpartition(":")[0], copy)
    out = tmp_path / "run"
    args = ["--model", f"{copy}:TransformerLM", "--out", str(out), *TINY_SETS, "--set", "run_steps=10", "--quiet"]
    assert train_main(args) == 0
    copy.write_text(copy.read_text().replace("self.ln_final", "self.final_norm"))
    monkeypatch.setattr("lmtune.usercode.imports._LOADED", {})
    import sys

    for name in [n for n in sys.modules if n.startswith("lmtune_user_changing_model")]:
        monkeypatch.delitem(sys.modules, name)
    # (--model named again: the edited file is the user's own, which the resume may import, and then refuses)
    assert_refused(train_main, ["--out", str(out), "--resume", "--set", "run_steps=0", "--model", args[1]], capsys,
                   "holds another model than the one built now", "ln_final.weight", "restore that code")


def test_a_resume_with_another_model_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert train_main(["--model", EXAMPLE, "--out", str(out), *TINY_SETS, "--set", "run_steps=10", "--quiet"]) == 0
    assert_refused(train_main, ["--out", str(out), "--resume", "--model", str(USER_MODELS / "gpt_style.py:make")],
                   capsys, "drop --model/--optimizer/--schedule")


# ---------------------------------------------------------------------------------------------
# Memory


def test_a_users_model_too_large_for_the_host_is_refused_before_it_is_built(make_tiny_config):
    config = make_tiny_config(code=user_model("example"), d_model=65536, d_ff=65536, n_heads=512)
    with pytest.raises(LmtuneError, match="lmtune builds it on the CPU to check and count it.*use a smaller d_model"):
        check_code(config)
    with pytest.raises(LmtuneError, match="needs about .* GiB"):
        check_fits(config, CPU, spec=spec_for(config))


def test_a_users_models_activations_are_measured_per_sequence_and_grow_with_the_context(make_tiny_config):
    def measured(context_length: int, amp: bool):
        config = make_tiny_config(code=user_model("example"), context_length=context_length)
        return measured_activations(config, amp, spec_for(config))

    short, long, long_bf16 = measured(16, False), measured(32, False), measured(32, True)
    assert 0 < short.per_sequence < long.per_sequence
    assert long_bf16.per_sequence < long.per_sequence  # bf16 activations
    assert long_bf16.fixed > long.fixed  # autocast's bf16 copies of the weights, kept whatever the batch
