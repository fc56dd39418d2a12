"""What ``python -m lmtune.bench`` measures, as typed results: one benchmark (``BenchResult``), K processes
at once (``ConcurrencyReport``) and K fused members (``FuseReport``). ``to_json`` gives the JSON object
--json prints and --record appends to benchmarks/results.jsonl (the keys the file has always had)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Fields every bench JSON object carries (the tests check them; --record writes them).
REQUIRED_FIELDS = (
    "config", "device", "torch", "commit", "batch_size", "context_length", "tokens_per_s", "mfu",
    "naive_tokens_per_s", "speedup_vs_naive", "data_wait_fraction", "peak_memory_bytes",
)


@dataclass(frozen=True)
class CompileComparison:
    """Eager against compiled, when both were timed (--compile both)."""

    speedup: float
    """Compiled tokens/s over eager tokens/s (medians)."""
    speedup_paired: float
    """Median over repeats of eager wall / compiled wall, repeats paired (robust to drifting load)."""


@dataclass(frozen=True)
class NaiveComparison:
    """The optimized step against the naive baseline, when the baseline ran."""

    tokens_per_s: float
    """The naive loop's tokens/s (median over repeats)."""
    speedup: float
    """Optimized tokens/s over naive tokens/s."""
    speedup_paired: float
    """Median over repeats of naive wall / optimized wall, repeats paired."""
    data_wait_fraction: float
    """Share of the naive loop's wall time spent building its batches."""


@dataclass(frozen=True)
class BenchResult:
    """One benchmark of the optimized step (the fastest variant timed), medians over the timed repeats."""

    config: str
    """The --budget name (or the config's budget)."""
    device: str
    """The device's full name (the CPU's model on CPU)."""
    device_type: str
    """cuda, cpu or mps."""
    torch: str
    """torch's version."""
    commit: str
    """The git commit lmtune ran from ("unknown" outside a checkout)."""
    batch_size: int
    """Sequences per step."""
    context_length: int
    """Tokens per sequence."""
    params_non_embedding: int
    """The model's parameters outside the embeddings."""
    steps: int
    """Timed steps per repeat."""
    repeats: int
    """Timed repeats per loop."""
    warmup: int
    """Untimed steps before the first repeat (compilation included)."""
    tokens_per_s: float
    """The optimized step's tokens/s."""
    mfu: float
    """tokens_per_s x flops_per_token / peak_flops."""
    flops_per_token: float
    """Training FLOPs per token of the model."""
    peak_flops: float
    """The MFU denominator."""
    peak_flops_source: str
    """Where peak_flops comes from: the data sheet, or a matmul measured here."""
    optimized_variant: str
    """eager or compiled: the variant reported."""
    compile_mode: str | None
    """torch.compile's mode (None: it ran eager)."""
    precision: str
    """bfloat16 (autocast) or float32."""
    attention_kernel: str
    """The kernel SDPA picks for this model."""
    host_syncs_per_step: int | None
    """Host syncs in one optimized step (None off CUDA)."""
    step_s: float
    """Seconds per step."""
    data_wait_s: float
    """Of a step, the seconds spent waiting for its batch."""
    compute_s: float
    """Of a step, the rest."""
    data_wait_fraction: float
    """data_wait_s / step_s."""
    peak_memory_bytes: int | None
    """Peak memory of the first timed repeat (see peak_memory_kind)."""
    peak_memory_kind: str
    """cuda max_memory_allocated, or process peak RSS."""
    peak_reserved_bytes: int | None
    """CUDA's peak reserved memory (None off CUDA)."""
    warmup_s: dict[str, float]
    """Each loop's warm-up seconds, by loop name."""
    timed_tokens: int
    """Tokens of all timed repeats of one loop."""
    load_avg_1m: float | None
    """The 1-minute load average at the end: how busy other processes kept the cores."""
    eval_s: float | None
    """Seconds per evaluation (None: not timed)."""
    eval_fraction: float | None
    """Evaluation's share of wall time at the config's eval_interval (None: not timed)."""
    repeat_tokens_per_s: dict[str, list[float]]
    """Each loop's tokens/s in every repeat, by loop name (JSON: NAME_repeat_tokens_per_s)."""
    variant_tokens_per_s: dict[str, float]
    """Each optimized variant's tokens/s, by name (JSON: NAME_tokens_per_s)."""
    compile: CompileComparison | None
    """Eager against compiled, when both were timed."""
    naive: NaiveComparison | None
    """Against the naive baseline, when it ran."""
    timed_span: tuple[float, float] | None
    """(start, end) Unix time of the timed phase, for concurrency workers (JSON: timed_start/end_unix)."""
    command: str | None = None
    """The command line that ran it, when the bench command did."""
    model: str = "lmtune's TransformerLM"
    """The model timed: lmtune's, or the user's --model (lmtune.usercode.config.UserCode.describe)."""
    flops_estimated: bool = False
    """flops_per_token (and so mfu) estimated from the parameters' shapes: a user's model."""

    def to_json(self) -> dict[str, object]:
        data = asdict(self)
        for key in ("repeat_tokens_per_s", "variant_tokens_per_s", "compile", "naive", "timed_span", "command"):
            del data[key]
        data.update({f"{name}_repeat_tokens_per_s": rates for name, rates in self.repeat_tokens_per_s.items()})
        data.update({f"{name}_tokens_per_s": rate for name, rate in self.variant_tokens_per_s.items()})
        if self.compile is not None:
            data.update(compile_speedup=self.compile.speedup, compile_speedup_paired=self.compile.speedup_paired)
        if self.naive is not None:
            data.update(naive_tokens_per_s=self.naive.tokens_per_s, speedup_vs_naive=self.naive.speedup,
                        speedup_vs_naive_paired=self.naive.speedup_paired,
                        naive_data_wait_fraction=self.naive.data_wait_fraction)
        if self.timed_span is not None:
            data["timed_start_unix"], data["timed_end_unix"] = self.timed_span
        if self.command is not None:
            data["command"] = self.command
        return data


