"""Facts about the machine and the checkout a timing was taken on, printed beside the figures.

Timings only compare within one machine and one commit, so every timed
benchmark (overhead, load, scaling) prints these with its table.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Any

from bench.paths import ROOT


def machine_facts() -> dict[str, Any]:
    """CPUs, CPU model, Python, platform, load average now, the HTTP stack's versions, and the checkout."""
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = {}
    for mod in ("uvicorn", "uvloop", "httptools", "aiohttp", "httpx", "starlette", "fastapi"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            versions[mod] = "?"
    try:
        load = os.getloadavg()
    except OSError:
        load = (float("nan"),) * 3
    return {"cpu_count": os.cpu_count(), "git": git_state(), "cpu_model": cpu, "python": sys.version.split()[0],
            "implementation": platform.python_implementation(), "platform": platform.platform(),
            "loadavg_at_start": [round(x, 2) for x in load], "versions": versions}


def git_state() -> str:
    """`<short commit>` plus how many files under proxy/ differ from it (read-only git calls)."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--", "proxy"],
                               capture_output=True, text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "?"
    if not head:
        return "?"
    return head + (f" + {len(dirty)} uncommitted file(s) under proxy/" if dirty else " (proxy/ clean)")
