"""Run the real proxy app under uvicorn on a free loopback port, as users run it."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from proxy.app import create_app
from proxy.config import Settings, build_settings
from proxy.http.server import uvicorn_options


def make_settings(upstream_url: str, store: str, env: dict[str, str] | None = None, **raw: Any) -> Settings:
    """Settings from a config mapping and only the environment given (none of the process's)."""
    cfg: dict[str, Any] = {"upstream": {"base_url": upstream_url}, "store": store}
    for k, v in raw.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) and isinstance(cfg.get(k), dict) else v
    return build_settings(cfg, env=env or {})


class ProxyServer:
    """`with ProxyServer(settings) as p:` → p.url is `http://127.0.0.1:PORT`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.app = create_app(settings)
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def state(self) -> Any:
        return self.app.state.proxy

    def start(self) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, loop="asyncio", log_config=None, access_log=False,
                                timeout_graceful_shutdown=2, server_header=False, date_header=False,
                                **uvicorn_options(self.settings.server))  # served as `ctxproxy serve` serves
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("proxy failed to start")
            time.sleep(0.005)
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    def stop(self) -> None:
        if self._server and self._thread:
            self._server.should_exit = True
            self._thread.join(timeout=10)

    def __enter__(self) -> ProxyServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
