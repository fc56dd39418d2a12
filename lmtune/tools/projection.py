"""What a GPU should do with a config, worked out on paper from the model's shapes: an ESTIMATE, never a
measurement (``python -m lmtune.bench --project DEVICE``; ``scripts/gpu_check.sh`` measures).

Per token of training: the FLOPs of the forward and backward passes (lmtune.training.model.flops_per_token)
and the bytes the step moves through device memory (below). A roofline bounds the rate by the device's
peak compute and by its memory bandwidth times the arithmetic intensity; what small GPTs reach in
practice is far below the bound, so the estimate is a range of model FLOP utilisation (MFU) taken from
published runs:

- about 10%: nanoGPT's 10.65M-parameter character model at context 256 trains in about 3 minutes on an
  A100 (about 0.45M tokens/s);
- about 33%: modded-nanogpt's GPT-2 124M speedruns reach about a third of an H100's dense bf16 peak.

(CS336's handout, for the 17M model of the full budget, says 30-40 minutes on an H100: about 2% MFU; its
low-resource run on an M3 Max's MPS GPU took 36 minutes: about 19k tokens/s, 15% of the chip's float32
rate.)
"""

from __future__ import annotations

from dataclasses import dataclass

from lmtune.training.config import RunConfig, budget_config
from lmtune.training.device import PEAKS
from lmtune.training.model import count_parameters, flops_per_token
from lmtune.training.model_config import ModelConfig

# Memory bandwidth, bytes/s, from the vendors' data sheets (the M3 Max: its 40-core GPU's 400 GB/s).
BANDWIDTH: dict[str, float] = {"H100": 3.35e12, "A100": 2.04e12, "RTX 4090": 1.008e12, "Apple M3 Max": 0.4e12}
# The devices the projection is written for, by the names lmtune.training.device.PEAKS knows.
DEVICES = {"h100": "H100", "a100": "A100", "4090": "RTX 4090", "m3max": "Apple M3 Max"}
MFU_RANGE = (0.10, 0.33)
# Bytes per parameter a step moves besides the activations: weights read in forward and backward (float32,
# 4 + 4), a bf16 copy written and read twice under autocast (2 x 3), the gradient written and read
# (4 + 4), and AdamW reading and writing the weight and both moments (4 x 3 x 2).
PARAM_BYTES_PER_STEP = 4 + 4 + 2 * 3 + 4 + 4 + 4 * 3 * 2


@dataclass(frozen=True)
class Projection:
    device: str
    flops_per_token: float
    bytes_per_token: float
    peak_flops: float
    bandwidth: float
    bound_tokens_per_s: float
    """The roofline: min(peak, bandwidth x intensity) / FLOPs per token."""
    tokens_per_s: tuple[float, float]
    """At MFU_RANGE of the peak (and never above the roofline)."""

    @property
    def intensity(self) -> float:
        return self.flops_per_token / self.bytes_per_token

    def hours(self, tokens: float) -> tuple[float, float]:
        """How long ``tokens`` take at the range's ends, slowest first."""
        return tokens / self.tokens_per_s[0] / 3600, tokens / self.tokens_per_s[1] / 3600


def bytes_per_token(model: ModelConfig, tokens_per_step: int, activation_bytes: int = 2) -> float:
    """Device-memory traffic of a training step per token: the parameters' share (PARAM_BYTES_PER_STEP each,
    spread over the step's tokens) and the activations, each written in the forward pass, read in the
    backward and its gradient written there (3 passes over about 10 d_model- and 4 d_ff-sized tensors per
    layer, and the logits: 2 bytes under bf16 plus the float32 copy and gradient the loss takes, 8)."""
    params = count_parameters(model)["total"]
    layers = model.n_layers * (10 * model.d_model + 4 * model.d_ff) * activation_bytes * 3
    logits = model.vocab_size * (activation_bytes + 8) * 3
    return PARAM_BYTES_PER_STEP * params / tokens_per_step + layers + logits


def project(config: RunConfig, device: str) -> Projection:
    """The estimate for ``device`` (a key of DEVICES) in the precision lmtune trains in there: bf16 on a GPU
    with bf16 tensor cores, float32 elsewhere (MPS included)."""
    name = DEVICES[device]
    peak = PEAKS[name]
    bf16 = peak.bf16 is not None and not name.startswith("Apple")
    compute = peak.bf16 if bf16 else peak.fp32
    flops = flops_per_token(config.model)
    moved = bytes_per_token(config.model, config.tokens_per_step, activation_bytes=2 if bf16 else 4)
    bound = min(compute, BANDWIDTH[name] * flops / moved) / flops
    low, high = (min(m * compute / flops, bound) for m in MFU_RANGE)
    return Projection(name, flops, moved, compute, BANDWIDTH[name], bound, (low, high))


def budget_tokens(budget: str) -> int:
    return budget_config(budget).total_tokens


def projection_table(config: RunConfig, devices: list[str]) -> list[str]:
    """The projection as a markdown table, headed by its assumptions: an estimate, said so."""
    moved = bytes_per_token(config.model, config.tokens_per_step) / 1e3
    lines = [
        f"ESTIMATE, not a measurement: {config.model.d_model}-wide, {config.model.n_layers}-layer model, "
        f"{config.train.batch_size} x {config.model.context_length} tokens a step; "
        f"{flops_per_token(config.model) / 1e6:.1f} MFLOP and {moved:.0f} kB of memory traffic per token (bf16; "
        f"float32 on MPS); MFU {MFU_RANGE[0]:.0%}-{MFU_RANGE[1]:.0%} as published for small GPTs "
        "(lmtune/tools/projection.py says which).", "",
        "| device | peak (TFLOP/s) | bandwidth (TB/s) | FLOP per byte | roofline bound (tokens/s) | estimate "
        "(tokens/s) | low-resource, 40.96M tokens | full, 327.68M tokens |",
        "|---|---|---|---|---|---|---|---|"]
    for device in devices:
        p = project(config, device)
        low, high = p.tokens_per_s
        low_h, full_h = p.hours(budget_tokens("low-resource")), p.hours(budget_tokens("full"))
        lines.append(f"| {p.device} | {p.peak_flops / 1e12:.0f} | {p.bandwidth / 1e12:.2f} | {p.intensity:.0f} | "
                     f"{p.bound_tokens_per_s / 1e6:.2f}M | {low / 1e3:,.0f}k-{high / 1e3:,.0f}k | "
                     f"{_duration(low_h[1])}-{_duration(low_h[0])} | {_duration(full_h[1])}-{_duration(full_h[0])} |")
    return lines


def _duration(hours: float) -> str:
    if hours < 1 / 60:
        return f"{hours * 3600:.0f} s"
    return f"{hours * 60:.0f} min" if hours < 1 else f"{hours:.1f} h"
