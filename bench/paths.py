"""Where the benchmarks find the repository and the trajectory corpus.

The corpus (the recorded agent trajectories the replay, scaling, token-count
and overhead benchmarks read) is not part of the repository: it comes from an
argument, from ``$CTXPROXY_TRACES_DIR``, or else from ``shared/traces`` beside
the repository (where the project keeps it), when that exists.
"""

from __future__ import annotations

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository (bench/..)
PROXY_CLI = "proxy.cli"  # the module `python -m` runs as `ctxproxy` (serve, replay, ...)
TRACES_ENV = "CTXPROXY_TRACES_DIR"


SIBLING_TRACES = os.path.join(os.path.dirname(ROOT), "shared", "traces")


def default_traces_dir() -> str | None:
    """The corpus directory from the environment, else the project's beside the repository; None if neither."""
    return os.environ.get(TRACES_ENV) or (SIBLING_TRACES if os.path.isdir(SIBLING_TRACES) else None)


def traces_dir(path: str | None = None) -> str:
    """`path`, else ``$CTXPROXY_TRACES_DIR``; exits with a message saying how to set it when neither is there."""
    found = path or default_traces_dir()
    if not found:
        raise SystemExit(f"no trajectory corpus given: set {TRACES_ENV}=DIR (or pass the script's --traces-dir / "
                         "--traces option), DIR holding the trajectory JSON files")
    if not os.path.isdir(found):
        raise SystemExit(f"trajectory corpus {found!r} is not a directory")
    return found
