"""Open-source context proxies run side by side with ctxproxy in the replay (``python -m bench.replay``).

Each one is pip-installed, pinned, into its own virtualenv under
``bench/.venvs/<name>`` (gitignored) by the benchmark itself, the first time it
is needed; later runs reuse the environment when the pinned version is there.
It then runs as a subprocess on a free 127.0.0.1 port in front of the mock
provider. When it cannot be installed or started, ``ExternalUnavailable``
carries the exact error text, and the replay reports it and goes on without it.

* ``cliffcompaction==0.1.0``: ``cliff serve --host 127.0.0.1 --port P
  --openai-upstream http://127.0.0.1:M --threshold N`` (upstream without
  ``/v1``: it appends the request path). Code-only compaction: no LLM call of
  its own; past N estimated tokens (chars/4 of the request body) everything but
  the head and the last ``--keep-recent`` (3) turns becomes one user message
  of assistant text, tool-call signatures (150 chars) and tool results under
  500 chars. N = 0.85 x window, the trigger ctxproxy uses (``cliffcompaction-at-window``:
  N = the window, for sensitivity).
* ``ctxkeeper==1.2.0``: ``ctxkeeper --recipe agent --budget W --host 127.0.0.1
  --port P --upstream http://127.0.0.1:M --state-dir DIR`` (the one
  console script; ``--recipe agent`` = "any OpenAI-compatible server"). Keeps
  NOTES written by the model itself (in-place notes every 15,000 tokens,
  ``max_tokens`` 8192 for those calls), archives the cut turns and adds a
  ``recall`` tool and a Memory paragraph to the system message. It does not
  forward the client's Authorization header on the chat path, so all its
  traffic shares one provider cache scope: the replay clears the mock's prefix
  cache between trajectories (a no-op for the other settings, which use one
  key per trajectory) and sends ``X-Ctx-Session`` per trajectory.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

HERE = os.path.dirname(os.path.abspath(__file__))
VENVS = os.path.join(HERE, ".venvs")
INSTALL_TIMEOUT = 600.0  # seconds for one pip install
START_TIMEOUT = 30.0


class ExternalUnavailable(RuntimeError):
    """The proxy could not be installed or started; the message is the exact error text."""


@dataclass(frozen=True)
class External:
    name: str  # venv folder and setting name
    requirement: str  # pip requirement, pinned
    script: str  # console script in the venv's bin/
    # (script path, port, upstream base without /v1, window, state dir) -> argv
    argv: Callable[[str, int, str, int, str], list[str]]
    session_header: str | None = None  # header naming the conversation, if the proxy reads one
    notes: str = ""
    env: dict[str, str] = field(default_factory=dict)
    venv_name: str | None = None  # default: the requirement's distribution name

    @property
    def dist(self) -> str:
        """The distribution name: the requirement without its extras and pin."""
        return self.requirement.split("==", 1)[0].split("[", 1)[0]

    @property
    def venv(self) -> str:
        return os.path.join(VENVS, self.venv_name or self.dist)

    @property
    def bin(self) -> str:
        return os.path.join(self.venv, "bin", self.script)


def _cliff(share: float) -> Callable[[str, int, str, int, str], list[str]]:
    def argv(exe: str, port: int, upstream: str, window: int, state: str) -> list[str]:
        return [exe, "serve", "--host", "127.0.0.1", "--port", str(port), "--openai-upstream", upstream,
                "--threshold", str(int(share * window))]
    return argv


def _ctxkeeper_argv(exe: str, port: int, upstream: str, window: int, state: str) -> list[str]:
    return [exe, "--recipe", "agent", "--budget", str(window), "--host", "127.0.0.1", "--port", str(port),
            "--upstream", upstream, "--state-dir", state]


EXTERNALS: dict[str, External] = {e.name: e for e in (
    External("cliffcompaction", "cliffcompaction==0.1.0", "cliff", _cliff(0.85),
             notes="threshold = 0.85 x window (est. tokens = chars/4), other flags default"),
    External("cliffcompaction-at-window", "cliffcompaction==0.1.0", "cliff", _cliff(1.0),
             notes="threshold = the window itself (sensitivity), other flags default"),
    External("ctxkeeper", "ctxkeeper==1.2.0", "ctxkeeper", _ctxkeeper_argv, session_header="X-Ctx-Session",
             notes="--recipe agent --budget <window>, other flags default"),
)}


def _pip_version(e: External) -> str | None:
    py = os.path.join(e.venv, "bin", "python")
    if not os.path.exists(py):
        return None
    dist = e.dist
    try:
        out = subprocess.run([py, "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def ensure_installed(e: External, log: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
    """The pinned package in its own venv; returns {version, installed_now, install_s}. Raises ExternalUnavailable."""
    want = e.requirement.split("==", 1)[1]
    have = _pip_version(e)
    if have == want and os.path.exists(e.bin):
        return {"version": have, "installed_now": False, "install_s": 0.0}
    t0 = time.perf_counter()
    if os.path.exists(e.venv):
        shutil.rmtree(e.venv)
    os.makedirs(VENVS, exist_ok=True)
    log(f"installing {e.requirement} into {os.path.relpath(e.venv)}")
    steps = [[sys.executable, "-m", "venv", e.venv],
             [os.path.join(e.venv, "bin", "python"), "-m", "pip", "install", "--disable-pip-version-check",
              "-q", e.requirement]]
    for cmd in steps:
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise ExternalUnavailable(f"{' '.join(cmd)}: timed out after {INSTALL_TIMEOUT:.0f}s") from None
        except OSError as err:
            raise ExternalUnavailable(f"{' '.join(cmd)}: {err}") from None
        if out.returncode != 0:
            text = "\n".join(x for x in (out.stdout.strip(), out.stderr.strip()) if x)
            # pip's notes about unreachable local index folders (this machine's pip.conf) bury the error
            text = "\n".join(line for line in text.splitlines()
                             if not (line.startswith("WARNING: Location '") and "is ignored" in line))
            raise ExternalUnavailable(f"{' '.join(cmd)} exited {out.returncode}:\n{text[-3000:]}")
    have = _pip_version(e)
    if have != want or not os.path.exists(e.bin):
        raise ExternalUnavailable(f"after install: version {have!r}, script {e.bin} "
                                  f"{'present' if os.path.exists(e.bin) else 'missing'}")
    return {"version": have, "installed_now": True, "install_s": round(time.perf_counter() - t0, 1)}


@contextmanager
def running(e: External, port: int, upstream: str, window: int, tmp: str) -> Iterator[dict[str, Any]]:
    """The proxy on 127.0.0.1:port in front of `upstream` (no /v1); yields {url, cmd, pid, log, start_s}."""
    state = os.path.join(tmp, "state")
    os.makedirs(state, exist_ok=True)
    cmd = e.argv(e.bin, port, upstream, window, state)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CLIFF_", "CTXPROXY_", "OPENAI_", "ANTHROPIC_", "PYTHON"))}
    env.update(HOME=tmp, **e.env)
    log_path = os.path.join(tmp, f"{e.name}.log")
    t0 = time.perf_counter()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise ExternalUnavailable(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                                          f"{open(log_path, errors='replace').read()[-3000:]}")
            try:
                if httpx.get(url + "/v1/models", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ExternalUnavailable(f"{' '.join(cmd)}: no answer on {url}/v1/models after {START_TIMEOUT:.0f}s:\n"
                                          f"{open(log_path, errors='replace').read()[-3000:]}")
            time.sleep(0.1)
        yield {"url": url, "cmd": cmd, "pid": proc.pid, "log": log_path, "start_s": time.perf_counter() - t0,
               "state": state}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
