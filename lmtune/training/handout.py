"""The CS336 handout's names for lmtune's settings, mapped once at the door (``canonical_settings``: --set, a space
file's ``set:``, ``lmtune.Sweep``'s keywords, a trial's Tune config) onto lmtune's own, so that what lmtune writes
carries its own name only; and the handout's names whose meaning no lmtune setting shares, each refused in one line
naming the setting to give instead (never taken for a setting of another meaning)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypeVar

from lmtune.errors import LmtuneError

# The handout's names for lmtune's settings, each of the same meaning: its TransformerLM's arguments (which lmtune
# passes a user's model under the same names: lmtune.usercode.model.CONSTRUCTOR_ARGS), get_lr_cosine_schedule's peak
# and warm-up (lmtune's cosine is the handout's formula: lmtune.training.schedule.cosine_lr), gradient_clipping's
# max_l2_norm (the global norm, as grad_clip) and the training loop's iterations (optimizer steps). vocab_size,
# context_length, d_model, d_ff, rope_theta and batch_size are lmtune's names too.
HANDOUT_NAMES = {"num_layers": "n_layers", "num_heads": "n_heads", "max_learning_rate": "lr",
                 "warmup_iters": "warmup_steps", "max_iters": "steps", "max_l2_norm": "grad_clip"}

# The handout's names no lmtune setting shares the meaning of: its floor is a fraction of the peak LR (one value holds
# for every LR a sweep tries), and its cosine ends at that floor on the run's last step (a user's --schedule is called
# with cosine_cycle_iters = steps - 1: lmtune.usercode.optim.schedule_arguments).
HANDOUT_REFUSED = {
    "min_learning_rate": "min_learning_rate, the handout's floor of the LR, is absolute, and lmtune's is a fraction of "
                         "the peak LR (the same fraction at every LR a sweep tries): give min_lr_ratio = "
                         "min_learning_rate / max_learning_rate instead (default 0.1)",
    "cosine_cycle_iters": "cosine_cycle_iters is no setting of lmtune's: its cosine reaches the minimum LR on the "
                          "run's last step, so cosine_cycle_iters is steps - 1; give steps (the handout's max_iters) "
                          "instead",
}

# max_l2_norm=0 scales every gradient to zero in the handout's gradient_clipping; lmtune's grad_clip=0 turns clipping
# off: not the same meaning, so refused.
NO_CLIPPING = ("max_l2_norm=0 would scale every gradient to zero in the handout's gradient_clipping, and lmtune's "
               "grad_clip=0 turns clipping off: give grad_clip=0 for no clipping, or a positive max_l2_norm")

S = TypeVar("S")


def canonical_settings(settings: Mapping[str, S], where: str = "--set") -> dict[str, S]:
    """``settings`` with each handout name (HANDOUT_NAMES) under lmtune's name for it, in the same order; refused in
    one line where a handout name and lmtune's both name one setting, and for a handout name or value whose meaning
    no lmtune setting shares (HANDOUT_REFUSED, max_l2_norm=0)."""
    result: dict[str, S] = {}
    for name, value in settings.items():
        refused_handout_name(name, where)
        if name == "max_l2_norm" and _is_zero(value):
            raise LmtuneError(f"{where}: {NO_CLIPPING}")
        own = HANDOUT_NAMES.get(name, name)
        if own in result:
            both = sorted({name, own, *(k for k, v in HANDOUT_NAMES.items() if v == own)} & set(settings))
            raise LmtuneError(f"{where}: {' and '.join(both)} name one setting ({own}); give it once")
        result[own] = value
    return result


def refused_handout_name(name: str, where: str | None = None) -> None:
    """Refuse, in one line naming what to give instead, a handout name lmtune has no setting of its meaning for."""
    if name in HANDOUT_REFUSED:
        raise LmtuneError(f"{where}: {HANDOUT_REFUSED[name]}" if where else HANDOUT_REFUSED[name])


def handout_name(own: str, given: Iterable[str]) -> str:
    """How ``given`` (the settings' names as the user gave them) names lmtune's setting ``own``: "max_learning_rate
    (the handout's name for lr)" where by a handout name, else ``own``."""
    handout = [name for name in given if name != own and HANDOUT_NAMES.get(name) == own]
    return f"{handout[0]} (the handout's name for {own})" if handout else own


def _is_zero(value: object) -> bool:
    """Whether a setting's value as given (a --set string, a YAML or Python number) is the number 0."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return False
    try:
        return float(value) == 0
    except ValueError:
        return False
