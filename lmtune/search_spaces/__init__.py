"""The search spaces shipped with lmtune, importable as lmtune.search_spaces (search_spaces/ at the top of
the repository is a link to this folder)."""
