"""The fused training loop: K members of one shape, in lockstep, in one process.

``train_fused(configs, out_dirs)`` is ``train()`` for a group: the members may differ in learning
rate, its schedule's warm-up and floor, weight decay, betas, eps, gradient clipping and seed, and
share everything else. Each member writes its own folder exactly as ``train()`` would. A member that
diverges is frozen in the step it happens and removed from the fused tensors at the next log
interval (its compute reclaimed); so is a member the sweep's rung rule cuts. The others go on as if
it had never been there.

Why two loops (this one and lmtune.training.loop's ``train``): a single run trains an ordinary TransformerLM
with torch's AdamW, without vmap, functional_call or parameters stacked on a member dimension, and a loop for
K >= 1 members was not measured here to cost the single run nothing (on the CPU least of all). What the two
can share they do: the rows are built by the same IntervalMeter from the metric registry (the step's
``measured`` metrics, the stability probes), go to the same sinks (metrics.csv, TensorBoard), are checkpointed
by the same ``save_checkpoints`` and end in the same ``finish_run``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import torch

from lmtune.data.batches import fixed_val_batches
from lmtune.data.dataset import load_data
from lmtune.errors import LmtuneError
from lmtune.fused.batches import MemberBatches
from lmtune.fused.members import Member
from lmtune.fused.restore import restore_members
from lmtune.fused.state import FusedState
from lmtune.fused.step import compile_update, evaluate_members, fused_train_step
from lmtune.training.compile import compile_backend
from lmtune.training.config import RunConfig
from lmtune.training.device import configure_backend, peak_flops, resolve_device
from lmtune.training.divergence import DEFAULT_RULE, DivergenceRule
from lmtune.training.loop import RunEnd, RunResult, resolve_config, save_checkpoints, training_log
from lmtune.training.memory import check_fits
from lmtune.training.metrics import IntervalMeter, Row
from lmtune.training.spec import TrainSpec, lmtune_spec
from lmtune.training.step import Runtime

log = logging.getLogger(__name__)

# What members of one group may differ in; everything else must be equal.
MEMBER_KEYS = ("lr", "min_lr_ratio", "warmup_steps", "weight_decay", "beta1", "beta2", "eps", "grad_clip", "seed")

# (step, {member: its row}) at a log interval -> {member: how it ends there}: a sweep's stopping rules.
MemberRule = Callable[[int, dict[int, Row]], dict[int, RunEnd]]


class GroupSink(Protocol):
    """Hears the group at each log interval (each running member's row, the checkpoints written, the
    members that ended there) and once at the end (every member's result)."""

    def write(self, rows: dict[int, Row], checkpoints: dict[int, Path], endings: dict[int, RunResult]) -> None: ...

    def close(self, results: list[RunResult]) -> None: ...


def check_fusable(configs: Sequence[RunConfig]) -> None:
    """Refuse, in one line, members that differ in anything but MEMBER_KEYS."""
    def shared(config: RunConfig) -> dict:
        d = config.to_dict()
        d["train"] = {k: v for k, v in d["train"].items() if k not in MEMBER_KEYS}
        return d

    first = shared(configs[0])
    for config in configs[1:]:
        other = shared(config)
        differ = sorted(k for section in ("model", "train") for k in first[section]
                        if first[section][k] != other[section].get(k))
        differ += [k for k in first if k not in ("model", "train") and first[k] != other.get(k)]
        if differ:
            raise LmtuneError(f"fused members must differ only in {', '.join(MEMBER_KEYS)}; these differ: "
                              f"{', '.join(differ)} (run them in separate groups, or with fuse: 1)")


def train_fused(configs: Sequence[RunConfig], out_dirs: Sequence[Path], *, resume: bool = False,
                group_sink: GroupSink | None = None, member_rule: MemberRule | None = None,
                divergence: DivergenceRule = DEFAULT_RULE, spec: TrainSpec | None = None,
                figures: bool = True) -> list[RunResult]:
    """Train every config as one member of a fused group, member k writing to ``out_dirs[k]``.

    ``resume`` continues the members that have not ended from their newest common checkpoint;
    ``member_rule`` ends members at a log interval (a sweep's divergence and rung rules); ``divergence``
    judges each member's loss as ``train()`` judges a run's; ``spec``: the members' (they share their code;
    None: lmtune's own). ``figures``: each member draws its own figures as it ends, as ``train()``'s.
    Returns each member's RunResult, in the order of ``configs``.
    """
    if len(configs) != len(out_dirs) or not configs:
        raise LmtuneError(f"{len(configs)} configs for {len(out_dirs)} output folders; give one folder per member")
    configs = [resolve_config(c, Path(c.data_dir)) for c in configs]
    check_fusable(configs)
    spec = spec or lmtune_spec(configs[0])
    return FusedRun(configs, out_dirs, group_sink, member_rule, divergence, spec, figures).run(resume)


class FusedRun:
    def __init__(self, configs: list[RunConfig], out_dirs: Sequence[Path], group_sink: GroupSink | None,
                 member_rule: MemberRule | None, divergence: DivergenceRule, spec: TrainSpec, figures: bool = True):
        self.configs, self.t, self.spec = configs, configs[0].train, spec
        self.group_sink, self.member_rule, self.divergence = group_sink, member_rule, divergence
        self.device = resolve_device(self.t.device)
        check_fits(configs[0], self.device, members=len(configs), spec=spec)
        configure_backend(self.device)
        self.members = [Member.of(i, c, d, spec, figures)
                        for i, (c, d) in enumerate(zip(configs, out_dirs, strict=True))]
        self.state = FusedState.create(configs, self.device, spec=spec)
        dtype = next(self.state.model.parameters()).dtype
        # Every member's learning rate at every step, on the device: no host-to-device copy per step.
        self.schedules = [spec.schedule.lr_function(c) for c in configs]
        self.lr_table = torch.tensor([[lr(s) for lr in self.schedules] for s in range(self.t.stop_step)],
                                     dtype=dtype, device=self.device)

    def running(self) -> list[Member]:
        """The members still training (a compiled group keeps ended ones in its tensors for a while)."""
        return [self.members[m] for m in self.state.positions if self.members[m].result is None]

    def run(self, resume: bool) -> list[RunResult]:
        first = self.configs[0]
        data = load_data(Path(first.data_dir), first.model.context_length, first.model.vocab_size)
        elapsed = restore_members(self.state, self.members) if resume else 0.0
        with contextlib.ExitStack() as cleanup:
            for member in self.running():
                cleanup.enter_context(training_log(member.out_dir))
                member.open(cleanup, self.state.step, self.divergence)
            micro = (first.train.batch_size // first.train.grad_accum_steps, first.model.context_length)
            per_member = len({c.train.seed for c in self.configs}) > 1  # a batch per member: (K, B, T)
            self.runtime = Runtime.build(self.state.model, first, self.device,
                                         train_shape=(len(self.state.positions), *micro) if per_member else micro,
                                         eval_shape=micro, spec=self.spec)
            if self.runtime.compiled:
                compile_update(self.state, compile_backend(first, self.device))
            log.info("fused group of %d members (%s), from step %d", len(self.state.positions),
                     ", ".join(m.label for m in self.running()), self.state.step)
            self.batches = cleanup.enter_context(
                MemberBatches(data.train, self.configs, self.state.positions, self.device, self.state.step))
            self.val_batches = fixed_val_batches(data.val, self.t.batch_size, first.model.context_length,
                                                 self.t.eval_batches)
            self.meter = IntervalMeter(self.device, first.tokens_per_step, self.spec.model.size(first).flops_per_token,
                                       peak_flops(self.device, self.runtime.amp_dtype or torch.float32), elapsed,
                                       members=len(self.state.positions))
            self.index_positions()
            self.train_until_done()
        results = [m.result for m in self.members]
        if self.group_sink is not None:
            self.group_sink.close(results)
        return results

    def train_until_done(self) -> None:
        try:
            while self.state.step < self.t.stop_step and self.running():
                step = self.state.step + 1
                x, y = self.batches.next(self.state.positions)
                lrs = self.lr_table[step - 1].index_select(0, self.positions_index)
                result = fused_train_step(self.state, self.runtime, x, y, lrs, self.t.grad_accum_steps,
                                          measure=self.t.logs_at(step))
                self.meter.add(step, result, self.batches.last_wait_s)
                if self.t.logs_at(step):
                    self.log_interval(step, x)
        except KeyboardInterrupt:
            log.warning("interrupted: each member's newest checkpoint is kept; continue with --resume")
            self.end({m.index: RunEnd("stopped", f"interrupted at step {self.state.step}") for m in self.running()})
        self.end({m.index: RunEnd() for m in self.running()})

    def index_positions(self) -> None:
        """The running members' columns of lr_table, on the device: rebuilt only when a member leaves."""
        self.positions_index = torch.tensor(self.state.positions, dtype=torch.long, device=self.device)

    def log_interval(self, step: int, x: torch.Tensor) -> None:
        """The interval's rows, validation, checkpoints and endings: the loop's only host syncs."""
        live = {m.index for m in self.running()}
        endings = {self.state.positions[p]: RunEnd.non_finite("loss or gradient norm", bad)
                   for p, bad in enumerate(self.meter.first_nonfinite_steps())
                   if bad is not None and self.state.positions[p] in live}
        taken = self.meter.take_each(step, lambda: self.state.model.stability_probes(x[..., :2, :]))
        rows = {m: row for m, row in zip(self.state.positions, taken, strict=True) if m in live}
        lrs = [lr(step - 1) for lr in self.schedules]
        vals = evaluate_members(self.runtime, self.val_batches, self.t.grad_accum_steps) \
            if self.t.evaluates_at(step) else [None] * len(rows)
        for m, row in rows.items():
            position = self.state.positions.index(m)
            row.update(lr=lrs[m], val_loss=vals[position])
            if row["val_loss"] is not None and not math.isfinite(row["val_loss"]) and m not in endings:
                endings[m] = RunEnd.non_finite("validation loss", step)
        written = {m: rows[m] for m in rows if m not in endings}
        for m, row in written.items():
            self.members[m].judge(row)
        checkpoints = {}
        for m, row in written.items():
            checkpoint = self.write_member(self.members[m], row, step)
            if checkpoint is not None:
                checkpoints[m] = checkpoint
        if self.member_rule is not None:
            endings.update({m: end for m, end in self.member_rule(step, written).items() if m in written})
        results = self.end(endings)
        if self.group_sink is not None:
            self.group_sink.write(written, checkpoints, results)
        best = min(written.values(), key=lambda r: r["train_loss"], default=None)
        if best is not None:
            log.info("step %d/%d: %d members, best train loss %.4f, %.0f tok/s per member", step, self.t.steps,
                     len(written) - len(results), best["train_loss"], best["tokens_per_s"])
        self.meter.restart()

    def write_member(self, member: Member, row: Row, step: int) -> Path | None:
        """A running member's row and checkpoints (best.pt, periodic), as ``train()`` writes them."""
        member.step = step
        member.write(row)
        improved = row["val_loss"] is not None and row["val_loss"] < member.best_val_loss
        t = member.config.train
        if not improved and not t.checkpoints_at(step) and step != t.fork_step:
            return None
        alone = self.state.member_train_state(member.index, member.best_val_loss, member.elapsed_s)
        written = save_checkpoints(member.checkpointer, alone, member.config, row, member.csv.rows, self.meter)
        member.best_val_loss, member.elapsed_s = alone.best_val_loss, alone.elapsed_s
        return written

    def end(self, endings: dict[int, RunEnd]) -> dict[int, RunResult]:
        """Finish these members (summary.json, figures) and freeze them. Eager, they leave the fused tensors at
        once (their compute reclaimed); compiled, only once half the tensors' members have ended, since each
        new member count compiles new graphs: a group of K recompiles at most log2(K) times."""
        if not endings:
            return {}
        results = {m: self.members[m].finish(end, self.meter.elapsed_s(), self.runtime) for m, end in endings.items()}
        for m in endings:
            self.state.freeze(m)
        live = [m.index for m in self.running()]
        if live and self.runtime.compiled and len(live) > len(self.state.positions) // 2:
            return results
        positions = [self.state.positions.index(m) for m in live]
        self.state.keep(live)
        self.meter.keep(positions)
        self.batches.keep(live)
        self.index_positions()
        return results
