"""`ctxproxy serve --workers N`: N uvicorn processes on one port, a socket each, configured identically.

uvicorn starts each worker with `spawn` and pickles its Config to it. The
parent's Settings (the config file read once, the environment and the CLI
overrides applied once) travel inside that Config, so every worker — and every
worker uvicorn starts later to replace one that died — builds its app from the
same object, never by reading the file again. The app and the guarded protocol
class (built per settings, not picklable) are made in the worker, in `load`.

What the workers share is the store: every rewrite decision, the figures,
/ctx/v1; /metrics adds up every worker's values through files in a directory
the parent owns for its lifetime (proxy/accounting/metrics.py). SIGTERM (or
SIGINT) to the parent is passed to every worker, each drains as a single
process does, and the parent waits for them all; SIGHUP replaces the workers
one by one, from the same Settings (the file is not read again).
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE

from proxy.accounting.metrics import SHARED_DIR_ENV
from proxy.cli.worker_sockets import OneSocketEach, log_listening
from proxy.config import Settings


class WorkerConfig(uvicorn.Config):
    """uvicorn's Config, carrying the Settings every worker builds its app from."""

    def __init__(self, settings: Settings, **options: Any) -> None:
        self.settings = settings
        options.pop("http", None)  # made in the worker (load): a class built per settings does not pickle
        # the app too is made in the worker (load); uvicorn wants an import string here to pickle the Config
        super().__init__("proxy.app:create_app", http="httptools", workers=settings.server.workers, **options)

    def configure_logging(self) -> None:
        super().configure_logging()
        from proxy.logs import setup_logging

        setup_logging(self.settings.logging.level, worker=True)

    def load(self) -> None:
        if not self.loaded:
            from proxy.app import create_app
            from proxy.http.server import guarded_protocol

            self.app = create_app(self.settings)
            self.http = guarded_protocol(self.settings.server)
        super().load()


def serve_workers(settings: Settings, options: dict[str, Any], sockets: list[socket.socket]) -> None:
    """Run `settings.server.workers` workers on `sockets` (proxy/cli/worker_sockets.py's bind_sockets: the
    caller binds them before it says it listens) until SIGTERM/SIGINT, then remove the metrics files.

    Exits with STARTUP_FAILURE (3) when a worker fails to start, as a single process does."""
    config = WorkerConfig(settings, **options)
    log_listening(config, sockets[:1])
    metrics_dir = tempfile.mkdtemp(prefix="ctxproxy-metrics-")
    os.environ[SHARED_DIR_ENV] = metrics_dir  # before the first worker is spawned: they inherit it
    supervisor = OneSocketEach(config, sockets)
    try:
        supervisor.run()
    finally:
        for sock in sockets:
            sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    if any(p.exitcode == STARTUP_FAILURE for p in supervisor.processes):
        # uvicorn stops the parent when a worker fails to start (its log says why); so does a single process
        raise SystemExit(STARTUP_FAILURE)
