"""An ASGI app served over real HTTP inside this process: uvicorn on a free local port, in a daemon thread.

The replay (proxy/replay/drive.py) puts both the provider simulator and ctxproxy
itself behind one each, so that the turns travel the same HTTP path a client's
would; the tests serve their mock providers the same way.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, Literal


class ThreadedServer:
    """Serve an ASGI app with uvicorn on a free 127.0.0.1 port in a daemon thread: ``with ThreadedServer(app) as s``."""

    def __init__(self, app: Any, *, lifespan: Literal["auto", "on", "off"] = "auto", name: str = "server") -> None:
        self.app, self.lifespan, self.name = app, lifespan, name
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> str:
        import uvicorn

        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on accepted sockets whose proto says
        # TCP; without it every request stalls ~40 ms (Nagle + delayed ACK).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, loop="asyncio", lifespan=self.lifespan, log_config=None, access_log=False,
                                timeout_graceful_shutdown=2, server_header=False, date_header=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=f"{self.name}-{port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 15
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise RuntimeError(f"{self.name} failed to start")
            time.sleep(0.005)
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> ThreadedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["ThreadedServer"]
