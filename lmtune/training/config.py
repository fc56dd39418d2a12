"""Typed run configuration: model shape, training hyperparameters and named budgets.

Configs are validated once, where their values enter (CLI flags and ``--set key=value``: ``apply_overrides``; a
search space's YAML: ``check_setting``; a trial's settings from a Tuner of the user's: ``apply_overrides``), so the
sweep's trials and the training code trust them. Field names are unique across ModelConfig and TrainConfig, so a
flat ``key=value`` always names exactly one field.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lmtune.errors import LmtuneError, shown
from lmtune.files import JsonObject
from lmtune.training.code import MODEL_ARG_PREFIX, UserCode, check_user_code, code_setting, is_code_setting
from lmtune.training.handout import HANDOUT_NAMES, canonical_settings, refused_handout_name
from lmtune.training.model_config import ABLATION_SWITCHES, FFNS, NORMS, POSITIONS, ModelConfig
from lmtune.training.schedule import COOLDOWN_SHAPES, SCHEDULES, cooldown_steps, stable_until


@dataclass
class TrainConfig:
    """Optimizer, schedule, budget and bookkeeping of one training run."""

    lr: float = 1e-3
    """Peak learning rate (alpha_max), reached at the end of warm-up."""
    min_lr_ratio: float = 0.1
    """The schedule's decay ends at lr * min_lr_ratio on the last step."""
    schedule: str = "cosine"
    """cosine | wsd (warmup-stable-decay: the peak LR until a cooldown over the last cooldown_fraction)."""
    cooldown_fraction: float = 0.2
    """WSD only: the share of the steps the cooldown takes (0 < f <= 1)."""
    cooldown_shape: str = "1-sqrt"
    """WSD only: the cooldown's shape: 1-sqrt | linear | cosine."""
    warmup_steps: int = 200
    """Steps of linear warm-up from 0 to lr."""
    steps: int = 5000
    """Optimizer steps in the run (the schedule's length)."""
    run_steps: int = 0
    """Stop after this many steps (0: all of ``steps``). The schedule still spans ``steps``, so such a run
    is the first part of the full one (a run cut short on purpose, e.g. to compare at an earlier token count)."""
    batch_size: int = 32
    """Sequences per optimizer step (the effective batch, whatever grad_accum_steps is)."""
    grad_accum_steps: int = 1
    """Micro-batches each step's batch is split into: the same update with 1/k of the activation memory."""
    weight_decay: float = 0.1
    """AdamW weight decay on the weight matrices (never on RMSNorm gains)."""
    beta1: float = 0.9
    """AdamW first-moment decay."""
    beta2: float = 0.95
    """AdamW second-moment decay."""
    eps: float = 1e-8
    """AdamW denominator epsilon."""
    grad_clip: float = 1.0
    """Largest global gradient norm; 0 disables clipping (the norm is still measured)."""
    log_interval: int = 50
    """Steps between rows of metrics.csv (and reports to a sweep)."""
    eval_interval: int = 500
    """Steps between validation losses."""
    eval_batches: int = 20
    """Fixed validation batches of batch_size windows each evaluation averages over."""
    checkpoint_interval: int = 1000
    """Steps between periodic checkpoints."""
    keep_checkpoints: int = 3
    """Periodic checkpoints kept (best.pt is kept apart)."""
    seed: int = 0
    """Initialisation and data order."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N | mps."""
    compile: str = "auto"
    """auto | on | off ("auto": on for CUDA/MPS; on CPU the choice measured faster for the model's size)."""
    compile_backend: str = "auto"
    """torch.compile's backend: auto (inductor; aot_eager on MPS) or any of torch.compiler.list_backends()."""
    compile_mode: str = "default"
    """torch.compile's mode: default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs."""
    precision: str = "auto"
    """auto | fp32 | bf16 ("auto": bf16 autocast on CUDA, fp32 elsewhere)."""

    def logs_at(self, step: int) -> bool:
        """A metrics row at this (1-based) step: every log_interval, and wherever it evaluates or checkpoints."""
        return (step % self.log_interval == 0 or self.evaluates_at(step) or self.checkpoints_at(step)
                or step == self.fork_step)

    @property
    def fork_step(self) -> int | None:
        """A WSD run's last step at its peak LR (1-based: the state after it): a longer run of the same LR and
        seed is identical up to here, so it can continue from this run's checkpoint there (stable.pt)."""
        return stable_until(self) + 1 if self.schedule == "wsd" else None

    @property
    def stop_step(self) -> int:
        """The step the run ends at: run_steps when set, else steps."""
        return self.run_steps or self.steps

    def evaluates_at(self, step: int) -> bool:
        return step % self.eval_interval == 0 or step == self.stop_step

    def checkpoints_at(self, step: int) -> bool:
        return step % self.checkpoint_interval == 0 or step == self.stop_step


