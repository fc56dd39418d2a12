"""What the report says of a sweep from its record (sweep.json, read typed by lmtune.sweep.sweep_file): its search
in words, the data it trained on, the model, its budget and ASHA's rungs, the vocabulary, and the compute its trials
spent."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from lmtune.analysis.runs import AshaBudget, Budget
from lmtune.data.dataset import data_unigram_loss, describe_validation, read_meta
from lmtune.errors import LmtuneError
from lmtune.files import JsonObject
from lmtune.findings.stability import ATTENTION_LOGITS, TrialRecord, budget_tokens, logged, tokens_spent
from lmtune.findings.summary import ModelFacts
from lmtune.sweep.plan import asha_budget
from lmtune.sweep.record import read_json_object
from lmtune.sweep.sweep_file import SweepRecord
from lmtune.training.divergence import DivergenceRule
from lmtune.training.lr_range import RangeTestResult


def sweep_budget(record: SweepRecord, trials: list[TrialRecord]) -> Budget | None:
    """The sweep's budget and comparison rungs, from sweep.json (None when it records no plan)."""
    if record.plan is None:
        return None
    return Budget.of_run(record.plan.base, sweep_asha_budget(record, trials), record.plan.unigram_loss)


def with_unigram_baseline(record: SweepRecord) -> SweepRecord:
    """sweep.json's plan with the data's unigram baseline: as recorded; for a sweep recorded before lmtune kept it,
    from the data's meta.json it recorded, or measured on its data dir when that is still there with the same
    content. Left unknown otherwise (then no run is judged by it, and the report says so)."""
    plan = record.plan
    if plan is None or plan.unigram_loss is not None:
        return record
    meta = record.data.meta
    unigram = meta.unigram_loss if meta is not None else None
    if unigram is None and meta is not None and record.data.dir:
        with contextlib.suppress(LmtuneError, OSError, ValueError):
            if read_meta(Path(record.data.dir)).content_hash == meta.content_hash:
                unigram = data_unigram_loss(Path(record.data.dir))
    return replace(record, plan=replace(plan, unigram_loss=unigram)) if unigram is not None else record


def sweep_asha_budget(record: SweepRecord, trials: list[TrialRecord]) -> AshaBudget | None:
    """ASHA's budget in tokens: as sweep.json recorded it, or (older sweeps) by run's own rule from the
    space's settings and the largest trial budget."""
    if record.plan is None:
        return None
    if record.plan.asha is not None:
        return record.plan.asha
    largest = max((b for b in (t.budget_tokens for t in trials) if b), default=None)
    return asha_budget(record.plan.space.scheduler, largest) if largest else None


def range_summary(result: RangeTestResult | None, variant: str | None = None) -> JsonObject | None:
    """summary.json's ``range_test``: what the edge search's LR range test found (None: it ran none); a compare
    search's reference ``variant``'s, named."""
    if result is None:
        return None
    return {"steepest_lr": result.steepest_lr, "min_loss_lr": result.min_loss_lr, "blowup_lr": result.blowup_lr,
            "stopped_because": result.stopped_because, "tokens": result.tokens, "steps": len(result.lrs),
            **({"variant": variant} if variant else {})}


def data_description(record: SweepRecord) -> str:
    """What the trials trained on, from sweep.json (the data dir and its meta.json), ending with where its
    validation split came from (lmtune.data.dataset.describe_validation) where meta.json records it (a data dir
    prepared before lmtune recorded it held its split out of the training input, and is described as before)."""
    meta = record.data.meta
    where = record.data.dir or "an unrecorded data dir"
    parts = [f"{value:,} {label}" for value, label in ((meta.train_tokens, "train tokens"),
                                                        (meta.val_tokens, "val tokens"), (meta.vocab_size, "vocab"))
             ] if meta else []
    sources = [str(s.get("name")) for s in meta.sources if isinstance(s, dict) and s.get("name")] if meta else []
    text = where + (f" ({', '.join(parts)})" if parts else "")
    text += (f", prepared from {', '.join(sources[:3])}" + (" and more" if len(sources) > 3 else "")
             if sources else "")
    return text + (f"; {describe_validation(meta.validation)}" if meta and meta.validation else "")


def vocab_size(record: SweepRecord) -> int | None:
    """The model's vocabulary: the base config's, else the data's."""
    for value in (record.plan.base.model.vocab_size if record.plan else None,
                  record.data.meta.vocab_size if record.data.meta else None):
        if value is not None and value > 0:
            return value
    return None


