"""The load benchmark's processes: bench.overhead's, with this benchmark's mock and restartable proxies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from typing import Any

from bench.load.client import session_for
from bench.overhead.processes import Processes, wait_healthy


class LoadProcesses(Processes):
    """bench.overhead's processes, with bench.load's mock (which takes commands on stdin)."""

    MOCK_MODULE = "bench.load"

    def __init__(self, tmp: str, proxy_cmd: list[str] | None) -> None:
        super().__init__(tmp, proxy_cmd)
        self.logs: list[str] = []  # every proxy's log, in start order

    async def start_healthy_proxy(self, restart: bool = False) -> str:
        """Start the proxy and wait for /healthz; `restart`: stop the running one first and give the new
        one its own store and log (a subdirectory of the temporary directory)."""
        if restart and self.proxy is not None:
            self.proxy.send_signal(signal.SIGINT)
            try:
                self.proxy.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proxy.kill()
                self.proxy.wait(timeout=5)
            self.tmp = os.path.join(self.tmp, f"proxy{len(self.logs) + 1}")
            os.makedirs(self.tmp, exist_ok=True)
            self.proxy_log = os.path.join(self.tmp, "proxy.log")
        url = self.start_proxy()
        self.logs.append(self.proxy_log)
        assert self.proxy is not None
        async with session_for(4) as s:
            await wait_healthy(s, url, self.proxy, self.proxy_log)
        return url

    def mock_command(self, **cmd: Any) -> None:
        """One command to the mock (``set`` delays, ``reset``), waiting for its "ok"."""
        assert self.mock is not None and self.mock.stdin is not None and self.mock.stdout is not None
        if self.mock.poll() is not None:
            raise SystemExit(f"mock upstream exited with {self.mock.returncode}")
        self.mock.stdin.write(json.dumps(cmd) + "\n")
        self.mock.stdin.flush()
        reply = self.mock.stdout.readline().strip()
        if reply != "ok":
            raise SystemExit(f"mock upstream answered {reply!r} to {cmd}")
