"""One listening socket per worker, all on one port (SO_REUSEPORT): the kernel spreads connections evenly.

On one socket shared by every worker, whichever worker wakes first accepts a
connection: agents that open their few keep-alive connections at once can all
land on one worker while the others idle (seen in `bench.workers`: one worker
at 100% CPU, the other at 0%). With one socket each, the kernel picks the
socket of a new connection by a hash of its addresses, so connections split
evenly whoever is awake. Each socket stays open in the parent, so a
connection hashed to a worker that died waits in its socket's queue for the
replacement, which is given the same socket; it is not refused.

uvicorn's supervisor gives every worker the same sockets; `OneSocketEach` is
that supervisor with each worker's Process built on its own socket (the
methods that build one are uvicorn 0.54.0's, with that one change).
"""

from __future__ import annotations

import logging
import socket

from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.supervisors.multiprocess import Multiprocess, Process

logger = logging.getLogger("uvicorn.error")


def bind_sockets(config: Config, n: int) -> list[socket.socket]:
    """`n` sockets bound to the config's host and port (the port of the first when it is 0), or one socket
    shared by all where the system has no SO_REUSEPORT."""
    if not hasattr(socket, "SO_REUSEPORT") or config.uds is not None or config.fd is not None:
        return [config.bind_socket()]
    family = socket.AF_INET6 if config.host and ":" in config.host else socket.AF_INET
    out: list[socket.socket] = []
    port = config.port
    try:
        for _ in range(n):
            sock = socket.socket(family=family)
            out.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((config.host, port))
            port = sock.getsockname()[1]
            sock.set_inheritable(True)
    except OSError as exc:
        for sock in out:
            sock.close()
        logger.error(exc)
        raise SystemExit(STARTUP_FAILURE) from None
    shown = f"[{config.host}]" if family == socket.AF_INET6 else config.host
    logger.info("Uvicorn running on %s://%s:%d (Press CTRL+C to quit)", "https" if config.is_ssl else "http",
                shown, port)
    return out


class OneSocketEach(Multiprocess):
    """uvicorn's Multiprocess, worker i always serving socket i (one shared socket when there is only one)."""

    def __init__(self, config: Config, sockets: list[socket.socket]) -> None:
        super().__init__(config, sockets)
        self.each = sockets

    def _process(self, idx: int) -> Process:
        return Process(self.config, [self.each[idx % len(self.each)]])

    def init_processes(self) -> None:
        for idx in range(self.processes_num):
            process = self._process(idx)
            process.start()
            self.processes.append(process)

    def restart_all(self) -> None:
        for idx, old_process in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            new_process = self._process(idx)
            new_process.start()
            if not new_process.wait_until_ready(self.config.timeout_worker_healthcheck, self.should_exit):
                new_process.kill()
                new_process.join()
                if not self.should_exit.is_set():
                    logger.error(f"New child process [{new_process.pid}] was not ready in time; "
                                 f"keeping worker [{old_process.pid}] and aborting the restart.")
                return
            old_process.terminate()
            old_process.join()
            self.processes[idx] = new_process

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return
        for idx, process in enumerate(self.processes):
            if process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            process.kill()
            process.join()
            if process.exitcode == STARTUP_FAILURE:
                logger.error(f"Child process [{process.pid}] failed to start, stopping the parent process.")
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            logger.info(f"Child process [{process.pid}] died")
            process = self._process(idx)
            process.start()
            self.processes[idx] = process
