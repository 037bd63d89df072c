"""A TCP server that accepts connections, reads what it is sent and never answers.

What a store behind a dead relay (or a wedged Redis) looks like to a client: the
connection opens at once, every command is swallowed, no reply ever comes. Bare
sockets on 127.0.0.1, independent of the product's code.
"""

from __future__ import annotations

import socket
import threading
import time

_ACCEPT_POLL_S = 0.05
_MAX_LIFETIME_S = 300  # never outlives a test run by much


class SilentServer:
    """`with SilentServer() as s:` → `s.port` accepts and holds every connection until the block ends."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self._sock.settimeout(_ACCEPT_POLL_S)
        self.port: int = self._sock.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.connections = 0
        self.received = 0  # bytes swallowed
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name=f"silent-{self.port}", daemon=True)

    def _accept(self) -> None:
        deadline = time.monotonic() + _MAX_LIFETIME_S
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._held.append(conn)
            threading.Thread(target=self._swallow, args=(conn,), daemon=True).start()

    def _swallow(self, conn: socket.socket) -> None:
        try:
            while not self._stop.is_set():
                data = conn.recv(65536)
                if not data:
                    return
                with self._lock:
                    self.received += len(data)
        except OSError:
            return

    def __enter__(self) -> SilentServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept at once (Linux), not at its next poll
        except OSError:
            pass
        self._thread.join(timeout=5)
        self._sock.close()
        with self._lock:
            held, self._held = self._held, []
        for conn in held:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
