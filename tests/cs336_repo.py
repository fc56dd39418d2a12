"""A CS336 assignment's repository as a student has it (the layout of stanford-cs336/assignment1-basics and its
students' forks), written by the tests into a folder of their own:

    repo/pyproject.toml            the project `cs336_basics`, one third-party dependency
    repo/cs336_basics/__init__.py  `__version__ = importlib.metadata.version("cs336_basics")`: it imports only where
                                   the package is installed in the running environment
    repo/cs336_basics/nn_utils.py  Linear, Embedding, RMSNorm, RoPE, SwiGLU, softmax, attention
    repo/cs336_basics/model.py     TransformerLM, importing them relatively (`from .nn_utils import ...`) and one
                                   third-party module
    repo/cs336_basics/optimizer.py AdamW and get_lr_cosine_schedule (the handout's signatures)

The modules are examples/cs336_model.py cut into the package's files. ``package`` renames the package (tests that
import it in-process each take a name of their own), ``third_party`` the model's third-party import, ``metadata``
whether ``__init__`` reads the installed version.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cs336_model.py"
PACKAGE = "cs336_basics"


def write_cs336_repo(root: Path, package: str = PACKAGE, third_party: str = "numpy", metadata: bool = True) -> Path:
    """The repository at ``root`` (made); returns ``root``."""
    source = EXAMPLE.read_text()
    header = source[:source.index("\n\n\nclass Linear")]
    header = header[header.index("from __future__"):]
    utils = source[source.index("class Linear"):source.index("class MultiHeadSelfAttention")]
    model = source[source.index("class MultiHeadSelfAttention"):source.index("class AdamW")]
    optimizer = source[source.index("class AdamW"):]
    folder = root / package
    folder.mkdir(parents=True)
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "{package}"\nversion = "1.0.6"\nrequires-python = ">=3.11"\n'
        f'dependencies = ["{third_party}"]\n\n'
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[tool.setuptools]\npackages = ["{package}"]\n')
    (folder / "__init__.py").write_text(
        f'import importlib.metadata\n\n__version__ = importlib.metadata.version("{package}")\n' if metadata
        else '__version__ = "1.0.6"\n')
    (folder / "nn_utils.py").write_text(f"{header}\n\n\n{utils}")
    (folder / "model.py").write_text(
        f"{header}\nimport {third_party}  # the model's one third-party import (the handout's: einops)\n\n"
        "from .nn_utils import Embedding, Linear, RMSNorm, RotaryPositionalEmbedding, SwiGLU, "
        f"scaled_dot_product_attention\n\n\n{model}")
    (folder / "optimizer.py").write_text(f"{header}\n\n\n{optimizer}")
    return root


def layered_venv(folder: Path) -> Path:
    """A new virtual environment at ``folder`` that sees the running one's packages (lmtune, torch, pip, setuptools)
    beneath its own: what a student installs there (``pip install -e REPO``) goes into it alone, as into lmtune's
    own venv, without touching the tests' environment. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         check=True, capture_output=True, text=True).stdout.strip()
    beneath = sysconfig.get_paths()["purelib"]
    Path(own, "beneath.pth").write_text(f"import site; site.addsitedir({beneath!r})\n")
    return python
