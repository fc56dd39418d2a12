"""The user's code, checked before any step trains: each problem one line naming it and its fix, nothing written.

``check_code(config)`` is what every command (train, run, lr_find, bench) and the Python API call at their edge. On
a throw-away copy of the model, built on the CPU at the run's shape:

- it builds: the import, the call and its arguments (lmtune.usercode.model);
- ``forward(token_ids[2, T])`` returns one floating-point tensor of shape [2, T, vocab_size], finite;
- those are logits: not probabilities (every row summing to one) nor log-probabilities (every row's logsumexp 0),
  from which the cross-entropy lmtune computes would be wrong;
- it is deterministic in eval mode (the same tokens twice give the same logits: dropout follows self.training);
- it is causal: changing the later half of the tokens leaves the earlier positions' logits unchanged (otherwise the
  model sees the tokens it predicts, and its loss means nothing);
- a forward and backward on one token fewer run, and every trainable parameter gets a gradient from the loss (a
  warning, naming those that do not);
- a second build shares no parameter or buffer with the first (a module-level cache): such a model cannot fuse, and
  its trials each get a process of their own (``CodeCheck.shared``).

Every call into the user's code is guarded (lmtune.usercode.guard): whatever it raises is one line naming its file
and line. The optimizer and the schedule are checked by lmtune.usercode.optim. ``fusing_refusal`` says why a model
cannot be trained as a fused group (lmtune.fused), trying one fused step.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, replace

import torch
from torch import nn

from lmtune.errors import LmtuneError
from lmtune.training.config import RunConfig
from lmtune.training.lm import LanguageModelLoss
from lmtune.training.model import lm_loss
from lmtune.training.state import seed_everything
from lmtune.usercode.guard import guarded
from lmtune.usercode.model import check_host_memory
from lmtune.usercode.spec import spec_for

log = logging.getLogger(__name__)

CPU = torch.device("cpu")
# The window the checks run the model on: long enough to see a causal mask, short enough to be quick at any size.
CHECK_TOKENS = 32
WINDOWS = "lmtune feeds windows of up to context_length token ids (shorter ones too: the checks, sample) and needs " \
    "logits back"


# autograd's words for a tensor it needs that an in-place operation changed.
IN_PLACE = "modified by an inplace operation"


def backward_fix(err: BaseException) -> str:
    """The fix for a model whose gradient check failed: an in-place operation's, else the windows' (a shape)."""
    if IN_PLACE in str(err):
        return ("an in-place operation (x += ..., .add_(), ReLU(inplace=True), ...) changed a tensor backward needs: "
                "use its out-of-place form there")
    return WINDOWS


@dataclass(frozen=True)
class CodeCheck:
    """What the checks found of a model that passed them."""

    parameters: int
    """Its parameters (each tied one once)."""
    shared: tuple[str, ...] = ()
    """The parameters and buffers two builds of it share (a module-level cache): it cannot fuse, and each of its
    trials runs in a process of its own."""
    no_gradient: tuple[str, ...] = ()
    """Trainable parameters the loss gives no gradient (they do not train)."""


_checked: dict[tuple, CodeCheck] = {}


def _key(config: RunConfig, *extra: object) -> tuple:
    return (repr(config.code.to_dict()), repr(sorted(asdict(config.model).items())), *extra)


def check_code(config: RunConfig, fuse: int = 1) -> CodeCheck | None:
    """Every check of the user's code in ``config`` (None where it brings none): the model's, the optimizer's, the
    schedule's and, for ``fuse`` > 1 models per trial, whether it fuses. LmtuneError, one line, at the first
    problem."""
    from lmtune.usercode.optim import check_optimizer, user_schedule

    code = config.code
    found = check_model(config) if code.user_model else None
    if code.optimizer:
        check_optimizer(config)
    if code.schedule:
        user_schedule(config)
    if fuse > 1 and (refusal := fusing_refusal(config)):
        raise LmtuneError(f"--fuse {fuse}: {refusal}; use --fuse 1 (a trial per LR)")
    if found is not None and found.shared:
        log.warning("--model %s: two builds of the model share %s (a module-level cache): it cannot fuse, and each "
                    "trial of a sweep runs in a process of its own", code.model, ", ".join(found.shared[:4]))
    return found


def check_model(config: RunConfig) -> CodeCheck:
    """The user's model's checks (cached per process for one code and shape)."""
    key = _key(config)
    if key not in _checked:
        _checked[key] = _check_model(config)
    return _checked[key]


def _check_model(config: RunConfig) -> CodeCheck:
    spec, vocab = config.code.model, config.model.vocab_size
    check_host_memory(config.code, config.model)
    first = _fresh(config)
    if not any(p.requires_grad for p in first.parameters()):
        raise LmtuneError(f"--model {spec}: the model has no trainable parameters; nothing would train")
    x = torch.randint(0, vocab, (2, min(CHECK_TOKENS, config.model.context_length)),
                      generator=torch.Generator().manual_seed(0))
    first.eval()
    with torch.no_grad():
        logits = _logits(first, x, spec, vocab)
        _check_logits(logits, spec)
        _check_causal(first, x, logits, spec, vocab)
    first.train()
    no_gradient = _without_gradient(first, x, config)
    second = _fresh(config)
    shared = _shared_tensors(first, second)
    return CodeCheck(len({id(p) for p in first.parameters()}), tuple(shared), tuple(no_gradient))


def _fresh(config: RunConfig) -> nn.Module:
    seed_everything(config.train.seed)
    return spec_for(config).model.build(config, CPU)


def _logits(model: nn.Module, x: torch.Tensor, spec: str, vocab: int) -> torch.Tensor:
    shape = tuple(x.shape)
    with guarded("--model", spec, f"forward(token_ids of shape {shape}, int64)", WINDOWS):
        out = model(x)
    if not isinstance(out, torch.Tensor):
        raise LmtuneError(f"--model {spec}: forward(token_ids) returned a {type(out).__name__}, not a tensor of "
                          f"logits (batch, seq, vocab_size={vocab}); return the logits alone (a factory can wrap "
                          "your model in a module that does)")
    if tuple(out.shape) != (*shape, vocab) or not out.is_floating_point():
        raise LmtuneError(f"--model {spec}: forward(token_ids of shape {shape}) gave a {str(out.dtype)[6:]} tensor "
                          f"of shape {tuple(out.shape)}; lmtune needs floating-point logits of shape "
                          f"{(*shape, vocab)} (batch, seq, vocab_size)")
    return out.float()


def _check_logits(logits: torch.Tensor, spec: str) -> None:
    if not torch.isfinite(logits).all():
        raise LmtuneError(f"--model {spec}: a freshly built model gives non-finite logits (NaN or inf) before any "
                          "training; check its initialisation")
    ones = torch.ones(logits.shape[:-1])
    if (logits >= 0).all() and torch.allclose(logits.sum(-1), ones, atol=1e-3):
        raise LmtuneError(f"--model {spec}: forward returns probabilities (every row sums to 1): lmtune computes the "
                          "cross-entropy from logits, so the loss would be wrong; return the logits, before softmax")
    if (logits <= 0).all() and torch.allclose(logits.logsumexp(-1), torch.zeros_like(ones), atol=1e-3):
        raise LmtuneError(f"--model {spec}: forward returns log-probabilities (every row's logsumexp is 0): lmtune "
                          "computes the cross-entropy from logits; return the logits, before log_softmax")


def _check_causal(model: nn.Module, x: torch.Tensor, logits: torch.Tensor, spec: str, vocab: int) -> None:
    """Changing the second half of the tokens must leave the first half's logits as they were; the same tokens given
    again first must give the same logits (else the change tells nothing: a forward drawing random numbers)."""
    cut = x.shape[1] // 2
    tolerance = 1e-4 * max(1.0, float(logits.abs().max()))
    again = _logits(model, x, spec, vocab)
    if (drift := float((again - logits).abs().max())) > tolerance:
        raise LmtuneError(f"--model {spec}: is not deterministic in eval mode: the same token ids gave logits "
                          f"differing by {drift:.3g} on a second call (dropout or other randomness applied whatever "
                          "model.eval() says?); lmtune evaluates in eval mode, so make it follow self.training, e.g. "
                          "F.dropout(x, p, training=self.training)")
    changed = x.clone()
    changed[:, cut:] = (x[:, cut:] + 1) % vocab
    other = _logits(model, changed, spec, vocab)
    difference = (other[:, :cut] - logits[:, :cut]).abs().amax(dim=(0, 2))
    if (difference > tolerance).any():
        position = int((difference > tolerance).nonzero()[0])
        raise LmtuneError(f"--model {spec}: is not causal: changing the tokens at positions {cut} and later changed "
                          f"the logits at position {position} (by {float(difference[position]):.3g}); each position "
                          "must see only itself and earlier tokens (a causal attention mask), or the next-token "
                          "loss is meaningless")


# A fresh model's loss this many times ln(vocab) is warned about: lmtune's divergence rule measures from ln(vocab).
HIGH_INITIAL_LOSS = 1.5


def _without_gradient(model: nn.Module, x: torch.Tensor, config: RunConfig) -> list[str]:
    """The trainable parameters the loss of one step gives no (or an all-zero) gradient, warned about; and a fresh
    model's loss far above ln(vocab), which lmtune's divergence rule takes as where a fresh model starts."""
    spec, inputs = config.code.model, x[:, :-1]
    with guarded("--model", spec, f"the gradient check (forward of token_ids of shape {tuple(inputs.shape)}, the "
                 "loss, backward)", backward_fix):
        loss = lm_loss(model(inputs), x[:, 1:], config.model.z_loss)
        loss.backward()
    uniform = math.log(config.model.vocab_size)
    if float(loss.detach()) > HIGH_INITIAL_LOSS * uniform:
        log.warning("--model %s: a fresh model's loss is %.1f nats, far above ln(vocab) = %.2f (a uniform guess), "
                    "where lmtune's divergence rule starts: a run whose budget ends above %.2f is judged diverged; "
                    "a smaller initialization of the output layer starts the model near it", config.code.model,
                    float(loss.detach()), uniform, uniform)
    missing = [name for name, p in model.named_parameters()
               if p.requires_grad and (p.grad is None or not bool(p.grad.any()))]
    model.zero_grad(set_to_none=True)
    if missing:
        log.warning("--model %s: %d parameter(s) get no gradient from the loss and will not train: %s",
                    config.code.model, len(missing), ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else ""))
    return missing


def _shared_tensors(first: nn.Module, second: nn.Module) -> list[str]:
    """Names of ``first``'s parameters and buffers whose memory ``second`` holds too."""
    def storages(model: nn.Module) -> dict[int, str]:
        named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
        return {t.untyped_storage().data_ptr(): name for name, t in named if t.numel() > 0}

    theirs = storages(second)
    return sorted(name for pointer, name in storages(first).items() if pointer in theirs)


