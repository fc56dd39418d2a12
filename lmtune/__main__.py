"""``python -m lmtune COMMAND [ARGS ...]``: the same as the ``lmtune`` console script (lmtune.cli)."""

from lmtune.cli import main

raise SystemExit(main())
