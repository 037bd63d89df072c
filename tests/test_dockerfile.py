"""The Dockerfile's build steps name modules and commands that exist in this tree.

There is no Docker daemon here, so a renamed module (``proxy.encodings`` became
``proxy.tokens.encodings``) would break the image build unseen; this reads the
Dockerfile's ``python -m`` steps and runs each the way the build would.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parent.parent / "Dockerfile"


def _python_modules() -> list[str]:
    text = DOCKERFILE.read_text(encoding="utf-8")
    run_lines = " ".join(
        line for line in text.replace("\\\n", " ").splitlines() if line.lstrip().startswith("RUN ")
    )
    return re.findall(r"python3? -m ([\w.]+)", run_lines)


def test_every_python_m_step_names_a_module_that_exists() -> None:
    modules = _python_modules()
    assert modules, "the Dockerfile seeds the encodings with a `python -m` step"
    for name in modules:
        assert importlib.util.find_spec(name) is not None, f"Dockerfile runs `python -m {name}`, which does not exist"


def test_the_encoding_step_runs_and_verifies(tmp_path: Path) -> None:
    for name in _python_modules():
        done = subprocess.run(
            [sys.executable, "-m", name],
            env={"TIKTOKEN_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "o200k_base sha256=" in done.stdout
