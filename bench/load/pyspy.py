"""Where the proxy spends its time under load: ``py-spy record`` on it, and the top frames of what it saw."""

from __future__ import annotations

import collections
import os
import shlex
import shutil
import subprocess
import sys
from typing import Any

from bench.paths import ROOT


def profile_proxy(pid: int, seconds: float, out: str) -> tuple[subprocess.Popen[bytes] | None, str]:
    """Start `py-spy record` on `pid` for `seconds`; (the process, its command), or (None, why not)."""
    exe = shutil.which("py-spy")
    if not exe:
        return None, "py-spy not installed (pip install py-spy, for diagnosis only)"
    cmd = [exe, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
           "--format", "raw", "--threads", "--output", out, "--nonblocking"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT), shlex.join(cmd)


def top_frames(path: str, n: int = 15) -> dict[str, Any]:
    """Shares of py-spy's collapsed stacks (`--threads`), % of all samples: per thread; own (leaf) time
    by function and by package (or ctxproxy module) and thread; inclusive time of ctxproxy's functions.
    With uvloop a resumed coroutine's stack starts at its task, not at the loop."""
    self_c: collections.Counter[str] = collections.Counter()
    incl_proxy: collections.Counter[str] = collections.Counter()
    by_package: collections.Counter[str] = collections.Counter()
    by_thread: collections.Counter[str] = collections.Counter()
    total = 0
    with open(path, errors="replace") as f:
        for line in f:
            stack, _, cnt = line.rstrip("\n").rpartition(" ")
            try:
                c = int(cnt)
            except ValueError:
                continue
            raw = [fr for fr in stack.split(";") if fr]
            thread = "?"
            if raw and raw[0].startswith("thread ("):
                thread = raw.pop(0).split(": ", 1)[-1]
            frames = [_short_frame(fr) for fr in raw]
            if not frames:
                continue
            total += c
            by_thread[thread] += c
            self_c[frames[-1]] += c
            leaf = frames[-1].rpartition(" (")[2].rstrip(")")
            package = leaf.split("/", 1)[0] if "/" in leaf else leaf.removesuffix(".py")
            if package == "proxy":
                package = "/".join(leaf.split("/")[:2]).removesuffix(".py")
            by_package[f"{package} ({thread})"] += c
            for fr in set(frames):
                if "(proxy/" in fr and not fr.startswith(("main (proxy/cli", "_serve (proxy/cli")):
                    incl_proxy[fr] += c
    if not total:
        return {"samples": 0}
    share = lambda counter, k: [(fr, c / total * 100) for fr, c in counter.most_common(k)]  # noqa: E731
    return {"samples": total, "threads": share(by_thread, 6), "self": share(self_c, n),
            "proxy_inclusive": share(incl_proxy, n), "packages": share(by_package, n)}


def _short_frame(frame: str) -> str:
    """`func (path/to/site-packages/pkg/mod.py:123)` -> `func (pkg/mod.py)`."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", ROOT + os.sep, f"/lib/python{sys.version_info[0]}.{sys.version_info[1]}/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{name} ({path})" if path else name