@dataclass
class RunConfig:
    """Everything one training run needs: the model, the training settings, the user's own code it trains with, and
    where its data is."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The model's shape (a user's model gets its CS336 arguments from it) and lmtune's model's switches."""
    train: TrainConfig = field(default_factory=TrainConfig)
    budget: str = "low-resource"
    """The named budget the settings started from (BUDGETS), or "custom"."""
    data_dir: str = ""
    """A prepared data dir (python -m lmtune.prepare)."""
    vocab_from_data: bool = True
    """Take vocab_size from the data's meta.json (False once vocab_size is set explicitly)."""
    code: UserCode = field(default_factory=UserCode)
    """The user's model, optimizer and schedule (lmtune.usercode); empty fields: lmtune's own."""

    @property
    def tokens_per_step(self) -> int:
        return self.train.batch_size * self.model.context_length

    @property
    def total_tokens(self) -> int:
        """Tokens of the whole schedule (the budget)."""
        return self.tokens_per_step * self.train.steps

    @property
    def run_tokens(self) -> int:
        """Tokens this run trains: the budget, or fewer with run_steps."""
        return self.tokens_per_step * self.train.stop_step

    def to_dict(self) -> JsonObject:
        """Its JSON form (config.json, checkpoints, sweep.json's base_config); ``code`` only where the run trains the
        user's code (absent: lmtune's own, as in files of versions before it); the model's ablation switches only
        where one is set."""
        data = dataclasses.asdict(self)
        if self.code == UserCode():
            del data["code"]
        for name in ABLATION_SWITCHES:  # (at their defaults: absent, as in files of versions before them)
            if data["model"][name] == MODEL_FIELDS[name].default:
                del data["model"][name]
        return data

    @classmethod
    def from_dict(cls, data: JsonObject) -> RunConfig:
        return cls(ModelConfig(**data["model"]), TrainConfig(**data["train"]), data.get("budget", "custom"),
                   data.get("data_dir", ""), data.get("vocab_from_data", True), UserCode.from_dict(data.get("code")))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


# A setting's value, once coerced to its field's type.
Setting = int | float | bool | str

# Named budgets: "full" and "low-resource" are the CS336 assignment's (batch 128 x 10k steps and 32 x 5k
# steps of 256-token windows: 327.68M and 40.96M tokens). "quick" is sized to finish in 1-3 minutes on 2 CPU cores
# while its val loss still falls far below the corpus's unigram entropy.
BUDGETS: dict[str, dict[str, Setting]] = {
    "full": dict(batch_size=128, steps=10_000, context_length=256, warmup_steps=500, log_interval=50,
                 eval_interval=500, checkpoint_interval=1000),
    "low-resource": dict(batch_size=32, steps=5_000, context_length=256, warmup_steps=250, log_interval=50,
                         eval_interval=500, checkpoint_interval=500),
    "quick": dict(d_model=128, d_ff=384, n_layers=2, n_heads=4, context_length=128, batch_size=32, steps=400,
                  warmup_steps=40, lr=3e-3, log_interval=20, eval_interval=100, eval_batches=8,
                  checkpoint_interval=100),
}

