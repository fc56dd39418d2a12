"""What ``python -m lmtune.run`` was asked to do (lmtune/run.py parses its options into ``SweepOptions``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from lmtune.sweep.disk import Keep
from lmtune.usercode.config import UserCode


@dataclass(frozen=True)
class SweepOptions:
    """What ``python -m lmtune.run`` was asked to do, checked once by the CLI."""

    space: str | None
    """A space name in search_spaces/ or a YAML path (None on --resume: the sweep's own)."""
    name: str
    """The sweep's folder under ``results``."""
    results: Path = Path("results")
    results_flag: str = "--results"
    """The option that named ``results`` (--storage for a storage folder), named in the messages about it."""
    data: Path | None = None
    """A prepared data dir; None: the built-in corpus."""
    budget: str | None = None
    """Overrides the space's budget."""
    overrides: dict[str, str] = field(default_factory=dict)
    """--set key=value pairs as given (their types checked against the config's fields when the plan is made)."""
    resume: bool = False
    storage: str | None = None
    """Ray storage: a shared path or an s3:// / gs:// URI; None: ``results``."""
    time_budget_s: float | None = None
    gpus_per_trial: float | None = None
    """None: one trial per GPU share the packing rule picks (lmtune.sweep.placement)."""
    fuse: int | None = None
    """LRs per fused trial; None: the space's ``fuse``."""
    cpus_per_trial: float = 1.0
    max_concurrent: int | None = None
    max_failures: int = 2
    address: str | None = None
    """A Ray cluster to join (auto or HOST:PORT); None: a local Ray instance of this process."""
    num_cpus: int | None = None
    num_gpus: float | None = None
    ship_data_mb: int = 2048
    dashboard: bool = True
    trial_figures: bool = False
    """Each trial draws its own loss_curves.png and lr_schedule.png (lmtune.sweep.plan.TrialSetup.trial_figures)."""
    dashboard_host: str = "127.0.0.1"
    quiet: bool = False
    wandb_project: str | None = None
    command: tuple[str, ...] = ()
    keep: Keep = Keep.BEST
    """What an ended trial keeps (lmtune.sweep.retention): best.pt; also its newest checkpoint; or all."""
    force: bool = False
    """Start even when the results disk has less free space than the sweep is estimated to need."""
    cluster_config: Path | None = None
    """With --address: the autoscaler's config (its node types: what the cluster can scale to)."""
    step_hook: str | None = None
    """MODULE:FUNCTION each trial runs before every step (lmtune.sweep.hooks); None: none."""
    code: UserCode = field(default_factory=UserCode)
    trust_code: bool = False
    """--resume --trust-code: import the sweep's recorded code even where it is not the file the sweep started with
    (lmtune.usercode.consent)."""
    """The user's code the flags name (--model, --model-set, --optimizer, --schedule), over the space's own."""

    @property
    def sweep_dir(self) -> Path:
        return self.results.resolve() / self.name

    @property
    def storage_path(self) -> str:
        return self.storage or str(self.results.resolve())
