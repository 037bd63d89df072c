"""Structured JSON logs: one line per request, never a key, never content unless asked.

Fields are chosen by the caller from a fixed vocabulary (ids, route, model,
session, status, timings, counts); message text only goes in when
`logging.log_content` is on (proxy/accounting/accountant.py adds the client's new
messages to the request's line). A secret anywhere in a line (a store URL's
password in an error, a traceback, a field; an API key) is masked before the line is
written (proxy/redact.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import sys
import time
from typing import IO, Any

import orjson

from proxy.redact import redact_value, suspect

LOGGER_NAME = "ctxproxy"
log = logging.getLogger(LOGGER_NAME)


class JsonFormatter(logging.Formatter):
    def __init__(self, worker: bool = False) -> None:
        super().__init__()
        self.worker = worker  # several processes write one stream: each line says whose it is
        self._second: tuple[int, str] = (-1, "")  # (a second, its text): formatted once per second, not per line

    def format(self, record: logging.LogRecord) -> str:
        return self.line(record.created, record.msecs, record.levelname, record.getMessage(), record.process,
                         getattr(record, "fields", None),
                         self.formatException(record.exc_info) if record.exc_info else None)

    def line(self, created: float, msecs: float, levelname: str, msg: str, process: int | None,
             fields: dict[str, Any] | None, exc: str | None = None) -> str:
        """The line of one record, from its parts (`event` writes its own lines without a LogRecord)."""
        second = int(created)
        last = self._second
        if last[0] != second:
            last = self._second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        out: dict[str, Any] = {"ts": f"{last[1]}.{int(msecs):03d}Z", "level": levelname.lower(), "msg": msg}
        if self.worker:
            out["worker"] = process
        if fields:
            out.update(fields)
        if exc:
            out["exc"] = exc
        line = orjson.dumps(out, default=str)
        if suspect(line):  # the values are masked, not the line: in it a '"' or '\\' of a password is escaped
            line = orjson.dumps({k: redact_value(v) for k, v in out.items()}, default=str)
        return line.decode()


FLUSH_DELAY = 0.05  # seconds a request's line may wait to be written with the lines after it
_PENDING_MAX = 64 * 1024  # characters of request lines held before they are written at once
_ATOMIC = getattr(select, "PIPE_BUF", 4096)  # one write of at most this many bytes to a pipe is never interleaved


class LineHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """One JSON line per record. Request lines (`request_event`) are written a few per system call, not one each:
    with the LogRecord gone too (`event`) the request's line went from about 3% of the event loop's samples to
    about 1% at 16 clients (py-spy over bench/overhead's load; end to end that is within the noise). One waits at
    most FLUSH_DELAY; any other line is written at once, after the request lines before it, so the order holds
    and what a shutdown logs last is never held back; the lifespan's end flushes (`flush_logs`).
    No write exceeds PIPE_BUF unless one line does, so the lines of `serve --workers N`, which share one stderr,
    never cut into each other."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        self._size = 0
        self._scheduled = False

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record) + "\n"
        except Exception:
            self.handleError(record)
            return
        self._add(line, defer=False)

    def event(self, formatter: JsonFormatter, msg: str, level: int, fields: dict[str, object], defer: bool) -> None:
        """What logging's handle() and emit() make of `log.log(level, msg, extra={"fields": fields})`, without
        the LogRecord (building and dispatching one cost more than the line): the same line, under the same lock."""
        created = time.time()
        line = formatter.line(created, (created - int(created)) * 1000, logging.getLevelName(level), msg,
                              os.getpid() if formatter.worker else None, fields) + "\n"
        self.acquire()
        try:
            self._add(line, defer)
        finally:
            self.release()

    def _add(self, line: str, defer: bool) -> None:
        self._pending.append(line)
        self._size += len(line)
        if not defer or self._size >= _PENDING_MAX:
            self._write()
            return
        if not self._scheduled:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no loop in this thread: nothing would come back to write it
                self._write()
                return
            self._scheduled = True
            loop.call_later(FLUSH_DELAY, self.flush)

    def flush(self) -> None:
        self.acquire()
        try:
            self._scheduled = False
            self._write()
        finally:
            self.release()

    def _write(self) -> None:
        pending, self._pending, self._size = self._pending, [], 0
        if not pending:
            return
        try:
            chunk: list[str] = []
            size = 0
            for line in pending:
                if chunk and size + len(line) > _ATOMIC:
                    self.stream.write("".join(chunk))
                    chunk, size = [], 0
                chunk.append(line)
                size += len(line)
            self.stream.write("".join(chunk))
            self.stream.flush()
        except Exception:  # as StreamHandler.emit: a broken stream must not break the request
            self.handleError(logging.makeLogRecord({"msg": "log write failed"}))


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
    global _direct
    handler = _direct = LineHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(worker))
    for name in (LOGGER_NAME, "uvicorn", "uvicorn.error"):
        lg = logging.getLogger(name)
        lg.handlers[:] = [handler]
        lg.setLevel(level.upper())
        lg.propagate = False
    errors = logging.getLogger("uvicorn.error")
    errors.filters[:] = [f for f in errors.filters if not isinstance(f, ClientFaults)] + [ClientFaults()]


class ClientFaults(logging.Filter):
    """uvicorn logs a WebSocket client's text frame that is not UTF-8 at error level with a traceback, though the
    fault is the client's and uvicorn has already closed the socket with 1007: one warning line instead."""

    FAULTS = {"Invalid UTF-8 sequence received from client.":
              "websocket closed (1007): the client sent a text frame that is not valid UTF-8"}

    def filter(self, record: logging.LogRecord) -> bool:
        said = self.FAULTS.get(record.msg) if isinstance(record.msg, str) else None
        if said is not None:
            record.msg, record.args, record.exc_info, record.exc_text = said, (), None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_direct: LineHandler | None = None  # setup_logging's handler: lines are written to it directly


def event(msg: str, level: int = logging.INFO, /, **fields: object) -> None:
    """One structured line, written now."""
    _line(msg, level, fields, False)


def request_event(fields: dict[str, object]) -> None:
    """A request's line: written with the next lines, within FLUSH_DELAY (LineHandler)."""
    _line("request", logging.INFO, fields, True)


def flush_logs() -> None:
    """Write the request lines still held (the end of the lifespan)."""
    if _direct is not None:
        _direct.flush()


def _line(msg: str, level: int, fields: dict[str, object], defer: bool) -> None:
    """While ctxproxy's logger is as setup_logging left it (its one handler, no filters) the line goes to that
    handler without a LogRecord; anything else (a test's handler, a filter) gets it through logging."""
    if not log.isEnabledFor(level):
        return
    handler = _direct
    if handler is not None:
        handlers, formatter = log.handlers, handler.formatter
        if len(handlers) == 1 and handlers[0] is handler and not log.filters and not handler.filters \
                and level >= handler.level and isinstance(formatter, JsonFormatter):
            handler.event(formatter, msg, level, fields, defer)
            return
    log.log(level, msg, extra={"fields": fields})
