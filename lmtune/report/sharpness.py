"""Sharpness: the top Hessian eigenvalue of the training loss, raw and Adam-preconditioned, at a
trial's checkpoints (python -m lmtune.analyze --sharpness).

Cohen et al. 2021: under full-batch GD the sharpness rises to about 2/lr and hovers there (the edge of
stability). Cohen et al. 2022: under Adam it is the *preconditioned* sharpness, the top eigenvalue of
P^-1/2 H P^-1/2 with P = diag(sqrt(v_hat) + eps), that hovers near (2 + 2 beta1) / ((1 - beta1) lr),
38/lr for beta1 = 0.9. Both are estimated by power iteration on
Hessian-vector products (double backward) on one fixed batch.
"""

from __future__ import annotations

import csv
import io
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn
from torch.optim.optimizer import StateDict

from lmtune.data.batches import fixed_val_batches
from lmtune.data.dataset import load_data
from lmtune.errors import LmtuneError
from lmtune.files import atomic_write_text
from lmtune.findings.sharpness import SHARPNESS_COLUMNS, Sharpness, SharpnessRow, adam_threshold, gd_threshold
from lmtune.findings.stability import TrialRecord, classify
from lmtune.sweep.sweep_file import SweepRecord
from lmtune.tools.terminal_progress import each
from lmtune.training.checkpoint import Checkpoint, load_checkpoint
from lmtune.training.config import RunConfig, run_config_of
from lmtune.training.lm import LanguageModelLoss
from lmtune.training.model_config import ModelConfig
from lmtune.training.spec import ModelSpec
from lmtune.training.state import optimizer_order
from lmtune.usercode.spec import spec_for

log = logging.getLogger(__name__)

Vector = list[torch.Tensor]


def _dot(a: Vector, b: Vector) -> torch.Tensor:
    return sum((x * y).sum() for x, y in zip(a, b, strict=True))


def _hvp_operator(loss_fn: Callable[[], torch.Tensor], params: Vector) -> Callable[[Vector], Vector]:
    """v -> H v for the loss at ``params``; the gradient graph is built once and reused."""
    loss = loss_fn()
    grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
    needs = [g is not None and g.requires_grad for g in grads]
    if not any(needs):  # the loss is (at most) linear in params: H = 0
        return lambda vec: [torch.zeros_like(p) for p in params]
    live = [i for i, ok in enumerate(needs) if ok]

    def hvp(vec: Vector) -> Vector:
        outputs = [grads[i] for i in live]
        products = torch.autograd.grad(outputs, params, grad_outputs=[vec[i] for i in live],
                                       retain_graph=True, allow_unused=True)
        return [torch.zeros_like(p) if h is None else h.detach() for h, p in zip(products, params, strict=True)]

    return hvp


def _top_algebraic(matvec: Callable[[Vector], Vector], like: Vector, iters: int, tol: float, seed: int,
                   largest: bool) -> float:
    """Largest-magnitude eigenvalue, or with ``largest`` the largest (algebraic) one.

    Power iteration finds the eigenvalue of largest magnitude; when that one is negative (lambda_min)
    and ``largest`` is asked, a second power iteration on H - lambda_min I (eigenvalues >= 0, its top
    one lambda_max - lambda_min) gives lambda_max. Sharpness in Cohen et al. is lambda_max.
    """
    first = _power_iteration(matvec, like, iters, tol, seed)
    if not largest or not (math.isfinite(first) and first < 0):
        return first

    def shifted(vec: Vector) -> Vector:
        return [h - first * v for h, v in zip(matvec(vec), vec, strict=True)]

    # Convergence is judged on the unshifted value: the shifted operator maps the bulk of near-zero
    # eigenvalues to about -lambda_min, where a random start vector already looks like an eigenvector.
    return _power_iteration(shifted, like, iters, tol, seed, offset=first) + first


