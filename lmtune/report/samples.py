"""What the best LR's model writes: samples from the best trial's best.pt for the report, as ``lmtune sample`` draws
them (lmtune.training.sampling), on the CPU: from "Once upon a time" where the data has a tokenizer, else from the
data's end-of-text token, shown as token ids.

A sample needs the model's code: lmtune's, or the user's. The user's is code the sweep's folder names, imported only
with the consent of the command writing the report (``analyze --trust-code``, or ``--model`` naming the user's own
copy: lmtune.usercode.consent). Where there is none, or the model cannot be built here (the user's code is not
importable on this machine, the checkpoint is gone, its forward raises), the report says why instead.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import torch

from lmtune.data.dataset import read_meta
from lmtune.data.documents import EOT
from lmtune.errors import LmtuneError
from lmtune.findings.summary import Sample
from lmtune.training.sampling import DEFAULT_PROMPT, SampleSettings, generate
from lmtune.usercode.consent import NO_CONSENT, REFUSED_NOTE, CodeConsent, FolderCodeRefused
from lmtune.usercode.guard import user_call
from lmtune.usercode.spec import load_model

log = logging.getLogger(__name__)

# CS336's: 256 tokens at temperature 0.8 with nucleus sampling at 0.9.
REPORT_SAMPLING = SampleSettings(max_tokens=256, temperature=0.8, top_p=0.9)


def best_samples(best_trial_dir: str | None, count: int,
                 consent: CodeConsent = NO_CONSENT) -> tuple[tuple[Sample, ...], str]:
    """``count`` samples (seeds 0, 1, ...) from the best trial's best.pt, or none and why (a user's model: only as
    ``consent`` allows it to be built)."""
    if count <= 0:
        return (), "not drawn (analyze --samples 0)"
    checkpoint = Path(best_trial_dir) / "checkpoints" / "best.pt" if best_trial_dir else None
    if checkpoint is None or not checkpoint.is_file():
        return (), "not drawn: the best trial kept no checkpoints/best.pt"
    try:
        model, config = load_model(checkpoint, torch.device("cpu"), consent)
        tokenizer, stop, prompt = _prompt(config.data_dir)
    except FolderCodeRefused as err:  # (said once, by the report and the command, not as a warning too)
        return (), f"{REFUSED_NOTE}: {err}"
    except LmtuneError as err:
        log.warning("no samples in the report: %s", err)
        return (), f"not drawn: {err}"
    samples = []
    for seed in range(count):
        settings = SampleSettings(REPORT_SAMPLING.max_tokens, REPORT_SAMPLING.temperature, REPORT_SAMPLING.top_p, seed)
        try:  # (the user's forward is guarded: whatever it raises is one line naming its file and line)
            ids = generate(model, prompt, settings, config.model.context_length, stop,
                           functools.partial(user_call, config.code.model))
        except LmtuneError as err:
            log.warning("no samples in the report: %s", err)
            return (), f"not drawn: {err}"
        text = tokenizer.decode(ids) if tokenizer is not None else " ".join(map(str, ids))
        shown = DEFAULT_PROMPT if tokenizer is not None else " ".join(map(str, prompt))
        samples.append(Sample(seed, shown, text, len(ids)))
    return tuple(samples), ""


def _prompt(data_dir: str):
    """(tokenizer or None, the end-of-text id or None, the prompt's ids) for the run's data."""
    from lmtune.data.tokenizer import load_tokenizer

    own = Path(data_dir) / "tokenizer.json"
    if own.is_file():
        tokenizer = load_tokenizer(own)
        return tokenizer, tokenizer.token_to_id(EOT), tokenizer.encode(DEFAULT_PROMPT).ids
    eot = read_meta(Path(data_dir)).eot_id if (Path(data_dir) / "meta.json").is_file() else None
    return None, eot, [eot if eot is not None else 0]