@dataclass(frozen=True)
class ConcurrencyRow:
    """K worker processes timed at once."""

    k: int
    """Processes."""
    aggregate_tokens_per_s: float
    """All timed tokens over the span from the first worker's timed start to the last one's end."""
    per_process_tokens_per_s: list[float]
    """Each worker's own tokens/s."""
    per_process_peak_memory_bytes: int
    """The largest worker's peak memory."""
    per_process_peak_reserved_bytes: int | None
    """The largest worker's CUDA peak reserved memory (None off CUDA)."""


@dataclass(frozen=True)
class ConcurrencyReport:
    """``bench --concurrency``: each K, and the trials per GPU they suggest."""

    config: str
    """The --budget name."""
    device: str
    """The device's full name."""
    torch: str
    """torch's version."""
    commit: str
    """The git commit lmtune ran from."""
    batch_size: int
    """Sequences per step."""
    context_length: int
    """Tokens per sequence."""
    concurrency: list[ConcurrencyRow]
    """One row per K."""
    estimated_trial_memory_bytes: int
    """The model's estimate of one trial's memory."""
    recommended_trials_per_gpu: int | None
    """What lmtune.sweep.placement makes of the rows (None off CUDA)."""
    command: str
    """The command line that ran it."""

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class FusedTiming:
    """One fused process of K members, timed alone."""

    k: int
    """Members."""
    aggregate_tokens_per_s: float
    """All members' tokens/s together (median over repeats)."""
    peak_memory_bytes: int | None
    """Its CUDA peak memory (None off CUDA)."""


@dataclass(frozen=True)
class FuseRow:
    """K fused members against K separate processes at once and against one process alone."""

    k: int
    """Members (and separate processes)."""
    fused_aggregate_tokens_per_s: float
    """The fused process's tokens/s, all members together."""
    fused_peak_memory_bytes: int | None
    """The fused process's CUDA peak memory (None off CUDA)."""
    separate_aggregate_tokens_per_s: float
    """K separate processes' aggregate tokens/s."""
    fused_vs_separate: float
    """fused_aggregate_tokens_per_s / separate_aggregate_tokens_per_s."""
    fused_vs_one_alone: float
    """fused_aggregate_tokens_per_s over one process alone (= K runs one after another)."""

    @classmethod
    def compare(cls, fused: FusedTiming, separate: float, alone: float) -> FuseRow:
        return cls(fused.k, fused.aggregate_tokens_per_s, fused.peak_memory_bytes, separate,
                   fused.aggregate_tokens_per_s / separate, fused.aggregate_tokens_per_s / alone)


@dataclass(frozen=True)
class FuseReport:
    """``bench --fuse``: each K fused against separate processes."""

    config: str
    """The --budget name."""
    device: str
    """The device's full name."""
    torch: str
    """torch's version."""
    commit: str
    """The git commit lmtune ran from."""
    batch_size: int
    """Sequences per step."""
    context_length: int
    """Tokens per sequence."""
    compiled: bool
    """Whether the fused step ran compiled."""
    steps: int
    """Timed steps per repeat."""
    repeats: int
    """Timed repeats."""
    one_alone_tokens_per_s: float
    """One process alone: the aggregate of K runs one after another."""
    fuse: list[FuseRow]
    """One row per K."""
    command: str
    """The command line that ran it."""
    kind: str = "fuse"
    """Tells this object from a benchmark's in benchmarks/results.jsonl."""

    def to_json(self) -> dict[str, object]:
        return asdict(self)