def builds_share_state(config: RunConfig) -> bool:
    """Whether one build of ``config``'s model leaves state the next build in the same process starts from (a
    module-level cache of the user's model, which check_model found), so that a worker process must not train
    another trial after one. lmtune's own model shares nothing."""
    return config.code.user_model and bool(check_model(config).shared)


def fusing_refusal(config: RunConfig) -> str | None:
    """Why ``config``'s model cannot train as a fused group (None: it can). lmtune's own model always fuses; a
    user's must run under torch.func.vmap, share nothing between builds, and train with lmtune's AdamW (a fused
    group updates its members with its own, lmtune.fused.optim)."""
    code = config.code
    if code.optimizer:
        return (f"a fused group trains its members with lmtune's AdamW (lmtune.fused.optim), not --optimizer "
                f"{code.optimizer}")
    if not code.user_model:
        return None
    shared = check_model(config).shared
    if shared:
        return (f"two builds of --model {code.model} share {', '.join(shared[:3])} (a module-level cache), which "
                "fused members would then share too; create them inside the model's __init__")
    key = _key(config, "fuses")
    if key not in _checked:
        _checked[key] = _try_fusing(config)
    return _checked[key]


def _try_fusing(config: RunConfig) -> str | None:
    """One fused forward and backward of two members against each member alone: None when they agree."""
    from lmtune.fused.model import FusedLM

    members = [_fresh(replace(config, train=replace(config.train, seed=seed))) for seed in (0, 1)]
    x = torch.randint(0, config.model.vocab_size, (2, min(CHECK_TOKENS, config.model.context_length) + 1),
                      generator=torch.Generator().manual_seed(1))
    inputs, targets = x[:, :-1], x[:, 1:]
    try:
        fused = FusedLM(members, config.model.z_loss, spec_for(config).model)
        losses = fused(inputs, targets)
        losses.sum().backward()
    except Exception as err:  # noqa: BLE001 - whatever vmap cannot run in the user's forward
        text = str(err).strip().splitlines()[0][:120] if str(err).strip() else ""
        return (f"torch.func.vmap cannot run --model {config.code.model}'s forward ({type(err).__name__}: {text}), "
                "so its members cannot be trained as one fused model")
    alone = torch.stack([LanguageModelLoss(m, config.model.z_loss)(inputs, targets) for m in members])
    if not torch.allclose(losses.detach(), alone.detach(), rtol=1e-4, atol=1e-5):
        return (f"under torch.func.vmap, --model {config.code.model}'s members give other losses than each model "
                f"alone ({losses.tolist()} against {alone.tolist()}), so fusing would not train the same runs")
    return None
