"""The benchmarks are a package run as `python -m bench.<name>` from the repository root.

Each one is started here as a user starts it (a subprocess, cwd the repository
root), so a broken import or a lost option shows up without running a whole
benchmark. The replay's client-side settings run on one trajectory (no proxy
involved, a few seconds) through its main in this process (tests/cli_main.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_main import run_main, run_side_by_side

from bench.replay.cli import main as replay_main

ROOT = Path(__file__).resolve().parents[1]
MODULES = ["all", "replay", "overhead", "overhead.floor", "load", "scaling", "workers", "token_count", "precompute",
           "plot"]


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess[str]]:
    """`python -m bench.<name> --help` of every benchmark, the processes side by side (each is mostly imports)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # -m finds bench, tests, proxy from the cwd
    runs = run_side_by_side(*([sys.executable, "-m", f"bench.{name}", "--help"] for name in MODULES), timeout=120,
                            cwd=ROOT, env=env)
    return dict(zip(MODULES, runs))


@pytest.mark.parametrize("name", MODULES)
def test_each_benchmark_starts_as_a_module(name: str, helps: dict[str, subprocess.CompletedProcess[str]]) -> None:
    out = helps[name]
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: ")


def test_options_kept(helps: dict[str, subprocess.CompletedProcess[str]]) -> None:
    """The options the published command lines use are still there."""
    replay = helps["replay"].stdout
    for opt in ("--window", "--settings", "--traces", "--traces-dir", "--json", "--proxy-mode", "--final-turn",
                "--proxy-src", "--per-trace", "--quiet", "--api", "--native"):
        assert opt in replay
    overhead = helps["overhead"].stdout
    for opt in ("--quick", "--json", "--max-seconds", "--proxy-cmd", "--keep-log", "--litellm"):
        assert opt in overhead
    load = helps["load"].stdout
    for opt in ("--quick", "--hostile", "--concurrency", "--duration", "--streams", "--agents", "--delay",
                "--chunk-delay", "--no-profile", "--proxy-cmd", "--keep-log", "--json", "--md", "--max-seconds"):
        assert opt in load


def test_no_import_path_tricks_or_machine_paths() -> None:
    for path in sorted((ROOT / "bench").rglob("*.py")):
        if ".venvs" in path.parts:  # the benchmarks' own virtualenvs (LiteLLM, cliffcompaction, ...)
            continue
        text = path.read_text(encoding="utf-8")
        assert "sys.path" not in text, path
        assert not re.search(r"""["'](/work/|/tmp/)""", text), path


def test_replay_client_side_settings_on_one_trajectory() -> None:
    """On the trajectories shipped in the package, so the corpus beside the repository is not needed."""
    out = run_main("--traces-dir", str(ROOT / "proxy" / "examples"), "--traces", "13", "--window", "32000", "--quiet",
                   "--settings", "no-proxy,sliding-window-20,middle-out", main=replay_main)
    assert out.returncode == 0, out.stderr
    assert "| sliding-window-20 |" in out.stdout and "| middle-out |" in out.stdout
    assert "issue" not in out.stdout.lower()
