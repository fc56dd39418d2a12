"""The report's numbers, typed: the best LR at equal tokens with its spread over seeds, the landscape above it
(basin, degraded, failed), the edge bracket and how it was confirmed, the ratio as a range, the runs that
spiked and those cut while above ℓ₀, equal-token losses per rung, sensitivity, convergence, target, the stages of
the search, and one row per trial (``SweepSummary``, computed once by ``sweep_summary``); and what analyze reads of
the sweep's records beside them (``SweepFacts``). The markdown, the figures and the CLIs' last lines read both;
summary.json is both, JSON-safe (no NaN: lmtune.report.writer.SweepReport.to_json)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Generic, Protocol, TypeVar

from lmtune.analysis.conclusion import Conclusion, NothingTrained, conclude
from lmtune.analysis.runs import Budget, equal_token_losses
from lmtune.errors import LmtuneError
from lmtune.files import JsonObject
from lmtune.findings.baselines import (
    AshaBaselineCost,
    BaselineCost,
    GridCost,
    bracket_walk,
    careful_baseline,
    competent_baseline,
    same_resolution_grid,
)
from lmtune.findings.comparison import (
    SENSITIVITY_LRS,
    Convergence,
    EqualTokenLosses,
    LogitGrowth,
    Pair,
    Sensitivity,
    Stage,
    StageDecision,
    best_record,
    full_budget_convergence,
    full_budget_sensitivity,
    logit_growth,
    record_runs,
    stage_accounting,
    standing_pairs,
)
from lmtune.findings.rows import SpikedRun, TrialRow, UnconfirmedRun, json_safe, trial_table, unconfirmed_run
from lmtune.findings.stability import (
    TrialRecord,
    best_candidates,
    best_val_loss,
    candidate_token_range,
    edge_reading,
    edge_reading_range,
    initial_loss_found,
    tokens_to_reach,
    tokens_trained,
)
from lmtune.training.divergence import DivergenceRule

log = logging.getLogger(__name__)

Json = None | bool | int | float | str | list["Json"] | dict[str, "Json"]
"""A value summary.json holds as another part of lmtune wrote it (the sweep's records, the range test)."""


class SearchResult(Protocol):
    """What a search strategy adds to the summary of its own (a horizon search's fit): summary.json's keys for it."""

    def to_json(self) -> JsonObject: ...


@dataclass(frozen=True)
class TargetResult:
    """Whether the best LR reached a target val loss."""

    target: float | None
    """The target (None: none was given, and the rest is None too)."""
    met: bool | None
    """The best LR's loss is at or below the target (None: no target)."""
    trial: str | None
    """The best trial, when it met the target."""
    tokens: float | None
    """Tokens after which that trial first reached it."""


@dataclass(frozen=True)
class MissingTrial:
    """A trial the ledger lists whose folder the report could not read: the conclusions are drawn without it."""

    trial_id: str
    """The trial the ledger names."""
    outcome: str
    """How the ledger says it ended."""
    reason: str
    """The ledger's reason."""


@dataclass(frozen=True)
class ModelFacts:
    """The model a sweep trained: its name (sweep.json's) and its size (its trials' summary.json)."""

    name: str
    """lmtune's TransformerLM, or the user's --model spec with its arguments."""
    user_model: bool
    """Whether it is the user's model (sweep.json's --model), as summary.json records it."""
    params_non_embedding: int | None = None
    params_total: int | None = None
    flops_per_token: float | None = None
    flops_estimated: bool = False
    """Whether the FLOPs (and so MFU) are estimated from the parameters' shapes (a user's model whose count failed)."""
    flops_counted: bool = False
    """Whether the FLOPs were counted by torch's FlopCounterMode over one forward and backward (a user's model)."""
    attention_logits_measured: bool | None = None
    """Whether its trials logged the attention-logit probe (a model whose layers lmtune reaches: its spec's
    ``exposes_layers``), read from their metrics; None: no trial logged a row yet."""
    title: str | None = field(default=None, compare=False)
    """How the report names it (lmtune.training.code.UserCode.title: "your `...`" for the user's); None: its name.
    Words, not a fact: not in summary.json."""

    def to_json(self) -> JsonObject:
        return {key: value for key, value in asdict(self).items() if key != "title"}


@dataclass(frozen=True)
class Sample:
    """Text the best LR's model wrote (lmtune.report.samples)."""

    seed: int
    prompt: str
    """The prompt, as text (or its token ids where the data has no tokenizer)."""
    text: str
    """The continuation, decoded (or its token ids)."""
    tokens: int
    """Tokens generated (fewer than the limit when the model wrote <|endoftext|>)."""


@dataclass(frozen=True)
class SweepFacts:
    """What ``analyze`` adds from the sweep's records beside what its runs conclude."""

    sweep: str = ""
    """The sweep's name."""
    sweep_dir: str = ""
    """The sweep's folder, absolute."""
    missing_trials: tuple[MissingTrial, ...] = ()
    """Trials the ledger lists whose folder could not be read: the report concludes without them."""
    best_trial_dir: str | None = None
    """The best trial's folder."""
    best_checkpoint: str | None = None
    """The checkpoint the best trial kept, in its folder: its checkpoints/best.pt (else its newest periodic one;
    None: it kept none, e.g. a sweep copied without its checkpoints): what ``lmtune sample`` of the sweep samples."""
    best_config: Mapping[str, Json] | None = None
    """The best trial's varied parameters (Tune's params)."""
    search_strategy: str = ""
    """The search, its early stopping and its stopper, in words."""
    compute: Mapping[str, Json] | None = None
    """Tokens trained against a full grid, trials started, time."""
    data: str = ""
    """What the trials trained on, in words."""
    range_test: Mapping[str, Json] | None = None
    """The edge search's LR range test, summarized (None: none ran)."""
    generated: str = ""
    """When the report was computed."""
    model: ModelFacts | None = None
    """The model the sweep trained (None: sweep.json records no plan)."""
    samples: tuple[Sample, ...] = ()
    """Text the best LR's model wrote (analyze only)."""
    samples_note: str = ""
    """Why there are no samples, where there are none."""

    def to_json(self) -> JsonObject:
        return {"sweep": self.sweep, "sweep_dir": self.sweep_dir,
                "missing_trials": [asdict(m) for m in self.missing_trials], "best_trial_dir": self.best_trial_dir,
                "best_checkpoint": self.best_checkpoint,
                "best_config": self.best_config, "search_strategy": self.search_strategy,
                "compute": self.compute if self.compute is not None else {}, "data": self.data,
                "range_test": self.range_test, "generated": self.generated,
                "model": self.model.to_json() if self.model else None,
                "samples": [asdict(sample) for sample in self.samples], "samples_note": self.samples_note}


ResultT = TypeVar("ResultT", bound="SearchResult | None")
"""A search's own results in its summary: None for a search that has none of its own."""


@dataclass(frozen=True)
class SweepSummary(Generic[ResultT]):
    """What the report concludes of a sweep (or, for a horizon search, of its target budget's runs); typed by the
    search's own results (``SweepSummary[HorizonResult]``: a horizon search's)."""

    search: str
    """The search's name (its ``search:`` value: grid, optuna, edge, horizon, width, compare): which report section adds
    its own part."""
    conclusion: Conclusion
    """What the runs conclude at the compared budget (lmtune.analysis.conclusion)."""
    compared_at_tokens: int
    """The full budget every loss is compared at."""
    candidate_tokens: tuple[int, int] | None
    """(fewest, most) tokens the best-LR candidates trained when no trial trained its whole budget (the best
    LR then is the lowest loss at any token count: not at equal tokens); None otherwise."""
    best_lr: float | None
    """The crowned best LR (or, with candidate_tokens, the candidates' lowest loss's)."""
    best_val_loss: float | None
    """Its mean full-budget loss over seeds (with candidate_tokens: that candidate's lowest loss)."""
    best_tokens: int | None
    """The tokens best_val_loss is at."""
    edge_ratio: float | None
    """The divergence LR (the smallest LR at which a run diverged) / best_lr, as a point value."""
    best_trial: str | None
    """The trial at the best LR with the lowest full-budget loss: the checkpoint to use."""
    equal_tokens: EqualTokenLosses
    """Every standing run's loss at each comparison point, by LR."""
    rungs: tuple[int, ...]
    """The token counts LRs are compared at (ASHA's rungs, then the full budget)."""
    spiked: tuple[SpikedRun, ...]
    """The runs that spiked without diverging."""
    divergence_rule: DivergenceRule
    """The sweep's rule for diverged and spiked."""
    sensitivity: Sensitivity
    """LR sensitivity at the full budget."""
    initial_loss: float | None
    """ℓ₀: ln vocab, or the trials' median first logged train loss where the vocabulary is not known
    (initial_loss_from says which)."""
    target: TargetResult
    """Whether the best LR met the target val loss given to analyze."""
    convergence: Convergence
    """Tokens each full-budget trial needed to reach the basin's level."""
    logit_growth: LogitGrowth
    """Trials that did not diverge but whose attention logits grew past the warning threshold."""
    stages: tuple[Stage, ...]
    """The search's stages in the order it ran them: LRs, trials, tokens and why."""
    same_resolution_grid: GridCost | None
    """What a plain grid resolving the edge as finely would cost (None: no bracket ratio)."""
    status_counts: Mapping[str, int]
    """How many trials have each status."""
    trials: tuple[TrialRow, ...]
    """One row per trial, by LR, seed and id."""
    search_result: ResultT
    """The search strategy's own results (a horizon search's:
    lmtune.searches.horizon.report_conclusion.HorizonResult; None: a search without any)."""
    unigram_loss: float | None = None
    """The data's unigram baseline the runs were judged by (None: not recorded; no run was judged by it)."""
    competent_baseline: BaselineCost | None = None
    """What a competent user would train by hand for the same answer (None: no LR was tried)."""
    careful_baseline: AshaBaselineCost | None = None
    """The same under ASHA with the sweep's rungs, what a careful user with Ray Tune would run (None: no ASHA)."""
    unconfirmed: tuple[UnconfirmedRun, ...] = ()
    """The standing runs cut early while their loss stood above ℓ₀ (neither diverged nor spiked: not known)."""
    initial_loss_from: str | None = None
    """How ℓ₀ was found: INITIAL_FROM_VOCAB (ln of the model's vocabulary), INITIAL_GIVEN, or INITIAL_ESTIMATED (the
    median over the trials of the first train loss each logged: an estimate, the vocabulary not known); None: no ℓ₀."""
    asha_rungs: bool = True
    """The comparison points below the full budget are ASHA's rungs (lmtune.analysis.runs.Budget.asha_rungs)."""

    def cut_below(self, first: float | None) -> float | None:
        """The smallest LR below ``first`` (a named LR: the failing or divergence LR; None: none found) at which a
        run was cut while above ℓ₀: that named LR may lie there instead (None: no such LR)."""
        lrs = [run.lr for run in self.unconfirmed if first is None or run.lr < first]
        return min(lrs) if lrs else None

    @property
    def nothing_trained(self) -> NothingTrained | None:
        """No run beat the data's unigram baseline: no best LR (lmtune.analysis.conclusion.nothing_trained)."""
        return self.conclusion.nothing_trained

    @property
    def divergence_unsettled(self) -> float | None:
        """cut_below the divergence LR: where it may lie instead."""
        return self.cut_below(self.conclusion.divergence.diverged_lr)

    @property
    def edge_reading(self) -> str:
        if self.edge_ratio is None and self.conclusion.divergence.diverged_lr is not None:
            return "no best LR, so no divergence / best ratio"
        return edge_reading(self.edge_ratio, self.conclusion.useful, self.divergence_unsettled)

    @property
    def edge_range_reading(self) -> str | None:
        return edge_reading_range(*self.conclusion.edge_ratio_range, self.conclusion.useful)

    def trial(self, trial_id: str | None) -> TrialRow | None:
        return next((r for r in self.trials if r.trial_id == trial_id), None)

    def to_json(self) -> JsonObject:
        """What the runs conclude, summary.json's keys for it (SweepReport.to_json adds the records' facts)."""
        summary = {**self.conclusion.to_json(), "best_lr": self.best_lr, "edge_ratio": self.edge_ratio,
                   "compared_at_tokens": self.compared_at_tokens, "candidate_tokens": self.candidate_tokens,
                   "best_val_loss": self.best_val_loss, "best_tokens": self.best_tokens,
                   "best_trial": self.best_trial, "edge_reading": self.edge_reading,
                   "edge_range_reading": self.edge_range_reading,
                   "equal_token_losses": self.equal_tokens.means_json(),
                   "equal_token_trials": self.equal_tokens.trials_json(), "rungs": list(self.rungs),
                   "spiked": [{"trial_id": s.trial_id, "lr": s.lr, "seed": s.seed,
                               "spikes": [asdict(spike) for spike in s.spikes]} for s in self.spiked],
                   "unconfirmed": [asdict(u) for u in self.unconfirmed],
                   "divergence_rule": asdict(self.divergence_rule), "lr_sensitivity": self.sensitivity.value,
                   "lr_sensitivity_lrs": self.sensitivity.lrs, "lr_sensitivity_tokens": self.sensitivity.tokens,
                   "lr_sensitivity_grid": list(SENSITIVITY_LRS),
                   "initial_loss": self.initial_loss, "initial_loss_from": self.initial_loss_from,
                   "unigram_loss": self.unigram_loss,
                   "target": self.target.target,
                   "target_met": self.target.met, "target_trial": self.target.trial,
                   "target_tokens": self.target.tokens, "convergence": asdict(self.convergence),
                   "logit_growth": {"threshold": self.logit_growth.threshold, "best": self.logit_growth.best,
                                    "lrs": [{"lr": lr, "attn_logit_max": peak}
                                            for lr, peak in self.logit_growth.lrs]},
                   "stages": [asdict(s) for s in self.stages],
                   "same_resolution_grid": asdict(self.same_resolution_grid) if self.same_resolution_grid else None,
                   "competent_baseline": ({**asdict(self.competent_baseline), "runs": self.competent_baseline.runs}
                                          if self.competent_baseline else None),
                   "careful_baseline": asdict(self.careful_baseline) if self.careful_baseline else None,
                   "status_counts": dict(self.status_counts), "trials": [row.to_json() for row in self.trials]}
        if self.search_result is not None:
            summary.update(self.search_result.to_json())
        return json_safe(summary)


def sweep_summary(records: Sequence[TrialRecord], budget: Budget | None = None, target: float | None = None,
                  ell0: float | None = None, vocab_size: int | None = None, decisions: Sequence[StageDecision] = (),
                  range_tokens: int | None = None, search: str = "grid") -> SweepSummary[None]:
    """The sweep's headline numbers and one row per trial. ``budget``: the sweep's (steps, warm-up,
    tokens per step, rungs); without it, one rung at the largest trial budget. ``decisions``: the search's
    (the why of each stage)."""
    if not records:
        raise LmtuneError("the sweep has no trials to analyze; run a sweep first")
    budget = budget or budget_from_records(records)
    return summarize_runs(records, record_runs(records, budget), budget, target=target, ell0=ell0,
                          vocab_size=vocab_size, decisions=decisions, range_tokens=range_tokens, search=search)


def summarize_runs(records: Sequence[TrialRecord], pairs: Sequence[Pair], budget: Budget, target: float | None = None,
                   ell0: float | None = None, vocab_size: int | None = None, decisions: Sequence[StageDecision] = (),
                   range_tokens: int | None = None, search: str = "grid", conclusion: Conclusion | None = None,
                   every_record: Sequence[TrialRecord] | None = None,
                   search_result: ResultT = None) -> SweepSummary[ResultT]:
    """sweep_summary of ``records`` already turned into the search's runs (``pairs``: record_runs), at ``budget``;
    ``conclusion``: what those runs conclude, when the caller has concluded it already (a horizon search);
    ``every_record``: the sweep's every trial, for the trial table and the status counts, where ``records`` are
    some of them (one budget's or width's); ``search_result``: the search's own results."""
    standing = standing_pairs(pairs)  # a run continued by another, or retrained, counts once
    conclusion = conclusion or conclude([run for run, _ in pairs], budget, crown_untrained=False)
    best = best_record(standing, conclusion.best_lr)
    best_lr, edge_ratio, candidates = conclusion.best_lr, conclusion.edge_ratio, None
    best_loss: float | None = None
    best_tokens: int | None = None
    if best is not None:
        best_loss, best_tokens = conclusion.best.mean, budget.full_tokens
    elif conclusion.nothing_trained is None:
        # No trial trained its whole budget: the lowest loss at any token count, said to be unequal. (Where runs ran
        # it but none beat the unigram baseline, nothing trained: no best to name.)
        found = best_candidates(records)
        best = min(found, key=lambda r: (best_val_loss(r), r.lr)) if found else None
        best_lr, best_loss = (best.lr, best_val_loss(best)) if best else (None, None)
        best_tokens, candidates = (tokens_trained(best) if best else None), candidate_token_range(records)
        diverged_lr = conclusion.divergence.diverged_lr
        edge_ratio = diverged_lr / best.lr if best and diverged_lr else None
    ell0, ell0_from = initial_loss_found(records, ell0, vocab_size)
    rows, counts = trial_table(records if every_record is None else every_record)
    basin = conclusion.landscape.basin
    summary = SweepSummary(
        search, conclusion, budget.full_tokens, candidates, best_lr, best_loss, best_tokens, edge_ratio,
        best.trial_id if best is not None else None,
        EqualTokenLosses(equal_token_losses([run for run, _ in standing], budget.rungs)), tuple(budget.rungs),
        tuple(SpikedRun(record.trial_id, run.lr, run.seed, run.spikes) for run, record in standing
              if run.spikes and not run.diverged and run.cut_loss is None),
        records[0].rule, full_budget_sensitivity(standing, ell0), ell0, target_summary(best, best_loss, target),
        full_budget_convergence(standing, basin.lrs if basin else None), logit_growth(standing, best),
        tuple(stage_accounting(pairs, decisions, range_tokens)),
        same_resolution_grid(pairs, conclusion.edge.ratio, budget), counts, rows, search_result, budget.unigram_loss,
        competent := competent_baseline(pairs, len(conclusion.best.losses) if conclusion.best else 1,
                                        _edge_seeds(conclusion), conclusion.edge.ratio, budget),
        careful_baseline(competent, budget, bracket_walk(pairs, budget, conclusion.edge.diverged_lr)),
        unconfirmed=tuple(unconfirmed_run(run, record) for run, record in standing if run.cut_loss is not None),
        initial_loss_from=ell0_from, asha_rungs=budget.asha_rungs)
    log.info("sweep summary: best lr %s (val %s), edge [%s, %s]", best_lr, best_loss, conclusion.edge.stable_lr,
             conclusion.edge.diverged_lr)
    return summary


def _edge_seeds(conclusion: Conclusion) -> tuple[int, int]:
    """Seeds at the bracket's stable and failed ends (0, 0: no bracket)."""
    confirmation = conclusion.edge_confirmation
    return (len(confirmation.stable_end), len(confirmation.diverged_end)) if confirmation else (0, 0)


def budget_from_records(records: Sequence[TrialRecord]) -> Budget:
    """One rung at the largest budget the trials' configs name (or the most tokens any trained)."""
    budgets = [r.budget_tokens or tokens_trained(r) or 0 for r in records]
    full = max(budgets) if budgets else 0
    return Budget(steps=max(full, 1), warmup_steps=0, tokens_per_step=1, seed=0, rungs=(max(full, 1),))


def target_summary(best: TrialRecord | None, best_loss: float | None, target: float | None) -> TargetResult:
    """Whether the best LR reached the target val loss, and after how many tokens its best trial did."""
    if target is None:
        return TargetResult(None, None, None, None)
    met = best_loss is not None and best_loss <= target
    return TargetResult(target, met, best.trial_id if met else None, tokens_to_reach(best, target) if met else None)
