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

The sockets are bound, and listening, before anything says "listening" (the
single process's too, `bind_addresses`): a port already taken is one line on
the terminal (`CannotListen`), not a log line after the app has started.
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any

from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.supervisors.multiprocess import Multiprocess, Process

logger = logging.getLogger("uvicorn.error")

BACKLOG = 2048  # uvicorn.Config's default, which each server's listen() sets again when it starts serving
_WHY = {errno.EADDRINUSE: "address already in use (another ctxproxy? set --port or server.port)",
        errno.EADDRNOTAVAIL: "no interface has this address (set --host or server.host)",
        errno.EACCES: "permission denied (a port below 1024 needs privileges; set --port or server.port)"}


class CannotListen(Exception):
    """The address cannot be listened on; its message is the line `serve` prints, without the `ctxproxy: `."""


def address(host: str, port: int) -> str:
    """`host:port`, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _cannot(host: str, port: int, exc: OSError) -> CannotListen:
    if isinstance(exc, socket.gaierror):  # a host name that does not resolve
        why = f"{(exc.strerror or str(exc)).lower()} (set --host or server.host)"
    else:
        why = _WHY.get(exc.errno or 0) or (exc.strerror or str(exc)).lower()
    return CannotListen(f"cannot listen on {address(host, port)}: {why}")


def _close(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


def bind_addresses(host: str, port: int) -> list[socket.socket]:
    """The single process's sockets, bound and listening: one per address `host` resolves to, as uvicorn's
    asyncio server would bind them (a name such as localhost may be IPv4 and IPv6). Raises CannotListen."""
    out: list[socket.socket] = []
    try:
        infos = socket.getaddrinfo(host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
        for family, kind, proto, _, addr in dict.fromkeys(infos):
            _listen(out, socket.socket(family, kind, proto), addr, v6only=family == socket.AF_INET6)
    except OSError as exc:
        _close(out)
        raise _cannot(host, port, exc) from None
    return out


def bind_sockets(host: str, port: int, n: int) -> list[socket.socket]:
    """`n` sockets bound to host and port (the port of the first when it is 0) and listening, or one socket
    shared by all where the system has no SO_REUSEPORT. Raises CannotListen.

    SO_REUSEPORT lets any socket of the same user that sets it too share the port: another ctxproxy with
    workers would silently take half the connections. So the port is first bound without it, which fails
    while anything listens there."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    out: list[socket.socket] = []
    try:
        if port:
            with socket.socket(family=family) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((host, port))
        for _ in range(n if hasattr(socket, "SO_REUSEPORT") else 1):
            port = _listen(out, socket.socket(family=family), (host, port), share=hasattr(socket, "SO_REUSEPORT"))
    except OSError as exc:
        _close(out)
        raise _cannot(host, port, exc) from None
    return out


def _listen(out: list[socket.socket], sock: socket.socket, addr: tuple[Any, ...], *, share: bool = False,
            v6only: bool = False) -> int:
    """`sock` kept in `out`, bound to `addr` (`share`: with SO_REUSEPORT; `v6only`: IPv6 alone, as asyncio binds
    each family of a name its own socket), listening and inheritable by the workers; returns its port."""
    out.append(sock)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if v6only:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    if share:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(addr)
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    port: int = sock.getsockname()[1]
    return port


def log_listening(config: Config, sockets: list[socket.socket]) -> None:
    """uvicorn's "running on" log line, which it leaves to whoever binds the sockets it is given."""
    for sock in sockets:
        host, port = sock.getsockname()[:2]
        logger.info("Uvicorn running on %s://%s (Press CTRL+C to quit)", "https" if config.is_ssl else "http",
                    address(host, port))


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
