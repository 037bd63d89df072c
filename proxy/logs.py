"""Structured JSON logs: one line per request, never a key, never content unless asked.

Fields are chosen by the caller from a fixed vocabulary (ids, route, model,
session, status, timings, counts); message text only goes in when
`logging.log_content` is on (proxy/accounting/accountant.py adds the client's new
messages to the request's line). A password in a URL anywhere in a line (a
store URL in an error, a traceback) is masked before the line is written.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

from proxy.redact import redact

LOGGER_NAME = "ctxproxy"
log = logging.getLogger(LOGGER_NAME)


class JsonFormatter(logging.Formatter):
    def __init__(self, worker: bool = False) -> None:
        super().__init__()
        self.worker = worker  # several processes write one stream: each line says whose it is
        self._second: tuple[int, str] = (-1, "")  # (a second, its text): formatted once per second, not per line

    def _stamp(self, record: logging.LogRecord) -> str:
        """`2026-01-02T03:04:05.678Z`; the seconds' text is strftime's, remembered while the lines share it
        (strftime and gmtime were a third of a request line's formatting)."""
        second = int(record.created)
        last = self._second
        if last[0] != second:
            last = self._second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        return f"{last[1]}.{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self._stamp(record),
            "level": record.levelname.lower(),
            "msg": record.getMessage(),
        }
        if self.worker:
            out["worker"] = record.process
        fields = getattr(record, "fields", None)
        if fields:
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return redact(orjson.dumps(out, default=str).decode())


def setup_logging(level: str = "info", worker: bool = False) -> None:
    """Route ctxproxy's and uvicorn's logs through one JSON handler on stderr; `worker`: each line names the
    process (`serve --workers N`: the workers share the parent's stderr).

    A line says nothing of the thread or source line it came from (JsonFormatter writes none of them), so the
    logging module is told not to look them up for every record: the stack walk and the lookups were a fifth of
    the cost of each request's line (the logging HOWTO's "Optimization" settings). The process id is looked up
    only when lines name their worker."""
    logging._srcfile = None  # no findCaller: no frame walk per record
    logging.logThreads = False
    logging.logProcesses = worker
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(worker))
    for name in (LOGGER_NAME, "uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.setLevel(level.upper())
        lg.propagate = False


def event(msg: str, level: int = logging.INFO, /, **fields: object) -> None:
    if log.isEnabledFor(level):
        log.log(level, msg, extra={"fields": fields})