def _power_iteration(matvec: Callable[[Vector], Vector], like: Vector, iters: int, tol: float, seed: int,
                     offset: float = 0.0) -> float:
    """Eigenvalue of largest magnitude of a symmetric operator (Rayleigh quotient of the iterate).

    Converged when the Rayleigh quotient changed by at most ``tol`` (relative) since the last iteration
    and the residual |Av - lambda v| is at most sqrt(tol) |lambda|: the first test alone stops too
    early while the start vector has almost no weight on the top eigenvector (quotient still flat).
    ``offset``: both are taken relative to |lambda + offset| (the eigenvalue before a shift by -offset).
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    vec = [torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.device, p.dtype) for p in like]
    norm = math.sqrt(float(_dot(vec, vec)))
    vec = [v / norm for v in vec]
    eigenvalue = 0.0
    for i in range(max(iters, 1)):
        product = matvec(vec)
        estimate = float(_dot(vec, product))
        norm = math.sqrt(float(_dot(product, product)))
        if norm == 0.0 or not math.isfinite(norm):
            return estimate if math.isfinite(estimate) else float("nan")
        scale = max(abs(estimate + offset), 1e-12)
        residual = math.sqrt(max(norm * norm - estimate * estimate, 0.0))  # |Av - lambda v| for |v| = 1
        converged = i > 0 and abs(estimate - eigenvalue) <= tol * scale and residual <= math.sqrt(tol) * scale
        eigenvalue = estimate
        if converged:
            break
        vec = [p / norm for p in product]
    return eigenvalue


def hessian_top_eigenvalue(loss_fn: Callable[[], torch.Tensor], params: list[torch.Tensor], iters: int = 50,
                           tol: float = 1e-4, seed: int = 0, largest: bool = False) -> float:
    """Largest-magnitude eigenvalue of the Hessian of ``loss_fn()`` w.r.t. ``params`` (``largest``: the
    largest algebraic one, i.e. the sharpness even where a negative eigenvalue dominates).

    ``loss_fn`` must evaluate the loss on one fixed batch (close over it). Power iteration stops after
    ``iters`` Hessian-vector products or once the Rayleigh quotient changes by less than ``tol``
    (relative) between iterations.
    """
    params = list(params)
    return _top_algebraic(_hvp_operator(loss_fn, params), params, iters, tol, seed, largest)


def adam_preconditioner(exp_avg_sq: list[torch.Tensor], step: int, beta2: float, eps: float) -> Vector:
    """Diagonal of P = sqrt(v_hat) + eps with v_hat = v / (1 - beta2^step), Adam's effective preconditioner."""
    if step < 1:
        raise LmtuneError(f"preconditioned sharpness needs an optimizer that took a step (step={step})")
    correction = 1.0 - beta2**step
    return [(v.detach() / correction).sqrt() + eps for v in exp_avg_sq]


def preconditioned_sharpness(loss_fn: Callable[[], torch.Tensor], params: list[torch.Tensor],
                             exp_avg_sq: list[torch.Tensor], step: int, beta2: float, eps: float, iters: int = 50,
                             tol: float = 1e-4, seed: int = 0, largest: bool = False) -> float:
    """Largest-magnitude (``largest``: largest) eigenvalue of P^-1/2 H P^-1/2, P = diag(sqrt(v_hat) + eps).

    Cohen et al. 2022.

    ``exp_avg_sq`` are Adam's second-moment estimates (one per param, same shapes), ``step`` the
    number of optimizer steps taken (for the bias correction). Compare with :func:`adam_threshold`.
    """
    params = list(params)
    if len(exp_avg_sq) != len(params):
        raise LmtuneError(f"{len(exp_avg_sq)} second-moment tensors for {len(params)} parameters")
    inv_sqrt = [(1.0 / d.sqrt()).to(p.device, p.dtype)
                for d, p in zip(adam_preconditioner(exp_avg_sq, step, beta2, eps), params, strict=True)]
    hvp = _hvp_operator(loss_fn, params)

    def matvec(vec: Vector) -> Vector:
        scaled = hvp([v * s for v, s in zip(vec, inv_sqrt, strict=True)])
        return [h * s for h, s in zip(scaled, inv_sqrt, strict=True)]

    return _top_algebraic(matvec, params, iters, tol, seed, largest)


