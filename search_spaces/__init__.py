"""The search spaces shipped with lmtune, importable as lmtune.search_spaces (pyproject.toml maps it here)."""
