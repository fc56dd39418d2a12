"""Text from a trained model: a checkpoint's model (lmtune's; the user's with their consent: lmtune.usercode.spec)
loaded back, and tokens drawn one at a time with temperature and nucleus (top-p) sampling until ``<|endoftext|>`` or
the token limit.

    model, config = load_model(Path("results/NAME/TRIAL/checkpoints/best.pt"), device)
    ids = generate(model, prompt_ids, SampleSettings(max_tokens=256, temperature=0.8, top_p=0.9), ...)

No KV cache: each new token runs the model over the last ``context_length`` tokens, as a CS336 model's forward
takes them (a few seconds for 256 tokens of the 17M model on a CPU).
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from lmtune.errors import LmtuneError
from lmtune.training.checkpoint import load_checkpoint, why_unusable
from lmtune.training.config import RunConfig
from lmtune.training.spec import TrainSpec, lmtune_spec
from lmtune.training.state import check_same_parameters

# The largest seed a draw takes (torch.Generator.manual_seed's: an unsigned 64-bit integer).
MAX_SEED = 2**64 - 1
# The prompt a sample starts from unless told otherwise (CS336's: its models learn TinyStories).
DEFAULT_PROMPT = "Once upon a time"


def _unguarded(what: str) -> AbstractContextManager:
    return nullcontext()


@dataclass(frozen=True)
class SampleSettings:
    """How tokens are drawn."""

    max_tokens: int = 256
    """Tokens generated at most (fewer when the model ends the text)."""
    temperature: float = 0.8
    """Logits are divided by it before the softmax (0: always the most likely token)."""
    top_p: float = 0.9
    """Nucleus sampling: the smallest set of most likely tokens whose probabilities sum to at least this."""
    seed: int = 0
    """The draws' random seed."""

    def validate(self) -> None:
        if not 1 <= self.max_tokens <= 100_000:
            raise LmtuneError(f"--max-tokens must be from 1 to 100,000 (got {self.max_tokens})")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise LmtuneError(f"--temperature must be a number >= 0 (0: greedy; got {self.temperature})")
        if not (math.isfinite(self.top_p) and 0 < self.top_p <= 1):
            raise LmtuneError(f"--top-p must be in (0, 1] (got {self.top_p})")
        if not 0 <= self.seed <= MAX_SEED:
            raise LmtuneError(f"--seed must be from 0 to {MAX_SEED} (got {self.seed})")


def read_model_checkpoint(checkpoint: Path) -> tuple[RunConfig, dict[str, torch.Tensor]]:
    """The config and model weights a checkpoint holds (best.pt, or a periodic one); one line when the file cannot
    serve."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise LmtuneError(f"{checkpoint}: no such checkpoint file; give a run's checkpoints/best.pt")
    try:
        saved = load_checkpoint(checkpoint)
        return RunConfig.from_dict(saved["config"]), saved["model"]
    except (ValueError, RuntimeError, EOFError, OSError, KeyError, TypeError, pickle.UnpicklingError) as err:
        raise LmtuneError(f"{checkpoint} is not a usable lmtune checkpoint ({why_unusable(err)}); give a run's "
                          "checkpoints/best.pt") from None


def with_weights(model: nn.Module, weights: dict[str, torch.Tensor], checkpoint: Path) -> nn.Module:
    """``model`` holding ``weights`` (one line when they are not its parameters), in eval mode."""
    check_same_parameters(model, weights, str(checkpoint))
    model.load_state_dict(weights)
    return model.eval()


def load_model(checkpoint: Path, device: torch.device,
               spec_of: Callable[[RunConfig], TrainSpec] = lmtune_spec) -> tuple[nn.Module, RunConfig]:
    """The model a checkpoint holds, built as its own config says by ``spec_of``'s spec, in eval mode on ``device``
    (the default: lmtune's own model only; a user's model is code the checkpoint names, built only with the user's
    consent: lmtune.usercode.spec.load_model)."""
    config, weights = read_model_checkpoint(checkpoint)
    return with_weights(spec_of(config).model.build(config, device), weights, checkpoint), config


@torch.no_grad()
def generate(model: nn.Module, prompt: list[int], settings: SampleSettings, context_length: int,
             stop_id: int | None = None, guard: Callable[[str], AbstractContextManager] = _unguarded) -> list[int]:
    """Up to ``settings.max_tokens`` token ids following ``prompt`` (which must hold at least one token), ending
    before ``stop_id`` when the model draws it. ``guard(what)``: around each forward (a user's model's:
    lmtune.usercode.guard.user_call, whatever it raises one line naming its file and line; default none)."""
    if not prompt:
        raise LmtuneError("the prompt holds no tokens; give a prompt of at least one token")
    device = next(model.parameters()).device
    generator = torch.Generator(device="cpu").manual_seed(settings.seed)
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    generated: list[int] = []
    for _ in range(settings.max_tokens):
        window = ids[:, -context_length:]
        with guard(f"forward(token_ids of shape {tuple(window.shape)}) while sampling"):
            logits = model(window)[0, -1].float().cpu()
        token = next_token(logits, settings, generator)
        if token == stop_id:
            break
        generated.append(token)
        ids = torch.cat([ids, torch.tensor([[token]], device=device)], dim=1)
    return generated


def next_token(logits: torch.Tensor, settings: SampleSettings, generator: torch.Generator) -> int:
    """One token from ``logits`` (vocab,): the most likely at temperature 0, else drawn from the nucleus."""
    if settings.temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits / settings.temperature, dim=-1)
    ordered, order = probs.sort(descending=True)
    # Keep a token while the probability of those before it is below top_p: the first token is always kept.
    keep = (ordered.cumsum(0) - ordered) < settings.top_p
    nucleus = ordered * keep
    choice = torch.multinomial(nucleus / nucleus.sum(), 1, generator=generator)
    return int(order[choice])
