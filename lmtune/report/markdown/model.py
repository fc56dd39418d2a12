"""The report's words on the model the sweep trained (its name, size and what lmtune measures of it) and on what
the best LR's model writes."""

from __future__ import annotations

from lmtune.findings.summary import ModelFacts, SweepFacts


def model_overview(facts: SweepFacts) -> list[str]:
    """One paragraph after the overview: which model, its size, and, for a user's model, what is estimated and
    what is not measured."""
    model = facts.model
    if model is None:
        return []
    return [f"**Model**: {model.title or model.name}{_size(model)}.{_measured(model)}", ""]


def _size(model: ModelFacts) -> str:
    if model.params_non_embedding is None:
        return ""
    total = f" ({model.params_total / 1e6:.2f}M in all)" if model.params_total else ""
    flops = ""
    if model.flops_per_token:
        how = " (estimated by formula from its parameters' shapes, its count having failed: the embedding and output " \
              "projection told apart by their vocabulary dimension, attention's term from the config)" \
            if model.flops_estimated else " (counted by torch's FlopCounterMode over one forward and backward)" \
            if model.flops_counted else ""
        flops = f", {model.flops_per_token / 1e6:.2f} MFLOP per training token{how}"
    return f": {model.params_non_embedding / 1e6:.2f}M non-embedding parameters{total}{flops}"


def _measured(model: ModelFacts) -> str:
    if model.attention_logits_measured is not False:  # (measured, or no row logged yet)
        return ""
    return (" Its attention logits are not measured for this model (lmtune cannot see inside its attention): the "
            "stability probes are the gradient norm, the output logits and each block's relative update size.")


def samples(facts: SweepFacts) -> list[str]:
    """The best LR's model's samples, each quoted, or why there are none."""
    lines = ["## Samples from the best LR's model", ""]
    if not facts.samples:
        note = facts.samples_note or "not drawn"
        return lines + [f"No samples: {note}.", ""]
    first = facts.samples[0]
    lines += [f"From the best trial's `checkpoints/best.pt`, {len(facts.samples)} samples of up to 256 tokens at "
              f"temperature 0.8 and top-p 0.9 (`lmtune sample CHECKPOINT` draws more), each continuing "
              f"\"{first.prompt}\":", ""]
    for sample in facts.samples:
        quoted = "\n".join(f"> {line}" if line else ">" for line in f"{sample.prompt}{sample.text}".splitlines())
        lines += [f"Seed {sample.seed} ({sample.tokens} tokens):", "", quoted, ""]
    return lines
