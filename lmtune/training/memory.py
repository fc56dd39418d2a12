"""How much memory a run needs, and whether the machine has it: checked before a model is built, so an
absurd --set d_model=100000 is one line, not a 120 GB allocation."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch

from lmtune.errors import LmtuneError
from lmtune.training.config import RunConfig, with_settings
from lmtune.training.device import available_memory_bytes
from lmtune.training.lm import LanguageModelLoss
from lmtune.training.model import count_parameters
from lmtune.training.model_config import ModelConfig
from lmtune.training.spec import TrainSpec, lmtune_spec
from lmtune.training.state import seed_everything

# Per-process CUDA context, cuBLAS workspace and allocator slack that torch's allocator does not count.
CUDA_CONTEXT_BYTES = 600 * 2**20
# Share of a device's memory left free when packing trials or choosing the largest batch: allocator fragmentation
# and eval-time spikes.
MEMORY_HEADROOM = 0.10


def estimate_trial_memory_bytes(model_config: ModelConfig, batch_size: int, amp: bool) -> int:
    """Device memory of one training trial with ``batch_size`` sequences per forward pass (a micro-batch),
    without the CUDA context.

    Persistent: float32 parameters, gradients and AdamW's two moments = 16 bytes per parameter.
    Activations kept for backward, per token and layer: about 10 d_model-sized tensors (norm inputs,
    q/k/v before and after RoPE, attention output, residuals) and 4 d_ff-sized ones (gate, up, SiLU,
    product; 2 ungated), at 2 bytes under bf16 autocast, 4 without; attention itself adds nothing with a fused
    SDPA kernel. The output layer keeps the logits (2 or 4 bytes) plus the float32 copy the loss
    computes in and its gradient (8 bytes) per vocabulary entry. Plus 20% for allocator fragmentation.
    """
    m = model_config
    params = count_parameters(m)["total"]
    act_bytes = 2 if amp else 4
    tokens = batch_size * m.context_length
    ffn_tensors = 4 if m.ffn == "swiglu" else 2  # (gate, up, SiLU, product; an ungated FFN: up, SiLU)
    per_token = m.n_layers * (10 * m.d_model + ffn_tensors * m.ffn_width) * act_bytes + m.vocab_size * (act_bytes + 8)
    return int(1.2 * (16 * params + tokens * per_token))


def micro_batch(config: RunConfig) -> int:
    """Sequences per forward pass: the step's batch split into grad_accum_steps micro-batches."""
    return max(1, config.train.batch_size // config.train.grad_accum_steps)


def run_memory_bytes(config: RunConfig, amp: bool, members: int = 1, spec: TrainSpec | None = None) -> int:
    """Device memory of one run of ``config`` (a fused group: ``members`` models, their optimizer states and
    activations), with bf16 activations when ``amp``. A model lmtune knows (``spec``'s, None: lmtune's own):
    ``estimate_trial_memory_bytes``; one it knows only as a module (spec.model.measured_memory): 16 bytes per
    parameter counted from the module, and the activations of one micro-batch, measured (``measured_activations``),
    plus 20%."""
    spec = spec or lmtune_spec(config)
    if not spec.model.measured_memory:
        return members * estimate_trial_memory_bytes(config.model, micro_batch(config), amp)
    activations = measured_activations(config, amp, spec).of(micro_batch(config))
    return members * int(1.2 * (16 * spec.model.size(config, count_flops=False).total + activations))


def check_fits(config: RunConfig, device: torch.device, members: int = 1, where: str = "config",
               spec: TrainSpec | None = None) -> None:
    """Refuse, in one line, a run (or a fused group of ``members``) whose estimated memory exceeds what
    ``device`` has: the estimate is the one the sweep's packing uses, without bf16 on the CPU. A user's model whose
    weights and optimizer state alone do not fit is refused before its activations are measured (which builds it).
    ``spec``: the run's (None: lmtune's own)."""
    spec = spec or lmtune_spec(config)
    have = available_memory_bytes(device)
    params = spec.model.size(config, count_flops=False).total * members
    too_big = spec.model.measured_memory and have is not None and 16 * params > have
    need = 16 * params if too_big else run_memory_bytes(config, amp=device.type != "cpu", members=members, spec=spec)
    if have is not None and need > have:
        group = f"{members} fused models" if members > 1 else "the model"
        raise LmtuneError(f"{where}: {group} ({params:,} parameters, "
                          f"batch {micro_batch(config)} x {config.model.context_length}) needs about "
                          f"{need / 2**30:.1f} GiB, more than the {have / 2**30:.1f} GiB this {device.type} has "
                          "free; use a smaller d_model, n_layers, vocab_size, batch_size or context_length")


def usable_memory_bytes(device: torch.device) -> int | None:
    """What one run may fill on ``device``: its memory (available_memory_bytes) less MEMORY_HEADROOM, and a CUDA
    GPU's context besides; None where it cannot be read."""
    have = available_memory_bytes(device)
    if have is None:
        return None
    return int(have * (1 - MEMORY_HEADROOM)) - (CUDA_CONTEXT_BYTES if device.type == "cuda" else 0)


def largest_fitting_batch(config: RunConfig, device: torch.device, allowed: Callable[[int], bool],
                          limit: int | None = None, spec: TrainSpec | None = None) -> int | None:
    """The largest batch_size that ``allowed`` takes whose run of ``config`` fits ``device`` (usable_memory_bytes,
    or ``limit`` bytes), by the estimate check_fits and the sweep's packing use (bf16 activations off the CPU);
    None: not even batch 1 fits. The estimate is linear in the micro-batch, so two sizes give the bound."""
    limit = usable_memory_bytes(device) if limit is None else limit
    if limit is None:
        raise LmtuneError(f"the largest batch that fits: this {device.type}'s memory cannot be read; give a number")
    amp = device.type != "cpu"
    accum = config.train.grad_accum_steps

    def need(batch: int) -> int:
        return run_memory_bytes(with_settings(config, {"batch_size": batch}), amp=amp, spec=spec)

    one, two = need(accum), need(2 * accum)  # (micro-batches of one and two sequences)
    if one > limit:
        return None
    per_sequence = max(1, two - one)
    micro = 1 + (limit - one) // per_sequence
    batch = micro * accum
    while batch >= 1 and not (allowed(batch) and need(batch) <= limit):
        batch -= 1
    return batch if batch >= 1 else None


@contextlib.contextmanager
def out_of_memory(config: RunConfig, step: int) -> Iterator[None]:
    """A step that runs out of device memory is one line naming the fix, not an allocator dump (the estimate
    ``check_fits`` refuses by is an estimate; a user's model may keep more than one forward pass showed)."""
    try:
        yield
    except torch.cuda.OutOfMemoryError:
        raise LmtuneError(f"step {step}: out of device memory (batch {micro_batch(config)} x "
                          f"{config.model.context_length} per forward pass); lower batch_size, raise "
                          "grad_accum_steps, or use a smaller model") from None


@dataclass(frozen=True)
class ActivationBytes:
    """What a forward pass keeps for backward: a part whatever the batch (autocast's low-precision copies of the
    weights) and a part per sequence."""

    fixed: int
    per_sequence: int

    def of(self, batch: int) -> int:
        return self.fixed + batch * self.per_sequence


_activations: dict[tuple, ActivationBytes] = {}


def measured_activations(config: RunConfig, amp: bool, spec: TrainSpec) -> ActivationBytes:
    """What a forward pass of ``config``'s model and the loss keep for backward (bf16 autocast when ``amp``), measured
    once per process on the CPU from batches of one and two sequences of context_length tokens: every tensor saved
    for backward but the parameters themselves (counted apart). ``spec`` builds the model."""
    key = (repr(config.code.to_dict()), repr(sorted(asdict(config.model).items())), amp)
    if key not in _activations:
        seed_everything(config.train.seed)
        model = spec.model.build(config, torch.device("cpu"))
        one, two = (_saved_bytes(model, config, batch, amp) for batch in (1, 2))
        _activations[key] = ActivationBytes(max(0, 2 * one - two), max(0, two - one))
    return _activations[key]


def _saved_bytes(model: torch.nn.Module, config: RunConfig, batch: int, amp: bool) -> int:
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    x = torch.zeros(batch, config.model.context_length + 1, dtype=torch.long)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        LanguageModelLoss(model, config.model.z_loss)(x[:, :-1], x[:, 1:])
    return sum(saved.values())
