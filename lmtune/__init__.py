"""lmtune: learning-rate sweeps for small Transformer language models on Ray Tune."""

__version__ = "0.1.0"