MODEL_FIELDS = {f.name: f for f in dataclasses.fields(ModelConfig)}
TRAIN_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
PARAMETRIZATIONS = ("sp", "mup")
CHOICES = {  # (device: None, validated by the device module: cuda:N etc.)
    "parametrization": PARAMETRIZATIONS, "norm": NORMS, "position": POSITIONS, "ffn": FFNS, "device": None,
    "compile": ("auto", "on", "off"),
    "compile_mode": ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"),
    "precision": ("auto", "fp32", "bf16"), "schedule": SCHEDULES, "cooldown_shape": tuple(COOLDOWN_SHAPES),
}


# What to give instead of a value of the wrong type, by the field's type.
EXAMPLES = {int: "a whole number, e.g. 32", float: "a number, e.g. 3e-4", bool: "true or false", str: "text"}


def field_names() -> list[str]:
    return sorted([*MODEL_FIELDS, *TRAIN_FIELDS])


def field_type(name: str) -> type:
    refused_handout_name(name)
    own = HANDOUT_NAMES.get(name, name)
    spec = MODEL_FIELDS.get(own) or TRAIN_FIELDS.get(own)
    if spec is None:
        raise LmtuneError(f"unknown setting '{name}'; valid settings: {', '.join(field_names())} (and the CS336 "
                          f"handout's {', '.join(f'{k} for {v}' for k, v in HANDOUT_NAMES.items())})")
    return {"int": int, "float": float, "bool": bool, "str": str}[spec.type]


def coerce_value(name: str, value: object, where: str = "--set") -> Setting:
    """Convert ``value`` (a string from the CLI or a YAML scalar) to the type of field ``name`` (a code setting,
    lmtune.training.code.is_code_setting: as the user's model takes it)."""
    if is_code_setting(name):
        return code_setting(name, value, f"{where}.{name.removeprefix(MODEL_ARG_PREFIX)}")
    kind = field_type(name)
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if kind in (int, float) and isinstance(value, bool):  # (true is no number of steps, nor an LR)
            raise ValueError(value)
        if kind is int:
            number = float(value) if isinstance(value, (str, float)) else value
            if isinstance(number, float) and not number.is_integer():  # 2.9 steps is no number of steps
                raise ValueError(value)
            return int(number)
        if kind is float:
            return float(value)
        if not isinstance(value, str):
            raise ValueError(value)
        return value
    except (TypeError, ValueError):
        raise LmtuneError(f"{where}: {name}={shown(value)} is not a valid {kind.__name__}; "
                          f"give {EXAMPLES[kind]}") from None


# The largest LR a run accepts: far above any that trains (quick_edge's range test ends at 300, and tests
# drive runs to divergence at 1e5), far below float32's limit (3.4e38), near which AdamW's update overflows.
MAX_LR = 1e6
# Seeds seed numpy's and torch's generators; numpy's legacy seeding takes [0, 2**32 - 1].
MAX_SEED = 2**32 - 1


def accepted_lr(lr: float) -> bool:
    """An LR a run accepts: finite, above 0, at most MAX_LR."""
    return math.isfinite(lr) and 0 < lr <= MAX_LR


# The rule a setting meets on its own (rules between settings are validate's), held where its value enters: a space
# file's (check_setting, before Ray starts), --set's and a trial's from a Tuner of the user's (through validate).
SETTING_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "lr": (accepted_lr, f"a positive finite number at most {MAX_LR:g}"),
    "batch_size": (lambda n: n > 0, "a positive integer"),
    "seed": (lambda n: 0 <= n <= MAX_SEED, "an integer in [0, 2**32 - 1]"),
}


def broken_rule(name: str, value: Setting) -> str | None:
    """Why setting ``name`` cannot be ``value`` by its own rule (None: it can)."""
    holds, rule = SETTING_RULES.get(name, (None, ""))
    return None if holds is None or holds(value) else f"{name} must be {rule} (got {shown(value)})"