def compute_accounting(record: SweepRecord, trials: list[TrialRecord],
                       range_tokens: int | None = None) -> JsonObject:
    """Tokens trained (each trial as of its newest metrics row, and an edge search's range test) against a
    full grid without early stopping (every trial to its own budget)."""
    base_budget = budget_tokens(record.plan.base if record.plan else None)
    spent = sum(tokens_spent(t) for t in trials) + (range_tokens or 0)
    budgets = [t.budget_tokens or base_budget for t in trials]
    full = sum(budgets) if budgets and all(b is not None for b in budgets) else None
    compute: JsonObject = {"tokens_spent": spent, "full_grid_tokens": full,
                               "trials_started": len(trials) + (range_tokens is not None)}
    if record.num_trials is not None and record.num_trials != len(trials):
        compute["trials_planned"] = record.num_trials
    walls = [t.wall_time_s for t in trials if t.wall_time_s is not None]
    if walls:
        compute["trial_time_total"] = f"{sum(walls):.0f} s"
    return compute


def search_description(record: SweepRecord, trials: list[TrialRecord]) -> str:
    """The search strategy in words: the space's search (sweep.json), the ASHA settings, the stopper settings."""
    if record.plan is None:
        return "unknown search."
    space = record.plan.space
    strategy = space.describe_search()
    lines = [f"Search space `{space.name}`: {strategy}." if space.name else f"{strategy}."]
    if space.description:
        lines.append(f"The space file describes itself as: \"{space.description.strip()}\" "
                     f"This sweep trained on {data_description(record)}.")
    scheduler = space.scheduler
    if scheduler.name == "asha":
        asha = sweep_asha_budget(record, trials)
        lines.append("Early stopping: ASHA on val loss against tokens trained, " + (
            f"grace period {asha.grace_period:,} tokens, reduction factor {asha.reduction_factor:g}, max_t "
            f"{asha.max_t:,} tokens (the space's grace_period {scheduler.grace_period} and max_t "
            f"{scheduler.max_t}, fractions of the largest trial budget where <= 1)." if asha else
            f"settings {asdict(scheduler)}."))
    else:
        lines.append("Early stopping: none (every trial trains to its budget unless it diverges).")
    rule = trials[0].rule if trials else DivergenceRule()
    text = (f"Stopper: a trial is diverged at a non-finite train loss or gradient norm, or once its train loss "
            f"stayed above its loss at initialisation (ℓ₀ = ln vocab) for {rule.recovery_window:g} of its "
            "budget's steps (the recovery window) without coming back; only then does the stopper end it "
            "early" + (f" (at {rule.stop_factor:g} × ℓ₀)" if rule.stop_factor != 1 else "")
            + ". A run that rose far above its running minimum and came back is spiked, not diverged")
    if space.stopper.min_tokens_per_s > 0:
        text += f"; too slow under {space.stopper.min_tokens_per_s:,.0f} tokens/s"
    if record.time_budget_s:
        text += f"; too slow when projected past the sweep's time budget of {record.time_budget_s:,.0f} s"
    lines.append(text + ".")
    return "\n\n".join(lines)


def attention_logits_measured(trials: Sequence[TrialRecord]) -> bool | None:
    """Whether the trials logged the attention-logit probe, read from their metrics (None: no trial logged a row)."""
    if not any(logged(t, "train_loss") for t in trials):
        return None
    return any(logged(t, ATTENTION_LOGITS) for t in trials)


def model_facts(record: SweepRecord, trials: Sequence[TrialRecord]) -> ModelFacts | None:
    """The model the sweep trained: its name from sweep.json, its size from the first trial's summary.json that
    records one (a width search's trials differ in size: the first one's)."""
    if record.plan is None:
        return None
    code = record.plan.base.code
    sizes = (read_json_object(t.checkpoint_dir.parent / "summary.json") for t in trials if t.checkpoint_dir)
    size = next((s for s in sizes if isinstance(s.get("params_non_embedding"), int)), {})
    flops = size.get("flops_per_token")
    return ModelFacts(code.describe(), code.user_model, size.get("params_non_embedding"), size.get("params_total"),
                      float(flops) if isinstance(flops, int | float) else None, bool(size.get("flops_estimated")),
                      bool(size.get("flops_counted")), attention_logits_measured(trials), code.title())
