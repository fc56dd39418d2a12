"""lmtune from Python, for a Ray Tune script of your own: the pieces ``python -m lmtune.run`` puts together, each
handed to your ``Tuner`` through Tune's public interfaces.

    from ray import tune
    import lmtune

    sweep = lmtune.Sweep("quick_edge", steps=300)        # a shipped space, a YAML file, or a dict of its keys
    tuner = tune.Tuner(
        sweep.trainable(),                                # a function trainable: val_loss, train_loss, tokens
        param_space=sweep.param_space(),
        tune_config=tune.TuneConfig(metric="val_loss", mode="min", search_alg=sweep.searcher(),
                                    scheduler=sweep.scheduler(), num_samples=sweep.num_samples,
                                    reuse_actors=sweep.reuse_actors),
        run_config=tune.RunConfig(name="edge", stop=sweep.stopper()))
    results = tuner.fit()
    print(results.get_best_result().config["lr"])
    summary = sweep.report(results)                       # the edge-of-stability report, in <experiment>/report

``lmtune.trainable(...)`` alone gives the trainable for one config, for Tune's own searchers and schedulers.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from ray import tune
from ray.tune.search import Searcher

from lmtune.analysis.runs import Outcome
from lmtune.errors import LmtuneError
from lmtune.files import JsonObject, atomic_write_json
from lmtune.searches.state import search_state_path
from lmtune.searches.trial_order import TuneParams
from lmtune.sweep.experiment import make_plan, plan_record, plan_scheduler, reuses_workers
from lmtune.sweep.plan import SweepPlan, TrialSetup
from lmtune.sweep.record import SWEEP_FILE, ledger_path
from lmtune.sweep.searcher import DecidingSearcher, tune_search_alg
from lmtune.sweep.spaces import SearchSpace, load_space, parse_space
from lmtune.sweep.stopping import TrialStopper, outcome_of
from lmtune.sweep.trainable import train_trial
from lmtune.sweep.worker_path import check_workers_import_this_lmtune
from lmtune.training.config import BUDGETS, budget_config, canonical_settings
from lmtune.training.divergence import DEFAULT_RULE, DivergenceRule
from lmtune.training.loop import resolve_config
from lmtune.usercode.checks import check_code
from lmtune.usercode.config import UserCode, checked_model_args, normalized
from lmtune.usercode.consent import CodeConsent
from lmtune.usercode.imports import code_path, objects, register

PYTHON_SPACE = Path("<python>")


class DivergenceStopper(TrialStopper):
    """Tune's Stopper for lmtune's trainable: ends a trial whose loss went non-finite or did not recover below
    its initial loss within the recovery window (what the trainable reports, judged by its DivergenceRule), and
    with ``time_budget_s`` or ``min_tokens_per_s`` one too slow to finish in time."""

    def __init__(self, time_budget_s: float | None = None, min_tokens_per_s: float = 0.0):
        super().__init__(None, time_budget_s=time_budget_s, min_tokens_per_s=min_tokens_per_s)


def trainable(data: str | Path | None = None, budget: str = "quick", divergence: DivergenceRule = DEFAULT_RULE, *,
              model: str | Callable | None = None, model_set: dict[str, Any] | None = None,
              optimizer: str | type | None = None, schedule: str | Callable | None = None, **fields: Any):
    """A Tune function trainable that trains a model on ``data`` (a prepared data dir; None: the built-in corpus)
    with the ``budget`` preset and any RunConfig field in ``fields`` (``lr=3e-3, steps=300``); each trial's
    ``param_space`` values (lr, seed, batch_size, ...) go on top. The model is lmtune's, or yours: ``model`` (a
    class or function, or its "pkg.mod:Name" / "path/to/file.py:Name") called with CS336's constructor arguments and
    ``model_set``; ``optimizer`` and ``schedule`` likewise (lmtune.usercode; checked here, before Tune starts). It
    reports ``val_loss`` (at each evaluation), ``train_loss`` and ``tokens`` (use ``time_attr="tokens"`` in a
    scheduler) with a tune.Checkpoint at each checkpoint interval, and resumes from Tune's checkpoint when
    restored."""
    if budget not in BUDGETS:
        raise LmtuneError(f"budget {budget!r}: use one of {', '.join(BUDGETS)}")
    data_dir = Path(data).resolve() if data is not None else None
    from lmtune.data.prepare import ensure_builtin_corpus

    data_dir = data_dir or ensure_builtin_corpus().resolve()
    code = user_code(model, model_set, optimizer, schedule)
    config = resolve_config(budget_config(budget, fields, data_dir=str(data_dir), code=code), data_dir)
    check_code(config)
    specs = code.specs.values()
    setup = TrialSetup(config, divergence, code_path=tuple(code_path(specs)), code_objects=objects(specs))
    check_workers_import_this_lmtune()  # (your Tuner's Ray starts its workers from your working folder)
    return tune.with_parameters(train_trial, setup=setup)


def user_code(model: str | Callable | None = None, model_set: dict[str, Any] | None = None,
              optimizer: str | type | None = None, schedule: str | Callable | None = None) -> UserCode:
    """The user's code as the Python API takes it: each a spec ("pkg.mod:Name", "path/to/file.py:Name") or the class
    or function itself (a class of your script is sent to the trials as an object)."""
    def spec(value: object, name: str) -> str:
        if value is None:
            return ""
        if isinstance(value, str):
            return normalized(value, name)
        return register(value)

    return UserCode(spec(model, "model"), checked_model_args(model_set, "model_set"), spec(optimizer, "optimizer"),
                    spec(schedule, "schedule"))


class Sweep:
    """One of lmtune's sweeps as the pieces of your own Tuner: its space (a shipped name, a YAML path or a dict
    of the same keys), on ``data`` (None: the built-in corpus) with ``budget`` (None: the space's) and any run
    setting in ``overrides`` on top; validated here, as ``python -m lmtune.run`` validates it."""

    def __init__(self, space: str | Path | JsonObject, data: str | Path | None = None, budget: str | None = None, *,
                 model: str | Callable | None = None, model_set: dict[str, Any] | None = None,
                 optimizer: str | type | None = None, schedule: str | Callable | None = None, **overrides: Any):
        """``model``, ``model_set``, ``optimizer``, ``schedule``: your own code (as ``lmtune.trainable`` takes it), over
        the space's; checked here, before Tune starts."""
        code = user_code(model, model_set, optimizer, schedule)
        self.plan: SweepPlan = make_plan(_space(space), Path(data) if data is not None else None, budget,
                                         canonical_settings(overrides, "Sweep"), code)
        self.space = self.plan.space  # (the plan's: what depends on the base config worked out, as lmtune run's)
        self._searcher: tuple[Searcher | None, int] | None = None

    def trainable(self):
        """The function trainable (lmtune.sweep.trainable.train_trial) with what every trial of the sweep shares."""
        check_workers_import_this_lmtune()  # (your Tuner's Ray starts its workers from your working folder)
        return tune.with_parameters(train_trial, setup=self.plan.trial_setup())

    def param_space(self) -> TuneParams:
        """The Tuner's param_space: a grid's or Optuna's domains; for a search that suggests every trial, only the
        default every trial starts from (``early_stop: True``, which a trial the search runs to its end overrides).
        Tune hands your TuneConfig's metric and mode to the searcher (Searcher.set_search_properties) only with a
        non-empty param_space: with {} lmtune's searcher never saw mode="max" and ran its whole search under it."""
        params = self.space.strategy.param_space(self.space.fuse)
        return params if params or self.searcher() is None else {"early_stop": True}

    def searcher(self) -> Searcher | None:
        """The search as a Tune Searcher (the same object on every call; None: Tune's own grid generation)."""
        if self._searcher is None:
            self._searcher = tune_search_alg(self.space.strategy, self.plan.budget(), None)
        return self._searcher[0]

    @property
    def num_samples(self) -> int:
        """TuneConfig's num_samples: -1 for a search that says when it has finished."""
        self.searcher()
        return self._searcher[1]

    @property
    def reuse_actors(self) -> bool:
        """TuneConfig's reuse_actors, as ``python -m lmtune.run`` sets it: True (one worker process per slot runs
        trial after trial, sparing each trial seconds of process start and imports) unless your model's builds share
        a module (lmtune.usercode.checks), whose trials each need a fresh process."""
        return reuses_workers(self.plan)

    def scheduler(self):
        """ASHA on tokens, as the space sets it (None without ASHA): Tune's AsyncHyperBandScheduler, cutting only
        the trials the search lets it cut (an edge search: its coarse grid), each judged in the order trials
        started; metric and mode from your TuneConfig."""
        return plan_scheduler(self.plan)

    def stopper(self) -> DivergenceStopper:
        return DivergenceStopper(min_tokens_per_s=self.space.stopper.min_tokens_per_s)

    def report(self, results: tune.ResultGrid, out: Path | None = None, target: float | None = None) -> JsonObject:
        """The edge-of-stability report of ``results`` (this sweep's Tuner.fit()): lmtune's records of the sweep
        (sweep.json, the outcome of every trial and the search's state in decisions/) are written into the
        experiment folder if they are not there yet, then the report into ``out`` (default <experiment>/report).
        Returns the summary (summary.json's content). The samples' model is this Sweep's own code, handed to it
        here: the report may build it (a model the folder names otherwise is not imported: lmtune.usercode.consent)."""
        experiment = Path(results.experiment_path)
        if "://" in str(results.experiment_path) or not experiment.is_dir():
            raise LmtuneError(f"{results.experiment_path}: the report reads a local experiment folder; sync it to "
                              "this machine and call lmtune.report on the folder")
        if not any(result.metrics and result.metrics.get("step") for result in results):  # (nothing written yet)
            errors = [result.error for result in results if result.error is not None]
            why = (f"each of its {len(errors)} trials raised an error (the first: "
                   f"{str(errors[0]).strip().splitlines()[-1][:200]})" if errors else "it holds no trial")
            raise LmtuneError(f"{experiment}: no trial trained a step, so there is nothing to report: {why}; fix "
                              "that and fit the Tuner again")
        if not (experiment / SWEEP_FILE).exists():
            plan_record(self.plan, experiment.name, command=("python (lmtune.Sweep)",)).write(experiment)
        if not ledger_path(experiment).exists():
            atomic_write_json(ledger_path(experiment), _outcomes(results))
        searcher = self._searcher[0] if self._searcher else None
        if isinstance(searcher, DecidingSearcher) and not search_state_path(experiment, searcher.name).exists():
            atomic_write_json(search_state_path(experiment, searcher.name), searcher.search.to_json())
        return _report(experiment, out, target, CodeConsent(own=frozenset(self.plan.code_specs)))


def report(sweep: str | Path | tune.ResultGrid, out: Path | None = None, target: float | None = None,
           trust_code: bool = False) -> JsonObject:
    """The edge-of-stability report of a sweep folder written by ``python -m lmtune.run`` or ``Sweep.report`` (or
    of the ResultGrid of such a sweep), as ``python -m lmtune.analyze`` writes it. Returns the summary.
    ``trust_code``: build the best trial's model from the code the folder names, for its samples (as analyze
    --trust-code); without it a user's model's samples are left out, and the report says why."""
    return _report(sweep, out, target, CodeConsent(trust=trust_code))


def _report(sweep: str | Path | tune.ResultGrid, out: Path | None, target: float | None,
            consent: CodeConsent) -> JsonObject:
    from lmtune.report.writer import analyze

    path = Path(sweep.experiment_path) if isinstance(sweep, tune.ResultGrid) else Path(sweep)
    if not (path / SWEEP_FILE).exists():
        raise LmtuneError(f"{path} has no {SWEEP_FILE}: report on it through the Sweep that ran it "
                          "(sweep.report(results)), which writes lmtune's records first")
    return analyze(path, out_dir=out, target=target, consent=consent)


def _space(space: str | Path | JsonObject) -> SearchSpace:
    # (a dict: the YAML mapping a space file would hold, checked by parse_space as a file's is)
    if isinstance(space, dict):
        return parse_space(space, PYTHON_SPACE, yaml.safe_dump(space, sort_keys=False))
    return load_space(str(space))


def _outcomes(results: tune.ResultGrid) -> dict[str, JsonObject]:
    """The ledger of a sweep run by a Tuner of the user's own: how each trial ended, from its last result."""
    entries = {}
    for result in results:
        metrics = result.metrics or {}
        trial_id = metrics.get("trial_id") or Path(result.path).name.split("_")[0]
        if result.error is not None:
            outcome, reason = Outcome.ERROR, f"error: {str(result.error).strip().splitlines()[-1:]}"
        else:
            outcome, reason = outcome_of(metrics)
        tokens = metrics.get("tokens")
        entries[str(trial_id)] = {"outcome": str(outcome), "reason": reason, "step": metrics.get("step"),
                                  "tokens": tokens if isinstance(tokens, int | float) and math.isfinite(tokens)
                                  else None}
    return entries