def _run_config(model: ModelConfig | None, state: Checkpoint) -> RunConfig:
    """The checkpoint's own config (a RunConfig.to_dict(): its model's code and shape), its shape replaced by
    ``model`` where given."""
    config = run_config_of(state.get("config"))
    if config is None and model is None:
        raise LmtuneError("checkpoint has no config; pass the model config explicitly")
    if config is None:
        return RunConfig(model=model)
    return replace(config, model=model) if model is not None else config


def _optimizer_order(model: nn.Module, spec: ModelSpec) -> list[torch.Tensor]:
    """Parameters in the order build_optimizer (lmtune.training.state) gives AdamW: its param groups' (``spec``
    built the model)."""
    params = dict(model.named_parameters())
    return [params[name] for name in optimizer_order(model, spec)]


def _second_moments(model: nn.Module, optimizer_state: StateDict, spec: ModelSpec) -> tuple[Vector, int] | None:
    """Adam's exp_avg_sq per model parameter (model.parameters() order) and the step count."""
    ids = [i for group in optimizer_state.get("param_groups", []) for i in group["params"]]
    state = optimizer_state.get("state", {})
    if not ids or any(i not in state or "exp_avg_sq" not in state[i] for i in ids):
        return None
    moments = [state[i]["exp_avg_sq"] for i in ids]
    params = list(model.parameters())
    for order in (_optimizer_order(model, spec), params):
        if len(order) == len(moments) and all(p.shape == m.shape for p, m in zip(order, moments, strict=True)):
            by_param = {id(p): m.float() for p, m in zip(order, moments, strict=True)}
            step = int(float(state[ids[0]]["step"]))
            return [by_param[id(p)] for p in params], step
    raise LmtuneError("the checkpoint's optimizer state does not match the model's parameters")


def checkpoint_sharpness(checkpoint_path: Path, model_config: ModelConfig | None,
                         batch: tuple[torch.Tensor, torch.Tensor], iters: int = 50, tol: float = 1e-4,
                         seed: int = 0, largest: bool = False) -> Sharpness:
    """Sharpness and Adam-preconditioned sharpness of a training checkpoint on one fixed batch.

    Computed in float32 on CPU, lmtune's model with its reference attention path (SDPA lacks double backward on
    some builds; a user's model runs as written: ModelSpec.plain_attention). ``model_config``: the model's shape
    (None: the checkpoint's own config's). The preconditioned value is None when the checkpoint holds no optimizer
    state.
    ``largest``: the largest algebraic eigenvalues instead of the largest-magnitude ones.
    """
    state = load_checkpoint(Path(checkpoint_path))
    config = _run_config(model_config, state)
    spec = spec_for(config).model
    model = spec.build(config, torch.device("cpu"))
    model.load_state_dict(state["model"])
    spec.plain_attention(model)  # (SDPA lacks double backward on some builds)
    model.train()
    x, y = (t.to("cpu") for t in batch)
    params = list(model.parameters())
    loss = LanguageModelLoss(model, config.model.z_loss)

    def loss_fn() -> torch.Tensor:
        return loss(x, y)

    optimizer_state = state.get("optimizer")
    group = optimizer_state["param_groups"][0] if optimizer_state else {}
    beta1, beta2 = group.get("betas", (None, None))
    eps = group.get("eps")
    lr = group.get("lr")
    own = run_config_of(state.get("config"))
    if lr is None and own is not None:  # Step k was taken with the schedule's value at 0-based index k - 1.
        lr = spec_for(own).schedule.lr_function(own)(max(state["step"] - 1, 0))
    lr = float(lr) if lr is not None else None

    sharp = hessian_top_eigenvalue(loss_fn, params, iters=iters, tol=tol, seed=seed, largest=largest)
    pre = None
    moments = _second_moments(model, optimizer_state, spec) if optimizer_state else None
    if moments is not None and beta2 is not None:
        exp_avg_sq, step = moments
        pre = preconditioned_sharpness(loss_fn, params, exp_avg_sq, step, float(beta2), float(eps),
                                       iters=iters, tol=tol, seed=seed, largest=largest)
    result = Sharpness(int(state["step"]), lr, sharp, pre, gd_threshold(lr) if lr else None,
                       adam_threshold(lr, float(beta1)) if lr and beta1 is not None else None)
    log.info("sharpness at step %d: %.4g (2/lr %.4g), preconditioned %s (Adam threshold %s)", result.step,
             sharp, result.gd_threshold or float("nan"), pre, result.adam_threshold)
    return result


