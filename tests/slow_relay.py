"""A TCP relay to a real server that holds every reply back for `delay` seconds: a healthy but distant store.

Bare sockets and threads on 127.0.0.1, independent of the product's code (and of
any event loop, so a test can block its own loop while a reply is on its way).
"""

from __future__ import annotations

import socket
import threading
import time

_ACCEPT_POLL_S = 0.05


class SlowRelay:
    """`with SlowRelay(("127.0.0.1", 6379), 0.1) as r:` → `r.url` reaches the server, each reply `r.delay` late."""

    def __init__(self, target: tuple[str, int], delay: float) -> None:
        self.target, self.delay = target, delay
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self._sock.settimeout(_ACCEPT_POLL_S)
        self.url = f"redis://127.0.0.1:{self._sock.getsockname()[1]}/0"
        self._stop = threading.Event()
        self._open: list[socket.socket] = []

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                return
            server = socket.create_connection(self.target, timeout=5)
            self._open += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, late: bool) -> None:
        src.settimeout(None)
        try:
            while data := src.recv(65536):
                if late:
                    time.sleep(self.delay)  # read each time: a test may change it
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> SlowRelay:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for s in [self._sock, *self._open]:
            s.close()
