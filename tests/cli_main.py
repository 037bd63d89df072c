"""`ctxproxy ARGS` through proxy.cli.main in this process: what a test of the CLI's arguments and output needs.

A fresh interpreter per call costs about a second (the package imported from source, tiktoken loaded);
most CLI tests are about what a command prints and its exit status, which main() gives the same way.
Each command keeps at least one test that runs it as users do, in a subprocess (`python -m proxy.cli`):
serve (tests/test_serve.py, test_server_limits.py, test_faults.py), check (test_config.py,
test_redaction.py), stats (test_cli_stats.py, test_redaction.py), replay (test_replay_cli.py).
The benchmarks' entry points run the same way (`main=`); each starts as a module in test_bench_package.py.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from typing import Any
from unittest import mock

import proxy.cli


def run_main(*args: str, env: dict[str, str] | None = None,
             main: Callable[[list[str]], int | None] = proxy.cli.main) -> subprocess.CompletedProcess[str]:
    """Like `subprocess.run([python, -m, proxy.cli, *args], env=env, capture_output=True, text=True)`.

    The environment is exactly `env` (the process's own when None) while main runs; its exit status is
    that of the process (what main returns, or SystemExit's code; a message given to SystemExit is printed
    on stderr; an exception is a traceback on stderr and status 1, as the interpreter would print it).
    """
    out, err = io.StringIO(), io.StringIO()
    code = 0
    environ = dict(os.environ) if env is None else env
    with mock.patch.dict(os.environ, environ, clear=True), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            code = main(list(args)) or 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except Exception:  # noqa: BLE001 - what the interpreter does with it: a traceback, status 1
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess([main.__module__, *args], code, out.getvalue(), err.getvalue())


def run_side_by_side(*commands: list[str], timeout: float = 60, **popen: Any) -> list[subprocess.CompletedProcess[str]]:
    """`subprocess.run(command, capture_output=True, text=True)` of each command, the processes running at once.

    For tests that start several short processes whose runs do not depend on each other: an interpreter's
    start-up is mostly waiting on imports, which two cores overlap."""
    procs = [subprocess.Popen(c, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              **popen) for c in commands]
    done = []
    try:
        for c, proc in zip(commands, procs):
            out, err = proc.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(c, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done
