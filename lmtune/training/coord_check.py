"""The μP coordinate check (Yang et al. 2022, Tensor Programs V, "coord check"; microsoft/mup's coord_check):
train the same model at several widths for a few steps at one fixed LR and watch the size of what each layer
writes. Under μP the sizes stay flat across width; under SP (standard parametrization) with Adam, the updates of
the hidden and output layers grow about linearly with width. Flat coordinates are what lets an LR tuned at a
small width transfer to a large one, so the check comes before trusting that transfer.

Per layer and width, on one fixed probe batch, after each of the first ``steps`` optimizer steps:
- activation scale: RMS of the layer's output;
- update scale: RMS of (output at step t - output at step 0).
The layers are what writes into the residual stream (the token embedding, each block's attention and SwiGLU)
and the model's own output logits (after any μP output multiplier). The slope of ln(scale) against ln(width)
at the last step summarises each: about 0 flat, about +1 growing like width.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from lmtune.data.batches import BatchSampler
from lmtune.data.dataset import load_data
from lmtune.errors import LmtuneError, shown
from lmtune.files import JsonObject, atomic_write_json
from lmtune.training.config import RunConfig, apply_overrides
from lmtune.training.loop import resolve_config
from lmtune.training.state import TrainState
from lmtune.training.step import Runtime, train_step

PARAMETRIZATIONS = ("sp", "mup")
# The default LR, measured on the built-in corpus (5 steps, 3 seeds): at 3e-3 SP's hidden and output update
# slopes reach +0.9 to +1.5 at widths 32-256 while μP's stay within 0.16 of 0; at 1e-3 μP's logits are still
# mostly their init (which μP's 1/m readout shrinks: slope -0.4); at 1e-2 SP saturates by width 256-512 (its
# logits' slope falls to +0.04) and μP's narrowest widths run at 4x the LR (hidden lr/m).
DEFAULT_LR = 3e-3
# |slope| of ln(scale) vs ln(width) at the last step below which a layer counts as flat. Measured at lr 3e-3,
# 5 steps, 3 seeds: μP's largest |slope| is 0.07 (widths 64-256, tests/test_coord_check.py's model), 0.14 (the
# quick budget's shape at 64-512) and 0.16-0.21 with width 32 included; SP's smallest hidden or output update
# slope is 0.37-0.97 and its largest 1.2-1.5. 0.25 clears μP's worst and sits below every SP verdict.
FLAT_TOLERANCE = 0.25
# The probe batch's sampler seed: one batch, the same for every width and seed.
PROBE_SEED = 12345


@dataclass(frozen=True)
class LayerScales:
    """One layer's scales across widths and steps, averaged over seeds."""

    name: str
    """The layer: embed, blocks.N.attn, blocks.N.ffn or logits."""
    activation: tuple[tuple[float, ...], ...]
    """activation[i][t]: RMS of the layer's output on the probe batch at widths[i] after t steps (t = 0: init)."""
    update: tuple[tuple[float, ...], ...]
    """update[i][t]: RMS of (output after t steps - output at init) on the probe batch (t = 0: 0)."""
    activation_slope: float
    """Least-squares slope of ln(activation) vs ln(width) at the last step."""
    update_slope: float
    """Least-squares slope of ln(update) vs ln(width) at the last step."""


@dataclass(frozen=True)
class CoordCheck:
    """A coordinate check of one parametrization: every layer's scales across widths over the first steps."""

    parametrization: str
    """sp or mup."""
    widths: tuple[int, ...]
    """d_model of each model, ascending."""
    steps: int
    """Optimizer steps taken at the constant LR (scales are recorded after 0, 1, ..., steps of them)."""
    lr: float
    """The base LR (μP's per-group multipliers apply on top of it)."""
    seeds: int
    """Initialisations (seeds 0 .. seeds-1) each scale is averaged over."""
    data: str
    """The prepared data dir the batches came from."""
    layers: tuple[LayerScales, ...]
    """Per layer, in the order they write into the residual stream, the logits last."""

    def layer(self, name: str) -> LayerScales:
        return next(layer for layer in self.layers if layer.name == name)

    def to_json(self) -> JsonObject:
        return asdict(self)

    @classmethod
    def from_json(cls, data: JsonObject) -> CoordCheck:
        layers = tuple(LayerScales(name=d["name"], activation=_table(d["activation"]), update=_table(d["update"]),
                                   activation_slope=float(d["activation_slope"]),
                                   update_slope=float(d["update_slope"])) for d in data["layers"])
        return cls(parametrization=str(data["parametrization"]), widths=tuple(int(w) for w in data["widths"]),
                   steps=int(data["steps"]), lr=float(data["lr"]), seeds=int(data["seeds"]), data=str(data["data"]),
                   layers=layers)