def check_setting(name: str, value: object, refuse: Callable[[str], Exception]) -> Setting:
    """``value`` (a YAML scalar) as setting ``name``'s type, held to its rule; ``refuse(message)`` is raised when it
    is not one (the caller names where the value stands)."""
    kind = field_type(name)
    try:
        coerced = coerce_value(name, value)
    except LmtuneError:
        raise refuse(f"{shown(value)} is not a valid {kind.__name__}; give {EXAMPLES[kind]}") from None
    if why := broken_rule(name, coerced):
        raise refuse(why)
    return coerced


def with_settings(config: RunConfig, settings: Mapping[str, Setting]) -> RunConfig:
    """A copy of ``config`` with ``settings`` (flat field names to values of their fields' types, and the code
    settings that name the user's model and its arguments) in place."""
    model = {name: value for name, value in settings.items() if name in MODEL_FIELDS}
    train = {name: value for name, value in settings.items()
             if name not in MODEL_FIELDS and not is_code_setting(name)}
    return dataclasses.replace(config, model=dataclasses.replace(config.model, **model),
                               train=dataclasses.replace(config.train, **train),
                               vocab_from_data=config.vocab_from_data and "vocab_size" not in model,
                               code=config.code.with_settings(settings))


def apply_overrides(config: RunConfig, overrides: Mapping[str, object], where: str = "--set") -> RunConfig:
    """Return a copy of ``config`` with ``overrides`` (flat field names: values as given, a --set string, a YAML
    scalar or a trial's value from a Tuner of the user's, coerced here) applied and validated."""
    overrides = canonical_settings(overrides, where)
    result = with_settings(config, {name: coerce_value(name, raw, where) for name, raw in overrides.items()})
    validate(result, where)
    return result


def budget_config(budget: str, overrides: Mapping[str, object] | None = None, data_dir: str = "",
                  code: UserCode | None = None) -> RunConfig:
    """The named budget's config with ``overrides`` applied on top, training ``code`` (None: lmtune's own)."""
    if budget not in BUDGETS:
        raise LmtuneError(f"unknown budget '{budget}'; choose one of {', '.join(BUDGETS)}")
    base = RunConfig(budget=budget, data_dir=data_dir, code=code or UserCode())
    merged = {**BUDGETS[budget], **canonical_settings(overrides or {})}
    return apply_overrides(base, merged, where="--set" if overrides else f"budget '{budget}'")


# lmtune's model's own switches, which a user's model does not read (its own flags go through --model-set).
LMTUNE_MODEL_ONLY = ("qk_norm", "norm_eps", "parametrization", "norm", "position", "ffn")


