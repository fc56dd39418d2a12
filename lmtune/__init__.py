"""lmtune: learning-rate sweeps for small Transformer language models on Ray Tune.

From Python (lmtune.api): ``lmtune.Sweep`` (one of lmtune's sweeps as the trainable, searcher, scheduler and
stopper of your own Tuner, and its report), ``lmtune.trainable`` (the function trainable for one config),
``lmtune.DivergenceStopper`` and ``lmtune.report``. They are imported on first use, so ``import lmtune`` (and
each command) does not load Ray and torch before it needs them.
"""

__version__ = "0.1.0"
"""lmtune's version (pyproject.toml reads it here), recorded in every sweep.json."""

_API = ("Sweep", "trainable", "report", "DivergenceStopper")
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        from lmtune import api

        return getattr(api, name)
    raise AttributeError(f"module 'lmtune' has no attribute {name!r}")
