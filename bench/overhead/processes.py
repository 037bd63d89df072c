"""The benchmark's processes: the mock, ctxproxy, the pass-through floor and LiteLLM; starting, health, stopping."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from bench.overhead.config import AUTH
from bench.paths import PROXY_CLI, ROOT


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    """The mock, the proxy, the pass-through floor and LiteLLM as subprocesses, and their cleanup.

    Each is started on a free 127.0.0.1 port with its log in the temporary directory `tmp`; `stop` ends
    whichever are still running, newest first.
    """

    MOCK_MODULE = "bench.overhead"  # run with --serve-mock; bench.load has its own mock

    def __init__(self, tmp: str, proxy_cmd: list[str] | None) -> None:
        self.tmp = tmp
        self.mock: subprocess.Popen[str] | None = None
        self.proxy: subprocess.Popen[bytes] | None = None
        self.proxy_cmd = proxy_cmd
        self.proxy_log = os.path.join(tmp, "proxy.log")
        self.mock_url = ""
        self.proxy_url = ""
        self.floor: subprocess.Popen[bytes] | None = None
        self.floor_log = os.path.join(tmp, "floor.log")
        self.floor_url = ""
        self.litellm: subprocess.Popen[bytes] | None = None
        self.litellm_log = os.path.join(tmp, "litellm.log")
        self.litellm_info: dict[str, Any] = {}

    def start_mock(self) -> str:
        """`python -m <MOCK_MODULE> --serve-mock` from the repository root; returns the URL it prints."""
        self.mock = subprocess.Popen([sys.executable, "-m", self.MOCK_MODULE, "--serve-mock"], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.mock.stdout is not None
        line = self.mock.stdout.readline().strip()  # the mock prints its URL once started
        if not line.startswith("http://127.0.0.1:"):
            raise SystemExit(f"mock upstream did not start (got {line!r})")
        self.mock_url = line
        return line

    def start_proxy(self) -> str:
        """ctxproxy as users run it (`ctxproxy serve`, or --proxy-cmd), in front of the mock; returns its URL."""
        port = free_port()
        exe = shutil.which("ctxproxy")
        cmd = self.proxy_cmd or ([exe] if exe else [sys.executable, "-m", PROXY_CLI])
        cmd = cmd + ["serve", "--host", "127.0.0.1", "--port", str(port)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("CTXPROXY_")}
        env.update(CTXPROXY_UPSTREAM=self.mock_url,
                   CTXPROXY_STORE=f"sqlite:///{os.path.join(self.tmp, 'b.db')}",
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        self.proxy_cmd_run = [f"CTXPROXY_UPSTREAM={self.mock_url}",
                              f"CTXPROXY_STORE={env['CTXPROXY_STORE']}", *cmd]
        log = open(self.proxy_log, "wb")
        self.proxy = subprocess.Popen(cmd, cwd=self.tmp, env=env, stdin=subprocess.DEVNULL,
                                      stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.proxy_url = f"http://127.0.0.1:{port}"
        return self.proxy_url

    def start_floor(self) -> str:
        """The bare FastAPI + aiohttp pass-through (bench/overhead/floor.py) in front of the mock; returns its URL."""
        port = free_port()
        cmd = [sys.executable, "-m", "bench.overhead.floor", "--port", str(port), "--upstream", self.mock_url]
        env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
        self.floor_cmd_run = cmd
        log = open(self.floor_log, "wb")
        self.floor = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                      stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.floor_url = f"http://127.0.0.1:{port}"
        return self.floor_url

    def start_litellm(self, requirement: str) -> str:
        """LiteLLM's proxy in its own venv (installed on first use) as a pass-through to the mock.

        Returns its base URL (without /v1); raises ExternalUnavailable with the exact error text."""
        import yaml

        from bench import external_proxies as ext

        spec = ext.External("litellm", requirement, "litellm", lambda *a: [])
        self.litellm_info["requirement"] = requirement
        self.litellm_info.update(ext.ensure_installed(
            spec, log=lambda m: print(f"  litellm: {m} (one-off, about a minute)", flush=True)))
        port = free_port()
        config = {
            "model_list": [{"model_name": "*", "litellm_params": {
                "model": "openai/*", "api_base": self.mock_url, "api_key": "sk-bench-upstream"}}],
            "litellm_settings": {"callbacks": [], "success_callback": [], "failure_callback": [],
                                 "num_retries": 0, "request_timeout": 120},
            "general_settings": {"master_key": AUTH["authorization"].split(" ", 1)[1],
                                 "disable_spend_logs": True, "disable_error_logs": True,
                                 "background_health_checks": False},
        }
        path = os.path.join(self.tmp, "litellm.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(config, f, sort_keys=False)
        cmd = [spec.bin, "--config", path, "--host", "127.0.0.1", "--port", str(port)]
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("LITELLM_", "OPENAI_", "CTXPROXY_", "PYTHON", "DATABASE_URL"))}
        home = os.path.join(self.tmp, "litellm-home")
        os.makedirs(home, exist_ok=True)
        env.update(HOME=home, LITELLM_TELEMETRY_DISABLED="true", LITELLM_LOCAL_MODEL_COST_MAP="True",
                   NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
        self.litellm_info["command"] = " ".join(
            ["LITELLM_TELEMETRY_DISABLED=true", "LITELLM_LOCAL_MODEL_COST_MAP=True", *cmd])
        self.litellm_info["config"] = config
        log = open(self.litellm_log, "wb")
        self.litellm = subprocess.Popen(cmd, cwd=self.tmp, env=env, stdin=subprocess.DEVNULL,
                                        stdout=log, stderr=subprocess.STDOUT)
        log.close()
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        """Stop whatever still runs: LiteLLM, the floor and the proxy by SIGINT (killed after 15 s), the mock by
        closing its stdin."""
        for proc in (self.litellm, self.floor, self.proxy):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
        if self.mock is not None and self.mock.poll() is None:
            try:
                assert self.mock.stdin is not None
                self.mock.stdin.close()
                self.mock.wait(timeout=15)
            except (subprocess.TimeoutExpired, OSError):
                self.mock.kill()
                self.mock.wait(timeout=5)


class NotHealthy(SystemExit):
    """A proxy exited or did not answer its health check in time (message: the reason and its log's tail).
    A SystemExit, as before, for the scripts that reuse `wait_healthy` (bench.load)."""


async def wait_healthy(session: Any, url: str, proc: subprocess.Popen[bytes], log_path: str,
                       timeout: float = 30.0, path: str = "/healthz", what: str = "proxy") -> None:
    """Poll `url + path` until it answers 200; NotHealthy (with the log's tail) if `proc` exits or time runs out."""
    import aiohttp

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log_path, errors="replace") as f:
                tail = f.read()[-2000:]
            raise NotHealthy(f"{what} exited with {proc.returncode}:\n{tail}")
        try:
            async with session.get(url + path) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    with open(log_path, errors="replace") as f:
        tail = f.read()[-2000:]
    raise NotHealthy(f"{what} not healthy after {timeout:.0f} s:\n{tail}")