def validate(config: RunConfig, where: str = "config") -> None:
    """Raise LmtuneError (one line) for values no training run could use."""
    m, t = config.model, config.train

    def need(ok: bool, message: str) -> None:
        if not ok:
            raise LmtuneError(f"{where}: {message}")

    for name in ("vocab_size", "context_length", "d_model", "n_layers", "n_heads", "mup_base_width",
                 "mup_base_head_dim"):
        need(getattr(m, name) > 0, f"{name} must be a positive integer (got {getattr(m, name)})")
    need(m.ffn_width > 0, f"d_ff must be a positive integer (got {m.d_ff}; 0, for 4 x d_model, with ffn=silu only)")
    need(m.d_model % m.n_heads == 0, f"d_model ({m.d_model}) must be divisible by n_heads ({m.n_heads})")
    need(m.position != "rope" or (m.d_model // m.n_heads) % 2 == 0, "RoPE needs an even head dimension d_model/n_heads")
    need(m.parametrization == "sp" or m.norm == "pre", f"parametrization=mup is written and checked for the "
         f"pre-norm model (lmtune.training.coord_check), not norm={m.norm}; use parametrization=sp")
    need(math.isfinite(m.rope_theta) and m.rope_theta > 0, "rope_theta must be a positive number")
    need(math.isfinite(m.norm_eps) and m.norm_eps > 0, f"norm_eps must be a positive number (got {m.norm_eps})")
    need(math.isfinite(m.z_loss) and m.z_loss >= 0, "z_loss must be >= 0")
    for name in SETTING_RULES:
        why = broken_rule(name, getattr(t, name))
        need(why is None, why or "")
    need(math.isfinite(t.min_lr_ratio) and 0 <= t.min_lr_ratio <= 1, "min_lr_ratio must be in [0, 1]")
    need(t.grad_accum_steps > 0, f"grad_accum_steps must be a positive integer (got {t.grad_accum_steps})")
    need(t.batch_size % t.grad_accum_steps == 0,
         f"batch_size ({t.batch_size}) must be divisible by grad_accum_steps ({t.grad_accum_steps}); "
         "pick a grad_accum_steps that divides it")
    need(t.steps > 0, f"steps must be a positive integer (got {t.steps})")
    need(0 <= t.warmup_steps <= t.steps, f"warmup_steps must be in [0, steps={t.steps}] (got {t.warmup_steps})")
    need(math.isfinite(t.cooldown_fraction) and 0 < t.cooldown_fraction <= 1,
         f"cooldown_fraction must be in (0, 1] (got {t.cooldown_fraction})")
    if t.schedule == "wsd":
        cooldown = cooldown_steps(t)
        need(t.warmup_steps + cooldown <= t.steps, f"warmup_steps ({t.warmup_steps}) and the WSD cooldown "
             f"({cooldown} steps) do not fit in {t.steps} steps; lower warmup_steps or cooldown_fraction")
    need(0 <= t.run_steps <= t.steps, f"run_steps must be in [0, steps={t.steps}] (0: all steps; got {t.run_steps})")
    need(math.isfinite(t.weight_decay) and t.weight_decay >= 0, "weight_decay must be >= 0")
    need(0 <= t.beta1 < 1 and 0 <= t.beta2 < 1, "beta1 and beta2 must be in [0, 1)")
    need(math.isfinite(t.eps) and t.eps > 0, "eps must be > 0")
    need(math.isfinite(t.grad_clip) and t.grad_clip >= 0, "grad_clip must be >= 0 (0 disables clipping)")
    for name in ("log_interval", "eval_interval", "eval_batches", "checkpoint_interval", "keep_checkpoints"):
        need(getattr(t, name) > 0, f"{name} must be a positive integer (got {getattr(t, name)})")
    for name, choices in CHOICES.items():
        if choices is not None:
            value = getattr(m if name in MODEL_FIELDS else t, name)
            need(value in choices, f"{name} must be one of {', '.join(choices)} (got {shown(value)})")
    changed = {name: getattr(m, name) for name in LMTUNE_MODEL_ONLY if getattr(m, name) != MODEL_FIELDS[name].default}
    check_user_code(config.code, changed, t.schedule, need)
    if t.compile_backend != "auto":
        import torch

        backends = torch.compiler.list_backends(exclude_tags=())
        need(t.compile_backend in backends, f"compile_backend {shown(t.compile_backend)} is not a torch.compile "
             f"backend; use auto or one of {', '.join(b for b in backends if 'TESTING' not in b)}")


def run_config_of(raw: object) -> RunConfig | None:
    """A RunConfig as JSON (``to_dict``: a trial's config.json, sweep.json's base_config), read leniently: fields
    this version does not know left out, missing ones at their defaults; None when it is not one."""
    if not isinstance(raw, dict) or not isinstance(raw.get("model"), dict) or not isinstance(raw.get("train"), dict):
        return None
    try:
        model = {k: coerce_value(k, v, "config") for k, v in raw["model"].items() if k in MODEL_FIELDS}
        train = {k: coerce_value(k, v, "config") for k, v in raw["train"].items() if k in TRAIN_FIELDS}
    except LmtuneError:
        return None
    budget, data_dir, vocab_from_data = raw.get("budget", "custom"), raw.get("data_dir", ""), raw.get("vocab_from_data")
    if not (isinstance(budget, str) and isinstance(data_dir, str) and isinstance(vocab_from_data, bool | None)):
        return None
    return RunConfig.from_dict({**raw, "model": model, "train": train, "vocab_from_data": vocab_from_data is not False})