@dataclass(frozen=True)
class Verdict:
    """Whether a coordinate check is flat, and the layer that says most against it."""

    flat: bool
    """Every layer's |slope| (activation and update) at the last step is below the tolerance."""
    layer: str
    """The layer with the largest |slope|."""
    slope: float
    """That slope."""
    reason: str
    """One line: why flat or not."""


def _table(rows: list[list[float]]) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(v) for v in row) for row in rows)


def verdict(check: CoordCheck, tolerance: float = FLAT_TOLERANCE) -> Verdict:
    """Flat when every layer's activation and update slope at the last step is within ``tolerance`` of 0."""
    slopes = [(abs(s), layer.name, kind, s) for layer in check.layers
              for kind, s in (("activation", layer.activation_slope), ("update", layer.update_slope))]
    size, name, kind, slope = max(slopes, key=lambda row: (math.isnan(row[0]), row[0]))
    if math.isnan(slope):
        return Verdict(False, name, slope, f"{check.parametrization}: {name} {kind} scale is zero or not finite at "
                                           "some width: no slope")
    if size < tolerance:
        return Verdict(True, name, slope, f"{check.parametrization}: flat: every |slope| < {tolerance:g} "
                                          f"(largest: {name} {kind} {slope:+.2f})")
    return Verdict(False, name, slope, f"{check.parametrization}: not flat: {name} {kind} scale goes like "
                                       f"width^{slope:+.2f} (|slope| >= {tolerance:g})")


def log_log_slope(widths: list[int] | tuple[int, ...], scales: list[float]) -> float:
    """Least-squares slope of ln(scale) against ln(width); NaN if any scale is not positive and finite."""
    if not all(math.isfinite(s) and s > 0 for s in scales):
        return math.nan
    return float(np.polyfit(np.log(widths), np.log(scales), 1)[0])


def width_config(base: RunConfig, width: int, parametrization: str, lr: float, seed: int) -> RunConfig:
    """``base`` at d_model ``width``: d_ff in base's ratio to d_model, base's head dim (n_heads = width / head
    dim), at a constant ``lr`` (no warm-up), float32 and eager (a check of scales, not of speed)."""
    m = base.model
    head_dim = m.d_model // m.n_heads
    overrides = dict(d_model=width, d_ff=round(width * m.d_ff / m.d_model), n_heads=width // head_dim, lr=lr,
                     seed=seed, warmup_steps=0, precision="fp32", compile="off", parametrization=parametrization)
    return apply_overrides(base, overrides, where="coord check")


def check_inputs(base: RunConfig, widths: list[int], parametrization: str, steps: int, seeds: int,
                 lr: float = DEFAULT_LR, where: str = "") -> None:
    """Refuse, in one line naming the fix, what no coordinate check can measure (``where``: "--" names the
    CLI's flags, "" the arguments)."""
    head_dim = base.model.d_model // base.model.n_heads
    if parametrization not in PARAMETRIZATIONS:
        raise LmtuneError(f"{where}parametrization {shown(parametrization)}: choose sp or mup")
    shown_widths = ",".join(map(str, widths))
    if len(set(widths)) < 2:
        raise LmtuneError(f"{where}widths {shown_widths}: give at least 2 different widths, e.g. 64,128,256")
    bad = [w for w in widths if w <= 0 or w % head_dim]
    if bad:
        raise LmtuneError(f"{where}widths {shown_widths}: {','.join(map(str, bad))} are not positive multiples "
                          f"of the head dimension {head_dim} "
                          f"(d_model/n_heads of the base config); use multiples of {head_dim}, e.g. "
                          f"{','.join(str(head_dim * k) for k in (4, 8, 16))}")
    if steps < 1 or seeds < 1:
        raise LmtuneError(f"{where}steps ({steps}) and {where}seeds ({seeds}) must be at least 1")
    if not (math.isfinite(lr) and lr > 0):
        raise LmtuneError(f"{where}lr {lr}: give a positive learning rate, e.g. {DEFAULT_LR:g}")