# ---------------------------------------------------------------------------------------------
# A sweep's sharpness


def sharpness_trials(records: list[TrialRecord], best_trial_id: str | None) -> list[TrialRecord]:
    """The best trial and the trial at the largest non-diverged LR (once if they coincide)."""
    chosen = [r for r in records if r.trial_id == best_trial_id][:1]
    healthy = [r for r in records if classify(r) != "diverged" and r.periodic_checkpoints]
    if healthy:
        largest = max(healthy, key=lambda r: (r.lr, r.trial_id))
        if all(largest is not c for c in chosen):
            chosen.append(largest)
    return chosen


def sharpness_batch(record: SweepRecord, context_length: int, batch_size: int = 4):
    """A fixed validation batch (batch_size x context) from the sweep's data dir."""
    data_dir = record.data.dir or (record.plan.base.data_dir if record.plan else "")
    if not data_dir or not Path(data_dir).is_dir():
        raise LmtuneError(f"--sharpness needs the sweep's data dir ({data_dir or 'not recorded in sweep.json'}), "
                          "which is missing; restore it there or run without --sharpness")
    data = load_data(Path(data_dir), context_length)
    return fixed_val_batches(data.val, batch_size, context_length, 1)[0]


def sweep_sharpness(record: SweepRecord, records: list[TrialRecord], best_trial_id: str | None,
                    iters: int = 100, tol: float = 1e-4) -> list[SharpnessRow]:
    """checkpoint_sharpness at every remaining periodic checkpoint of :func:`sharpness_trials`.

    The largest (algebraic) Hessian eigenvalue, not the largest-magnitude one: late in training a
    negative-curvature direction can dominate in magnitude, and sharpness is the top eigenvalue.
    """
    torch.set_num_threads(1)
    rows: list[SharpnessRow] = []
    batches: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # one fixed batch per context length
    base = record.plan.base if record.plan else None
    for trial in sharpness_trials(records, best_trial_id):
        config = run_config_of(trial.config) or base
        context = config.model.context_length if config is not None else 0
        checkpoints = trial.periodic_checkpoints
        if not checkpoints:
            log.warning("trial %s has no periodic checkpoints left (the sweep keeps them with --keep all); no "
                        "sharpness for it", trial.trial_id)
            continue
        if context <= 0:
            log.warning("trial %s: no context_length in its config; no sharpness for it", trial.trial_id)
            continue
        if context not in batches:
            batches[context] = sharpness_batch(record, context)
        for path in each(checkpoints, len(checkpoints), f"sharpness {trial.trial_id}", "checkpoint"):
            try:
                result = checkpoint_sharpness(path, config.model, batches[context], iters=iters, tol=tol,
                                              largest=True)
            except (ValueError, RuntimeError, OSError, KeyError) as err:
                log.warning("skipping checkpoint %s: %s", path, err)
                continue
            rows.append(SharpnessRow(trial.trial_id, trial.lr, result))
    return rows


def write_sharpness_csv(rows: Sequence[SharpnessRow], path: Path) -> Path:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(SHARPNESS_COLUMNS)
    for row in rows:
        values = row.to_json()
        writer.writerow(["" if values.get(c) is None else values.get(c) for c in SHARPNESS_COLUMNS])
    atomic_write_text(path, buffer.getvalue())
    return path
