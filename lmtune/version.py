"""lmtune's version (pyproject.toml's), recorded in every sweep.json."""

__version__ = "0.1.0"