def coord_check(base: RunConfig, widths: list[int], parametrization: str, steps: int = 5, lr: float = DEFAULT_LR,
                seeds: int = 3, device: torch.device | None = None) -> CoordCheck:
    """Train ``base`` at each width (``width_config``) for ``steps`` steps at the constant ``lr`` from ``seeds``
    initialisations (base's seed and the next ones), with the real model, AdamW (build_optimizer: μP's
    per-group LRs) and training step, on batches of base's data dir; base's mup_base_width is μP's base."""
    check_inputs(base, widths, parametrization, steps, seeds, lr)
    if not base.data_dir:  # measured: at widths 32-256 μP's slopes read -0.2 to -0.5 on uniform random ids
        raise LmtuneError("coord check: give a prepared data dir (data_dir); on uniform random token ids the "
                          "updates add up like noise at small widths and μP reads as shrinking")
    base = resolve_config(base, Path(base.data_dir))  # vocab_size from the data, as a training run takes it
    tokens = load_data(Path(base.data_dir), base.model.context_length, base.model.vocab_size).train
    widths = sorted(set(widths))
    runs = [[_one_run(width_config(base, w, parametrization, lr, base.train.seed + k), tokens, steps,
                      device or torch.device("cpu")) for k in range(seeds)] for w in widths]
    layers = tuple(_layer_scales(name, widths, [[run[name] for run in by_seed] for by_seed in runs])
                   for name in runs[0][0])
    return CoordCheck(parametrization, tuple(widths), steps, lr, seeds, base.data_dir, layers)


def _layer_scales(name: str, widths: list[int], runs: list[list[tuple[list[float], list[float]]]]) -> LayerScales:
    """One layer's LayerScales from runs[width][seed] = (activation RMS by step, update RMS by step)."""
    activation = _table([np.mean([run[0] for run in by_seed], axis=0).tolist() for by_seed in runs])
    update = _table([np.mean([run[1] for run in by_seed], axis=0).tolist() for by_seed in runs])
    return LayerScales(name, activation, update, log_log_slope(widths, [row[-1] for row in activation]),
                       log_log_slope(widths, [row[-1] for row in update]))


def probed_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules whose outputs write into the residual stream: the embedding, each block's attention and
    SwiGLU (the logits are taken from the model's own output)."""
    wanted = ("embed",) + tuple(f"blocks.{i}.{part}" for i in range(len(model.blocks)) for part in ("attn", "ffn"))
    named = dict(model.named_modules())
    return [(name, named[name]) for name in wanted]


@torch.no_grad()
def layer_outputs(model: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each probed module's output on ``x`` (float32 copies, by forward hooks) and the model's logits."""
    taken: dict[str, torch.Tensor] = {}
    hooks = [module.register_forward_hook(lambda _m, _i, out, name=name: taken.__setitem__(name, out.float()))
             for name, module in probed_modules(model)]
    try:
        taken["logits"] = model(x).float()
    finally:
        for hook in hooks:
            hook.remove()
    return taken


def _rms(t: torch.Tensor) -> float:
    return t.pow(2).mean().sqrt().item()


def _one_run(config: RunConfig, tokens: np.ndarray, steps: int, device: torch.device
             ) -> dict[str, tuple[list[float], list[float]]]:
    """Per layer: (activation RMS, update RMS) after 0 .. steps steps of one width and seed."""
    m, t = config.model, config.train
    state = TrainState.create(config, device)
    runtime = Runtime.build(state.model, config, device, compiled=False)
    probe, _ = BatchSampler(tokens, t.batch_size, m.context_length, seed=PROBE_SEED).batch(0)
    probe = probe.to(device)
    batches = BatchSampler(tokens, t.batch_size, m.context_length, seed=t.seed)
    first = layer_outputs(state.model, probe)
    scales = {name: ([_rms(out)], [0.0]) for name, out in first.items()}
    for step in range(steps):
        x, y = batches.batch(step)
        result = train_step(state, runtime, x.to(device), y.to(device), t.lr, t)
        if not bool(result.finite):
            raise LmtuneError(f"coord check: width {m.d_model}, seed {t.seed}: step {step + 1} was not finite at "
                              f"lr {t.lr:g}; lower --lr")
        for name, out in layer_outputs(state.model, probe).items():
            scales[name][0].append(_rms(out))
            scales[name][1].append(_rms(out - first[name]))
    return scales


def slope_table(checks: list[CoordCheck]) -> list[str]:
    """A line per layer: its activation and update slopes under each parametrization, then each verdict."""
    head = "".join(f"  {c.parametrization + ' act':>9} {c.parametrization + ' update':>11}" for c in checks)
    lines = [f"{'layer':<15}{head}"]
    for layer in checks[0].layers:
        cells = "".join(f"  {c.layer(layer.name).activation_slope:>+9.2f} {c.layer(layer.name).update_slope:>+11.2f}"
                        for c in checks)
        lines.append(f"{layer.name:<15}{cells}")
    return lines + [verdict(c).reason for c in checks]


def write_checks(path: Path, checks: list[CoordCheck]) -> None:
    """coord_check.json: {"checks": [one CoordCheck per parametrization]}, written atomically."""
    atomic_write_json(path, {"checks": [check.to_json() for check in checks]})


def read_checks(path: Path) -> list[CoordCheck]:
    return [CoordCheck.from_json(raw) for raw in json.loads(Path(path).read_text())["checks"]]
